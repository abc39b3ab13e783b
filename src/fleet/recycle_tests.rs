use super::*;

fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + secs, 0).expect("a valid timestamp")
}

const H: u64 = 3600;

#[test]
fn wants_recycle_table() {
    struct Case {
        name: &'static str,
        unhealthy_for: Option<u64>,
        max_age: Option<u64>,
        created: Option<i64>,
        unhealthy_since: Option<i64>,
        now: i64,
        want: Option<RecycleReason>,
    }
    let cases = [
        Case {
            name: "both off (the default): never, however old or unhealthy",
            unhealthy_for: None,
            max_age: None,
            created: Some(0),
            unhealthy_since: Some(0),
            now: 1_000_000,
            want: None,
        },
        Case {
            name: "unhealthy exactly unhealthyFor: recycle",
            unhealthy_for: Some(600),
            max_age: None,
            created: Some(0),
            unhealthy_since: Some(100),
            now: 700,
            want: Some(RecycleReason::Unhealthy),
        },
        Case {
            name: "unhealthy a second short of unhealthyFor: keep",
            unhealthy_for: Some(600),
            max_age: None,
            created: Some(0),
            unhealthy_since: Some(100),
            now: 699,
            want: None,
        },
        Case {
            name: "healthy: unhealthyFor does not apply",
            unhealthy_for: Some(600),
            max_age: None,
            created: Some(0),
            unhealthy_since: None,
            now: 1_000_000,
            want: None,
        },
        Case {
            name: "older than maxAge: recycle",
            unhealthy_for: None,
            max_age: Some(24 * H),
            created: Some(0),
            unhealthy_since: None,
            now: 24 * H as i64 + 1,
            want: Some(RecycleReason::MaxAge),
        },
        Case {
            name: "younger than maxAge: keep",
            unhealthy_for: None,
            max_age: Some(24 * H),
            created: Some(0),
            unhealthy_since: None,
            now: 23 * H as i64,
            want: None,
        },
        Case {
            name: "age unknown: keep (never recycle on a guess)",
            unhealthy_for: None,
            max_age: Some(60),
            created: None,
            unhealthy_since: None,
            now: 1_000_000,
            want: None,
        },
        Case {
            name: "created in the future (clock skew): keep",
            unhealthy_for: None,
            max_age: Some(60),
            created: Some(500),
            unhealthy_since: None,
            now: 0,
            want: None,
        },
        Case {
            name: "both due: unhealthy wins",
            unhealthy_for: Some(60),
            max_age: Some(60),
            created: Some(0),
            unhealthy_since: Some(0),
            now: 1000,
            want: Some(RecycleReason::Unhealthy),
        },
        Case {
            name: "old and unhealthy but not for long: recycled for age",
            unhealthy_for: Some(600),
            max_age: Some(60),
            created: Some(0),
            unhealthy_since: Some(990),
            now: 1000,
            want: Some(RecycleReason::MaxAge),
        },
    ];
    for c in cases {
        let input = RecycleInput {
            policy: RecyclePolicy {
                unhealthy_for: c.unhealthy_for.map(Duration::from_secs),
                max_age: c.max_age.map(Duration::from_secs),
                drain_timeout: DEFAULT_DRAIN_TIMEOUT,
                startup_timeout: None,
            },
            instance_created_at: c.created.map(at),
            unhealthy_since: c.unhealthy_since.map(at),
            now: at(c.now),
        };
        assert_eq!(wants_recycle(&input), c.want, "{}", c.name);
    }
}

#[test]
fn policy_of_spec_table() {
    struct Case {
        name: &'static str,
        spec: Option<RecycleSpec>,
        want: Result<RecyclePolicy, &'static str>,
    }
    let spec = |u: Option<&str>, m: Option<&str>, d: Option<&str>| {
        Some(RecycleSpec {
            unhealthy_for: u.map(String::from),
            max_age: m.map(String::from),
            drain_timeout: d.map(String::from),
            startup_timeout: None,
        })
    };
    let off = RecyclePolicy {
        unhealthy_for: None,
        max_age: None,
        drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        startup_timeout: None,
    };
    let cases = [
        Case {
            name: "absent: all off, default drain timeout",
            spec: None,
            want: Ok(off),
        },
        Case {
            name: "empty block: all off",
            spec: spec(None, None, None),
            want: Ok(off),
        },
        Case {
            name: "every key set",
            spec: spec(Some("10m"), Some("7d"), Some("90s")),
            want: Ok(RecyclePolicy {
                unhealthy_for: Some(Duration::from_secs(600)),
                max_age: Some(Duration::from_secs(7 * 24 * H)),
                drain_timeout: Duration::from_secs(90),
                startup_timeout: None,
            }),
        },
        Case {
            name: "startupTimeout, under its minimum counting as 30s",
            spec: Some(RecycleSpec {
                startup_timeout: Some("5s".into()),
                ..RecycleSpec::default()
            }),
            want: Ok(RecyclePolicy {
                startup_timeout: Some(Duration::from_secs(30)),
                ..off
            }),
        },
        Case {
            name: "unhealthyFor under the minimum counts as the minimum",
            spec: spec(Some("5s"), None, None),
            want: Ok(RecyclePolicy {
                unhealthy_for: Some(MIN_UNHEALTHY_FOR),
                ..off
            }),
        },
        Case {
            name: "compound duration",
            spec: spec(None, Some("1h30m"), None),
            want: Ok(RecyclePolicy {
                max_age: Some(Duration::from_secs(5400)),
                ..off
            }),
        },
        Case {
            name: "garbage names the key",
            spec: spec(None, Some("soon"), None),
            want: Err("spec.recycle.maxAge \"soon\" is not a duration such as 30m, 12h or 7d"),
        },
        Case {
            name: "zero is refused",
            spec: spec(Some("0s"), None, None),
            want: Err("spec.recycle.unhealthyFor \"0s\" is not a duration such as 30m, 12h or 7d"),
        },
        Case {
            name: "a bare number is refused (no unit)",
            spec: spec(None, None, Some("600")),
            want: Err("spec.recycle.drainTimeout \"600\" is not a duration such as 30m, 12h or 7d"),
        },
    ];
    for c in cases {
        let got = RecyclePolicy::of(c.spec.as_ref()).map_err(|e| e.to_string());
        assert_eq!(got, c.want.map_err(String::from), "{}", c.name);
    }
}

#[test]
fn replace_pending_table() {
    let proxy = |asked: Option<&str>, handled: Option<&str>| -> crate::api::Proxy {
        let mut p: crate::api::Proxy = serde_json::from_value(serde_json::json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"provider": "gcp", "port": 3128},
            "status": {"replaceHandled": handled},
        }))
        .unwrap();
        if let Some(v) = asked {
            p.metadata.annotations = Some(
                [(
                    crate::api::constants::REPLACE_ANNOTATION.to_string(),
                    v.to_string(),
                )]
                .into(),
            );
        }
        p
    };
    let cases = [
        (None, None, None, "no annotation"),
        (Some("1"), None, Some("1"), "a first value"),
        (Some("1"), Some("1"), None, "acted on already"),
        (Some("2"), Some("1"), Some("2"), "a new value asks again"),
        (Some(" "), None, None, "blank asks nothing"),
    ];
    for (asked, handled, want, name) in cases {
        assert_eq!(replace_pending(&proxy(asked, handled)), want, "{name}");
    }
    let mut external = proxy(Some("1"), None);
    external.spec.mode = crate::api::ProxyMode::External;
    assert_eq!(
        replace_pending(&external),
        None,
        "External: nothing to replace"
    );
}
