use std::time::Duration;

use crate::config::ProvidersConfig;
use crate::fleet::{BreakerPolicy, MaxUnavailable};

fn entry(value: &str) -> String {
    format!("providers:\n- name: k\n  type: kubernetes\n  {value}\n")
}

#[test]
fn max_unavailable_key_table() {
    struct Case {
        name: &'static str,
        value: &'static str,
        want: Result<MaxUnavailable, &'static str>,
    }
    let cases = [
        Case {
            name: "absent: 1",
            value: "",
            want: Ok(MaxUnavailable::Count(1)),
        },
        Case {
            name: "a count",
            value: "maxUnavailable: 3",
            want: Ok(MaxUnavailable::Count(3)),
        },
        Case {
            name: "a quoted percent",
            value: "maxUnavailable: \"20%\"",
            want: Ok(MaxUnavailable::Percent(20)),
        },
        Case {
            name: "a negative count names the key",
            value: "maxUnavailable: -2",
            want: Err("providers[0] \"k\": maxUnavailable \"-2\" must be a count such as 2 or a percent such as 25%"),
        },
        Case {
            name: "a fraction names the key",
            value: "maxUnavailable: 1.5",
            want: Err("providers[0] \"k\": maxUnavailable \"1.5\" must be a count such as 2 or a percent such as 25%"),
        },
        Case {
            name: "a list names the key",
            value: "maxUnavailable: [1]",
            want: Err("providers[0] \"k\": maxUnavailable must be a count such as 2 or a percent such as \"25%\""),
        },
        Case {
            name: "over 100% names the key",
            value: "maxUnavailable: 101%",
            want: Err("providers[0] \"k\": maxUnavailable \"101%\" is more than 100%"),
        },
    ];
    for c in cases {
        let got = ProvidersConfig::from_slice(entry(c.value).as_bytes())
            .map(|cfg| cfg.providers[0].max_unavailable)
            .map_err(|e| e.to_string());
        assert_eq!(got, c.want.map_err(String::from), "{}", c.name);
    }
}

#[test]
fn max_surge_key_table() {
    let cases: [(&str, Result<MaxUnavailable, &str>); 5] = [
        ("", Ok(MaxUnavailable::Count(0))),
        ("maxSurge: 2", Ok(MaxUnavailable::Count(2))),
        ("maxSurge: \"10%\"", Ok(MaxUnavailable::Percent(10))),
        (
            "maxSurge: two",
            Err("providers[0] \"k\": maxSurge \"two\" must be a count such as 2 or a percent such as 25%"),
        ),
        (
            "maxSurge: {n: 1}",
            Err("providers[0] \"k\": maxSurge must be a count such as 2 or a percent such as \"25%\""),
        ),
    ];
    for (value, want) in cases {
        let got = ProvidersConfig::from_slice(entry(value).as_bytes())
            .map(|cfg| cfg.providers[0].max_surge)
            .map_err(|e| e.to_string());
        assert_eq!(got, want.map_err(String::from), "{value:?}");
    }
}

#[test]
fn circuit_breaker_key_table() {
    struct Case {
        name: &'static str,
        value: &'static str,
        want: Result<BreakerPolicy, &'static str>,
    }
    let policy = |threshold_percent, window_secs, min_fleet| BreakerPolicy {
        threshold_percent,
        window: Duration::from_secs(window_secs),
        min_fleet,
    };
    let cases = [
        Case {
            name: "absent: 50%, 5m, 3",
            value: "",
            want: Ok(policy(50, 300, 3)),
        },
        Case {
            name: "an empty block takes the defaults",
            value: "circuitBreaker: {}",
            want: Ok(policy(50, 300, 3)),
        },
        Case {
            name: "every key",
            value: "circuitBreaker: {threshold: 30%, window: 90s, minReadyProxies: 5}",
            want: Ok(policy(30, 90, 5)),
        },
        Case {
            name: "one key, the others default",
            value: "circuitBreaker: {window: 1h30m}",
            want: Ok(policy(50, 5400, 3)),
        },
        Case {
            name: "100% never opens and is allowed",
            value: "circuitBreaker: {threshold: \"100%\"}",
            want: Ok(policy(100, 300, 3)),
        },
        Case {
            name: "not a mapping",
            value: "circuitBreaker: 50%",
            want: Err("providers[0] \"k\": circuitBreaker must be a mapping with threshold, window and minReadyProxies (got a string)"),
        },
        Case {
            name: "an unknown key is named",
            value: "circuitBreaker: {treshold: 30%}",
            want: Err("providers[0] \"k\": circuitBreaker: unknown field \"treshold\", expected one of threshold, window, minReadyProxies"),
        },
        Case {
            name: "a threshold without %",
            value: "circuitBreaker: {threshold: 50}",
            want: Err("providers[0] \"k\": circuitBreaker.threshold must be a percent from 0% to 100% such as \"50%\" (got a number)"),
        },
        Case {
            name: "a threshold that is no number",
            value: "circuitBreaker: {threshold: half%}",
            want: Err("providers[0] \"k\": circuitBreaker.threshold must be a percent from 0% to 100% such as \"50%\" (got \"half%\")"),
        },
        Case {
            name: "a threshold over 100%",
            value: "circuitBreaker: {threshold: 150%}",
            want: Err("providers[0] \"k\": circuitBreaker.threshold \"150%\" is more than 100%"),
        },
        Case {
            name: "a window without a unit",
            value: "circuitBreaker: {window: 300}",
            want: Err("providers[0] \"k\": circuitBreaker.window must be a duration such as 5m or 90s (got a number)"),
        },
        Case {
            name: "a zero window",
            value: "circuitBreaker: {window: 0s}",
            want: Err("providers[0] \"k\": circuitBreaker.window must be a duration such as 5m or 90s (got \"0s\")"),
        },
        Case {
            name: "zero minReadyProxies",
            value: "circuitBreaker: {minReadyProxies: 0}",
            want: Err("providers[0] \"k\": circuitBreaker.minReadyProxies must be a whole number from 1 to 100000 (got 0)"),
        },
        Case {
            name: "a fractional minReadyProxies",
            value: "circuitBreaker: {minReadyProxies: 2.5}",
            want: Err("providers[0] \"k\": circuitBreaker.minReadyProxies must be a whole number from 1 to 100000 (got 2.5)"),
        },
        Case {
            name: "a quoted minReadyProxies",
            value: "circuitBreaker: {minReadyProxies: \"3\"}",
            want: Err("providers[0] \"k\": circuitBreaker.minReadyProxies must be a whole number from 1 to 100000 (got a string)"),
        },
    ];
    for c in cases {
        let got = ProvidersConfig::from_slice(entry(c.value).as_bytes())
            .map(|cfg| cfg.providers[0].circuit_breaker)
            .map_err(|e| e.to_string());
        assert_eq!(got, c.want.map_err(String::from), "{}", c.name);
    }
}
