//! `maxInstances`: the most instances one provider may hold at once
//! (issue 32). Counted from the Proxy cache (every Proxy of the provider
//! that records an instance, being deleted ones too, since their instance
//! still exists), plus the creates admitted here that the cache does not
//! show yet: two Proxies asking within the cache's lag cannot both take
//! the last place.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

/// How long an admitted create counts without the cache showing its
/// instance: past it, the create failed or is held elsewhere.
pub const RESERVED_FOR: Duration = Duration::from_secs(60);

/// One Proxy as the cache shows it.
#[derive(Clone, Copy, Debug)]
pub struct Seen<'a> {
    /// Its UID.
    pub key: &'a str,
    /// `spec.provider`.
    pub provider: &'a str,
    /// The instances its status records: the current one, a surge
    /// replacement (from when it is decided, before its create) and a
    /// retiring one.
    pub instances: usize,
}

/// Creates admitted here, by Proxy UID: (provider, when).
pub type Reserved = BTreeMap<String, (String, DateTime<Utc>)>;

/// How many instances `provider` holds for Proxies other than `asking`
/// (whose own instances the caller counts: none for a create, its current
/// one for a surge replacement),
/// and forgets admitted creates the cache now shows, or that are older
/// than [`RESERVED_FOR`].
pub fn held<'a>(
    seen: impl IntoIterator<Item = Seen<'a>>,
    reserved: &mut Reserved,
    provider: &str,
    asking: &str,
    now: DateTime<Utc>,
) -> usize {
    let reach = chrono::Duration::from_std(RESERVED_FOR).unwrap_or(chrono::Duration::MAX);
    reserved.retain(|_, (_, at)| now.signed_duration_since(*at) < reach);
    let mut n = 0;
    for s in seen {
        if s.instances > 0 {
            reserved.remove(s.key);
            if s.provider == provider && s.key != asking {
                n += s.instances;
            }
        }
    }
    n + reserved
        .iter()
        .filter(|(k, (p, _))| p == provider && k.as_str() != asking)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).expect("a valid timestamp")
    }

    fn seen<'a>(key: &'a str, provider: &'a str, has_instance: bool) -> Seen<'a> {
        Seen {
            key,
            provider,
            instances: usize::from(has_instance),
        }
    }

    #[test]
    fn instances_are_counted_from_the_cache_and_the_creates_it_does_not_show_yet() {
        let mut r = Reserved::new();
        let cache = [
            seen("a", "gcp", true),
            seen("b", "gcp", true),
            seen("c", "gcp", false),
            seen("k", "kube", true),
        ];
        assert_eq!(held(cache, &mut r, "gcp", "c", at(0)), 2);
        // c's create admitted: d sees three until the cache shows c's.
        r.insert("c".into(), ("gcp".into(), at(0)));
        assert_eq!(held(cache, &mut r, "gcp", "d", at(1)), 3);
        assert_eq!(held(cache, &mut r, "gcp", "c", at(1)), 2, "not itself");
        let shown = [
            seen("a", "gcp", true),
            seen("b", "gcp", true),
            seen("c", "gcp", true),
        ];
        assert_eq!(held(shown, &mut r, "gcp", "d", at(2)), 3, "counted once");
        assert!(r.is_empty(), "the cache shows it now");
        // A create that never shows up stops counting.
        r.insert("e".into(), ("gcp".into(), at(0)));
        assert_eq!(held(cache, &mut r, "gcp", "d", at(59)), 3);
        assert_eq!(held(cache, &mut r, "gcp", "d", at(60)), 2);
        assert_eq!(held(cache, &mut r, "kube", "d", at(60)), 1, "per provider");
    }

    #[test]
    fn a_surge_replacement_and_a_retiring_instance_count_as_instances() {
        let mut r = Reserved::new();
        let cache = [
            Seen {
                key: "a",
                provider: "gcp",
                instances: 3,
            },
            seen("b", "gcp", true),
        ];
        assert_eq!(held(cache, &mut r, "gcp", "c", at(0)), 4);
        assert_eq!(held(cache, &mut r, "gcp", "a", at(0)), 1, "not its own");
    }
}
