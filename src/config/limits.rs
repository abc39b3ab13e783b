//! The create limits every provider entry carries, whatever its type:
//! `createsPerMinute` (a token bucket) and `maxCreatesInFlight`. They bound
//! how fast the operator asks one provider for instances, so that a fleet
//! applied at once, or instances that keep dying, never turn into a flood
//! of creates against a cloud account (docs/configuration.md).

use std::time::Duration;

use serde_norway::Value;

use super::validate::describe;

/// `createsPerMinute` when the entry does not set it: one create a second
/// on average, enough to bring up a thousand proxies in under twenty
/// minutes, and far below the instance-insert rates at which clouds start
/// refusing or flagging an account.
pub const DEFAULT_CREATES_PER_MINUTE: u32 = 60;
/// The largest `createsPerMinute` accepted (100 a second): above it the
/// bucket limits nothing a provider could serve.
pub const MAX_CREATES_PER_MINUTE: u32 = 6000;
/// `maxCreatesInFlight` when the entry does not set it: at the default rate
/// an instance may take 100 s to boot before this cap, not the rate, is
/// what holds creates back, and a provider that accepts creates but never
/// starts the instances collects at most 100 of them.
pub const DEFAULT_MAX_CREATES_IN_FLIGHT: u32 = 100;
/// The largest `maxCreatesInFlight` accepted.
pub const MAX_MAX_CREATES_IN_FLIGHT: u32 = 10_000;
/// How many seconds of creates the bucket holds when full: a burst of
/// `createsPerMinute / 6` (10 at the default), at least 1.
pub const BURST_SECONDS: u32 = 10;

/// The create limits of one provider entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreateLimits {
    /// Creates (first creates and re-creates of a replacement alike) per
    /// minute, on average.
    pub creates_per_minute: u32,
    /// Creates submitted whose instance has not been seen Running yet.
    pub max_creates_in_flight: u32,
    /// `maxInstances`: the most instances the provider may hold at once
    /// (being created, running or being deleted); `None`: no cap.
    pub max_instances: Option<u32>,
    /// `startupTimeout`: an instance not running with an address this
    /// long after its create is replaced (a Proxy's
    /// `spec.recycle.startupTimeout` overrides it).
    pub startup_timeout: Duration,
}

impl Default for CreateLimits {
    fn default() -> Self {
        CreateLimits {
            creates_per_minute: DEFAULT_CREATES_PER_MINUTE,
            max_creates_in_flight: DEFAULT_MAX_CREATES_IN_FLIGHT,
            max_instances: None,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
        }
    }
}

/// `startupTimeout` when the entry does not set it: far longer than any
/// provider here takes to boot a proxy (a VM that downloads its image
/// included), short enough that a stuck one is gone within the hour.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(15 * 60);
pub use crate::fleet::MIN_STARTUP_TIMEOUT;
/// The longest `startupTimeout` accepted.
pub const MAX_STARTUP_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// The largest `maxInstances` accepted.
pub const MAX_MAX_INSTANCES: u32 = 1_000_000;

impl CreateLimits {
    /// The bucket's size: [`BURST_SECONDS`] of creates, at least one.
    pub fn burst(&self) -> u32 {
        self.creates_per_minute
            .saturating_mul(BURST_SECONDS)
            .div_ceil(60)
            .max(1)
    }

    /// The limits from the entry's keys (absent: the defaults, and no
    /// `maxInstances` cap); the error names the key and the reason.
    pub(super) fn parse(
        creates_per_minute: Option<Value>,
        max_creates_in_flight: Option<Value>,
        max_instances: Option<Value>,
    ) -> Result<Self, String> {
        let max_instances = match max_instances {
            None | Some(Value::Null) => None,
            v => Some(count(v, "maxInstances", 1, MAX_MAX_INSTANCES)?),
        };
        Ok(CreateLimits {
            max_instances,
            ..Self::counts(creates_per_minute, max_creates_in_flight)?
        })
    }

    /// The limits with `startupTimeout` from `v` (absent: the default).
    pub(super) fn with_startup_timeout(self, v: Option<Value>) -> Result<Self, String> {
        Ok(CreateLimits {
            startup_timeout: startup_timeout(v)?,
            ..self
        })
    }

    fn counts(
        creates_per_minute: Option<Value>,
        max_creates_in_flight: Option<Value>,
    ) -> Result<Self, String> {
        Ok(CreateLimits {
            creates_per_minute: count(
                creates_per_minute,
                "createsPerMinute",
                DEFAULT_CREATES_PER_MINUTE,
                MAX_CREATES_PER_MINUTE,
            )?,
            max_creates_in_flight: count(
                max_creates_in_flight,
                "maxCreatesInFlight",
                DEFAULT_MAX_CREATES_IN_FLIGHT,
                MAX_MAX_CREATES_IN_FLIGHT,
            )?,
            ..CreateLimits::default()
        })
    }
}

/// `startupTimeout`: a duration such as `15m`, from 30s to 24h.
fn startup_timeout(v: Option<Value>) -> Result<Duration, String> {
    let bad = |got: &str| {
        format!("startupTimeout must be a duration from 30s to 24h such as 15m (got {got})")
    };
    let text = match v {
        None | Some(Value::Null) => return Ok(DEFAULT_STARTUP_TIMEOUT),
        Some(Value::String(s)) => s,
        Some(other) => return Err(bad(describe(&other))),
    };
    let d = crate::fleet::parse_duration("startupTimeout", &text)
        .map_err(|_| bad(&format!("{text:?}")))?;
    if !(MIN_STARTUP_TIMEOUT..=MAX_STARTUP_TIMEOUT).contains(&d) {
        return Err(bad(&format!("{text:?}")));
    }
    Ok(d)
}

