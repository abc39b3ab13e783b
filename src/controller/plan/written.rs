//! Read your own writes. A pass reads its Proxy from the controller's
//! cache, which may not show the status the previous pass wrote yet: a
//! pass that wrote twice (an annotation, then the status) triggers the
//! next one with the first write's event, and that pass may run before the
//! second write's event arrives. Starting from that stale status repeats
//! what the last pass did: a second create for one Proxy, a replacement
//! counted twice. Only the operator writes a Proxy's status, so a read
//! that differs from the last write is one the cache has not caught up
//! with, and the pass starts from the write instead.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::api::ProxyStatus;

/// A written status the cache still does not show after this long is
/// given up: the read is trusted again (an edit by hand, or a write the
/// server dropped).
pub const TRUST_READ_AFTER: Duration = Duration::from_secs(30);

/// Which status a pass starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Base {
    /// The one read from the cache; the remembered write (if any) can go.
    Read,
    /// The one the last pass wrote: the cache is behind.
    Written,
}

/// The base of a pass at `now`, given the status it `read` and the last
/// one written (with when), if remembered.
pub fn base(
    read: &ProxyStatus,
    written: Option<(&ProxyStatus, DateTime<Utc>)>,
    now: DateTime<Utc>,
) -> Base {
    let Some((status, at)) = written else {
        return Base::Read;
    };
    let fresh = now
        .signed_duration_since(at)
        .to_std()
        .map(|age| age < TRUST_READ_AFTER)
        // A write in the future (clock skew) counts as fresh.
        .unwrap_or(true);
    if status != read && fresh {
        Base::Written
    } else {
        Base::Read
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::t;
    use super::*;

    fn with_id(id: &str) -> ProxyStatus {
        ProxyStatus {
            provider_id: Some(id.into()),
            ..Default::default()
        }
    }

    #[test]
    fn base_table() {
        struct Case {
            name: &'static str,
            read: ProxyStatus,
            written: Option<(ProxyStatus, i64)>,
            now: i64,
            want: Base,
        }
        let cases = [
            Case {
                name: "nothing written: the read",
                read: ProxyStatus::default(),
                written: None,
                now: 0,
                want: Base::Read,
            },
            Case {
                name: "the cache shows the write: the read",
                read: with_id("i-1"),
                written: Some((with_id("i-1"), 0)),
                now: 1,
                want: Base::Read,
            },
            Case {
                name: "the cache has not caught up (no ID yet): the write",
                read: ProxyStatus::default(),
                written: Some((with_id("i-1"), 0)),
                now: 1,
                want: Base::Written,
            },
            Case {
                name: "still behind just before the limit",
                read: ProxyStatus::default(),
                written: Some((with_id("i-1"), 0)),
                now: 29,
                want: Base::Written,
            },
            Case {
                name: "still different after 30 s: the read is trusted",
                read: with_id("edited"),
                written: Some((with_id("i-1"), 0)),
                now: 30,
                want: Base::Read,
            },
            Case {
                name: "a write from the future counts as fresh",
                read: ProxyStatus::default(),
                written: Some((with_id("i-1"), 10)),
                now: 0,
                want: Base::Written,
            },
        ];
        for c in cases {
            let written = c.written.as_ref().map(|(s, at)| (s, t(*at)));
            assert_eq!(base(&c.read, written, t(c.now)), c.want, "{}", c.name);
        }
    }
}
