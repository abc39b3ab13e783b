//! A test hook for the fault suite: the process aborts at a named point of
//! a reconcile when `PROXY_OPERATOR_CRASH_AT` names it, as a `kill -9`
//! there would (no destructors, no flushing, no status write). It proves
//! that a crash between two writes of one pass leaves nothing the next
//! process cannot repair. Unset (always, outside tests) it costs one
//! atomic load per point.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// The environment variable naming the point: `<point>` aborts at its
/// first hit, `<point>:<n>` at its n-th.
pub const ENV: &str = "PROXY_OPERATOR_CRASH_AT";

/// After the provider's create returned an ID, before the status records
/// it.
pub const AFTER_CREATE: &str = "after-create";
/// After a replacement recorded the new spec hash, before the old
/// instance is cleared from the status.
pub const AFTER_RECORD_HASH: &str = "after-record-hash";
/// During finalizer release: the instance is cleaned up, the finalizer is
/// not yet removed.
pub const BEFORE_RELEASE: &str = "before-release";
/// After the provider's create of a surge replacement returned an ID,
/// before the status records it.
pub const AFTER_SURGE_CREATE: &str = "after-surge-create";

/// Every point the binary has.
pub const POINTS: [&str; 4] = [
    AFTER_CREATE,
    AFTER_RECORD_HASH,
    BEFORE_RELEASE,
    AFTER_SURGE_CREATE,
];

/// Where to abort.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// One of [`POINTS`].
    pub point: String,
    /// The hit that aborts, counting from 1.
    pub nth: u32,
}

/// A value of [`ENV`] that names no point or no count.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("{ENV}={value:?}: unknown crash point {point:?}; known points: {known}", known = POINTS.join(", "))]
    UnknownPoint { value: String, point: String },
    #[error("{ENV}={value:?}: the count after ':' must be a whole number of at least 1")]
    BadCount { value: String },
}

/// Parses a value of [`ENV`]; empty means no point.
pub fn parse(value: &str) -> Result<Option<Target>, ParseError> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    let (point, nth) = match value.split_once(':') {
        Some((p, n)) => match n.trim().parse::<u32>() {
            Ok(n) if n >= 1 => (p.trim(), n),
            _ => {
                return Err(ParseError::BadCount {
                    value: value.to_string(),
                })
            }
        },
        None => (value, 1),
    };
    if !POINTS.contains(&point) {
        return Err(ParseError::UnknownPoint {
            value: value.to_string(),
            point: point.to_string(),
        });
    }
    Ok(Some(Target {
        point: point.to_string(),
        nth,
    }))
}

/// Whether the `hit`-th arrival at `point` (counting from 1) aborts.
pub fn aborts(target: &Target, point: &str, hit: u32) -> bool {
    target.point == point && hit == target.nth
}

struct Armed {
    target: Target,
    hits: AtomicU32,
}

static ARMED: OnceLock<Option<Armed>> = OnceLock::new();

fn from_env() -> Result<Option<Armed>, ParseError> {
    let value = std::env::var(ENV).unwrap_or_default();
    Ok(parse(&value)?.map(|target| Armed {
        target,
        hits: AtomicU32::new(0),
    }))
}

/// Reads [`ENV`] once, at startup, so a misspelt point stops the binary
/// instead of silently never firing. Returns the armed point, if any.
pub fn arm_from_env() -> Result<Option<Target>, ParseError> {
    let armed = from_env()?;
    let target = armed.as_ref().map(|a| a.target.clone());
    let _ = ARMED.set(armed);
    Ok(target)
}

/// Aborts the process if this arrival at `point` is the one [`ENV`]
/// names; otherwise returns at once.
pub fn hit(point: &str) {
    // Never armed by main (a library user): read the variable here, and a
    // bad value arms nothing.
    let armed = ARMED.get_or_init(|| from_env().ok().flatten());
    let Some(armed) = armed else { return };
    if armed.target.point != point {
        return;
    }
    let n = armed.hits.fetch_add(1, Ordering::SeqCst) + 1;
    if aborts(&armed.target, point, n) {
        // Straight to stderr: the log writer may buffer, and abort flushes
        // nothing.
        eprintln!("Crash point {point} reached (hit {n}, {ENV}): aborting");
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Case {
        name: &'static str,
        value: &'static str,
        want: Result<Option<(&'static str, u32)>, &'static str>,
    }

    #[test]
    fn parse_cases() {
        let cases = [
            Case {
                name: "unset",
                value: "",
                want: Ok(None),
            },
            Case {
                name: "a point aborts at its first hit",
                value: "after-create",
                want: Ok(Some(("after-create", 1))),
            },
            Case {
                name: "a count",
                value: "before-release:3",
                want: Ok(Some(("before-release", 3))),
            },
            Case {
                name: "spaces around",
                value: " after-record-hash : 2 ",
                want: Ok(Some(("after-record-hash", 2))),
            },
            Case {
                name: "unknown point",
                value: "after-lunch",
                want: Err("unknown crash point \"after-lunch\"; known points: after-create, after-record-hash, before-release"),
            },
            Case {
                name: "zero count",
                value: "after-create:0",
                want: Err("the count after ':' must be a whole number of at least 1"),
            },
            Case {
                name: "no count",
                value: "after-create:",
                want: Err("the count after ':' must be a whole number of at least 1"),
            },
        ];
        for c in cases {
            let got = parse(c.value);
            match c.want {
                Ok(want) => {
                    let want = want.map(|(p, n)| Target {
                        point: p.into(),
                        nth: n,
                    });
                    assert_eq!(got, Ok(want), "{}", c.name);
                }
                Err(msg) => {
                    let e = got.expect_err(c.name).to_string();
                    assert!(e.starts_with(ENV), "{}: {e}", c.name);
                    assert!(e.contains(msg), "{}: {e}", c.name);
                }
            }
        }
    }

    struct HitCase {
        name: &'static str,
        point: &'static str,
        hit: u32,
        want: bool,
    }

    #[test]
    fn aborts_cases() {
        let target = Target {
            point: AFTER_CREATE.into(),
            nth: 2,
        };
        let cases = [
            HitCase {
                name: "first hit of the point passes",
                point: AFTER_CREATE,
                hit: 1,
                want: false,
            },
            HitCase {
                name: "the named hit aborts",
                point: AFTER_CREATE,
                hit: 2,
                want: true,
            },
            HitCase {
                name: "later hits pass (the count is past)",
                point: AFTER_CREATE,
                hit: 3,
                want: false,
            },
            HitCase {
                name: "another point never aborts",
                point: BEFORE_RELEASE,
                hit: 2,
                want: false,
            },
        ];
        for c in cases {
            assert_eq!(aborts(&target, c.point, c.hit), c.want, "{}", c.name);
        }
    }
}