/// A whole number from 1 to `max`, or `default` when the key is absent.
fn count(v: Option<Value>, key: &str, default: u32, max: u32) -> Result<u32, String> {
    let n = match v {
        None | Some(Value::Null) => return Ok(default),
        Some(Value::Number(n)) => n,
        Some(other) => {
            return Err(format!(
                "{key} must be a whole number from 1 to {max} (got {})",
                describe(&other)
            ))
        }
    };
    let Some(i) = n.as_i64() else {
        return Err(format!(
            "{key} must be a whole number from 1 to {max} (got {n})"
        ));
    };
    if i < 1 {
        return Err(format!("{key} must be at least 1 (got {i})"));
    }
    u32::try_from(i)
        .ok()
        .filter(|v| *v <= max)
        .ok_or_else(|| format!("{key} must be at most {max} (got {i})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(s: &str) -> Option<Value> {
        Some(serde_norway::from_str(s).unwrap())
    }

    struct Case {
        name: &'static str,
        creates_per_minute: Option<Value>,
        max_in_flight: Option<Value>,
        want: Result<(u32, u32), &'static str>,
    }

    #[test]
    fn startup_timeout_table() {
        let parse = |v: Option<Value>| {
            CreateLimits::default()
                .with_startup_timeout(v)
                .map(|l| l.startup_timeout.as_secs())
        };
        assert_eq!(parse(None), Ok(900), "the default is 15m");
        assert_eq!(parse(yaml("\"90s\"")), Ok(90));
        assert_eq!(parse(yaml("\"24h\"")), Ok(86400));
        let refused = |v: &str, got: &str| {
            assert_eq!(
                parse(yaml(v)),
                Err(format!(
                    "startupTimeout must be a duration from 30s to 24h such as 15m (got {got})"
                )),
                "{v}"
            );
        };
        refused("\"10s\"", "\"10s\"");
        refused("\"2d\"", "\"2d\"");
        refused("\"soon\"", "\"soon\"");
        refused("600", "a number");
    }

    #[test]
    fn limits_table() {
        let cases = [
            Case {
                name: "absent keys take the defaults",
                creates_per_minute: None,
                max_in_flight: None,
                want: Ok((60, 100)),
            },
            Case {
                name: "null is absent",
                creates_per_minute: yaml("null"),
                max_in_flight: yaml("~"),
                want: Ok((60, 100)),
            },
            Case {
                name: "both set",
                creates_per_minute: yaml("5"),
                max_in_flight: yaml("3"),
                want: Ok((5, 3)),
            },
            Case {
                name: "the largest values",
                creates_per_minute: yaml("6000"),
                max_in_flight: yaml("10000"),
                want: Ok((6000, 10000)),
            },
            Case {
                name: "zero",
                creates_per_minute: yaml("0"),
                max_in_flight: None,
                want: Err("createsPerMinute must be at least 1 (got 0)"),
            },
            Case {
                name: "negative",
                creates_per_minute: None,
                max_in_flight: yaml("-2"),
                want: Err("maxCreatesInFlight must be at least 1 (got -2)"),
            },
            Case {
                name: "too large",
                creates_per_minute: yaml("6001"),
                max_in_flight: None,
                want: Err("createsPerMinute must be at most 6000 (got 6001)"),
            },
            Case {
                name: "far too large for 32 bits",
                creates_per_minute: None,
                max_in_flight: yaml("99999999999"),
                want: Err("maxCreatesInFlight must be at most 10000 (got 99999999999)"),
            },
            Case {
                name: "a string",
                creates_per_minute: yaml("\"60\""),
                max_in_flight: None,
                want: Err("createsPerMinute must be a whole number from 1 to 6000 (got a string)"),
            },
            Case {
                name: "a fraction",
                creates_per_minute: yaml("1.5"),
                max_in_flight: None,
                want: Err("createsPerMinute must be a whole number from 1 to 6000 (got 1.5)"),
            },
            Case {
                name: "a list",
                creates_per_minute: None,
                max_in_flight: yaml("[1]"),
                want: Err("maxCreatesInFlight must be a whole number from 1 to 10000 (got a list)"),
            },
        ];
        let capped = |v: &str| CreateLimits::parse(None, None, yaml(v)).map(|l| l.max_instances);
        assert_eq!(capped("3"), Ok(Some(3)));
        assert_eq!(capped("null"), Ok(None), "null is absent: no cap");
        assert_eq!(
            capped("0"),
            Err("maxInstances must be at least 1 (got 0)".to_string())
        );
        assert_eq!(
            capped("\"ten\""),
            Err("maxInstances must be a whole number from 1 to 1000000 (got a string)".to_string())
        );
        assert_eq!(
            capped("2.5"),
            Err("maxInstances must be a whole number from 1 to 1000000 (got 2.5)".to_string())
        );
        for c in cases {
            let got = CreateLimits::parse(c.creates_per_minute, c.max_in_flight, None)
                .map(|l| (l.creates_per_minute, l.max_creates_in_flight));
            assert_eq!(got, c.want.map_err(str::to_string), "{}", c.name);
        }
    }

    #[test]
    fn the_bucket_holds_ten_seconds_of_creates() {
        for (per_minute, burst) in [(60, 10), (1, 1), (5, 1), (7, 2), (600, 100), (6000, 1000)] {
            let l = CreateLimits {
                creates_per_minute: per_minute,
                max_creates_in_flight: 1,
                max_instances: None,
                ..CreateLimits::default()
            };
            assert_eq!(l.burst(), burst, "{per_minute}/min");
        }
    }
}
