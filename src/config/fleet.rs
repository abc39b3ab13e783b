//! Fleet policy keys of a provider entry: `maxUnavailable`, `maxSurge` and
//! `circuitBreaker`.

use serde_norway::Value;

use super::validate::describe;
use crate::fleet::breaker::{DEFAULT_MIN_FLEET, DEFAULT_THRESHOLD_PERCENT, DEFAULT_WINDOW};
use crate::fleet::{parse_duration, BreakerPolicy, MaxUnavailable};

/// The largest `circuitBreaker.minReadyProxies` accepted.
pub const MAX_MIN_READY_PROXIES: u32 = 100_000;

/// `maxUnavailable`: a count (`2`) or a percent (`"25%"`); default 1.
pub(super) fn max_unavailable(v: Option<Value>) -> Result<MaxUnavailable, String> {
    count_or_percent("maxUnavailable", v, MaxUnavailable::default())
}

/// `maxSurge`: how many replacements may be created before the instances
/// they replace go, a count or a percent; default 0 (none).
pub(super) fn max_surge(v: Option<Value>) -> Result<MaxUnavailable, String> {
    count_or_percent("maxSurge", v, MaxUnavailable::Count(0))
}

fn count_or_percent(
    key: &str,
    v: Option<Value>,
    default: MaxUnavailable,
) -> Result<MaxUnavailable, String> {
    let text = match v {
        None | Some(Value::Null) => return Ok(default),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::String(s)) => s,
        Some(_) => {
            return Err(format!(
                "{key} must be a count such as 2 or a percent such as \"25%\""
            ))
        }
    };
    MaxUnavailable::parse(&text).map_err(|why| format!("{key} {why}"))
}

/// `circuitBreaker: {threshold, window, minReadyProxies}`; absent keys
/// (or the whole block absent) take the defaults.
pub(super) fn circuit_breaker(v: Option<Value>) -> Result<BreakerPolicy, String> {
    let map = match v {
        None | Some(Value::Null) => return Ok(BreakerPolicy::default()),
        Some(Value::Mapping(m)) => m,
        Some(other) => {
            return Err(format!(
            "circuitBreaker must be a mapping with threshold, window and minReadyProxies (got {})",
            describe(&other)
        ))
        }
    };
    let mut policy = BreakerPolicy::default();
    for (k, v) in map {
        let key = k.as_str().unwrap_or_default();
        match key {
            "threshold" => policy.threshold_percent = threshold(v)?,
            "window" => policy.window = window(v)?,
            "minReadyProxies" => policy.min_fleet = min_ready(v)?,
            _ => {
                return Err(format!(
                    "circuitBreaker: unknown field {:?}, expected one of threshold, window, minReadyProxies",
                    k.as_str().map_or_else(|| format!("{k:?}"), str::to_string)
                ))
            }
        }
    }
    Ok(policy)
}

/// `"50%"`: the share of lost proxies above which it opens, 0% to 100%
/// (100% never opens).
fn threshold(v: Value) -> Result<u32, String> {
    let bad = |got: &str| {
        format!(
            "circuitBreaker.threshold must be a percent from 0% to 100% such as \"{DEFAULT_THRESHOLD_PERCENT}%\" (got {got})"
        )
    };
    let text = match v {
        Value::Null => return Ok(DEFAULT_THRESHOLD_PERCENT),
        Value::String(s) => s,
        other => return Err(bad(describe(&other))),
    };
    let n = text
        .trim()
        .strip_suffix('%')
        .and_then(|n| n.trim().parse::<u32>().ok())
        .ok_or_else(|| bad(&format!("{text:?}")))?;
    if n > 100 {
        return Err(format!(
            "circuitBreaker.threshold {text:?} is more than 100%"
        ));
    }
    Ok(n)
}

/// `5m`: how far back Ready sightings and losses count.
fn window(v: Value) -> Result<std::time::Duration, String> {
    let bad = |got: &str| {
        format!("circuitBreaker.window must be a duration such as 5m or 90s (got {got})")
    };
    match v {
        Value::Null => Ok(DEFAULT_WINDOW),
        Value::String(s) => parse_duration("window", &s).map_err(|_| bad(&format!("{s:?}"))),
        other => Err(bad(describe(&other))),
    }
}

/// `3`: fewest proxies Ready within the window for it to open.
fn min_ready(v: Value) -> Result<usize, String> {
    let bad = |got: &str| {
        format!(
            "circuitBreaker.minReadyProxies must be a whole number from 1 to {MAX_MIN_READY_PROXIES} (got {got})"
        )
    };
    let n = match v {
        Value::Null => return Ok(DEFAULT_MIN_FLEET),
        Value::Number(n) => n,
        other => return Err(bad(describe(&other))),
    };
    n.as_u64()
        .filter(|i| (1..=u64::from(MAX_MIN_READY_PROXIES)).contains(i))
        .and_then(|i| usize::try_from(i).ok())
        .ok_or_else(|| bad(&n.to_string()))
}

#[cfg(test)]
#[path = "fleet_tests.rs"]
mod tests;
