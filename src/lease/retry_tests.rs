use std::sync::Arc;

use chrono::TimeZone;

use super::*;
use crate::lease::FakeClock;

fn t(secs: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap() + chrono::TimeDelta::seconds(secs)
}

fn lease(proxy: &str, client: &str, ends_ms: i64) -> Lease {
    Lease {
        id: format!("{proxy}-{client}-{ends_ms}"),
        proxy: ProxyKey {
            namespace: "ns".into(),
            name: proxy.into(),
        },
        granted_at: t(0),
        expires_at: t(0) + chrono::TimeDelta::milliseconds(ends_ms),
        client: Arc::from(client),
    }
}

#[test]
fn retry_hint_table() {
    struct Case {
        name: &'static str,
        /// (proxy, client, end in ms after now), in order of their end.
        leases: Vec<(&'static str, &'static str, i64)>,
        /// The proxy whose leases make room.
        frees: &'static str,
        want_secs: u64,
    }
    let cases = [
        Case {
            name: "nothing would make room: the default",
            leases: vec![("a", "c", 3_000)],
            frees: "b",
            want_secs: RETRY_DEFAULT.as_secs(),
        },
        Case {
            name: "the first lease that makes room, rounded up",
            leases: vec![("a", "c", 2_000), ("b", "c", 7_200), ("b", "c", 9_000)],
            frees: "b",
            want_secs: 8,
        },
        Case {
            name: "ending within the second: at least 1",
            leases: vec![("b", "c", 10)],
            frees: "b",
            want_secs: 1,
        },
        Case {
            name: "already past its end (not yet expired): 1",
            leases: vec![("b", "c", -500)],
            frees: "b",
            want_secs: 1,
        },
        Case {
            name: "an hour away: capped",
            leases: vec![("b", "c", 3_600_000)],
            frees: "b",
            want_secs: RETRY_MAX.as_secs(),
        },
    ];
    for c in cases {
        let leases: Vec<Lease> = c
            .leases
            .iter()
            .map(|(p, cl, ms)| lease(p, cl, *ms))
            .collect();
        let got = retry_hint(t(0), leases.iter(), |l| l.proxy.name == c.frees);
        assert_eq!(got, Duration::from_secs(c.want_secs), "{}", c.name);
    }
}

/// Through the store: a proxy at capacity is worth asking for again when
/// its lease ends; with no proxy at all, after the default.
#[test]
fn a_refusal_says_when_its_lease_ends() {
    let clock = FakeClock::at(t(0));
    let config = super::super::LeaseConfig {
        max_leases_per_proxy: 1,
        default_ttl: Duration::from_secs(300),
        max_ttl: Duration::from_secs(3600),
        cooldown: Duration::from_secs(60),
    };
    let store = LeaseStore::with(config, Arc::new(clock.clone()));
    let a = [ProxyKey {
        namespace: "ns".into(),
        name: "a".into(),
    }];
    let req = super::super::AcquireRequest {
        ttl: Duration::from_secs(60),
        ..Default::default()
    };
    store.acquire(&a, &req).unwrap();
    let refused = store.acquire(&a, &req).unwrap_err();
    assert!(matches!(refused, AcquireError::NoCapacity { .. }));
    assert_eq!(
        store.retry_after(&a, "anyone", &refused),
        Duration::from_secs(60)
    );
    clock.advance(Duration::from_secs(45));
    assert_eq!(
        store.retry_after(&a, "anyone", &refused),
        Duration::from_secs(15)
    );
    let none: [ProxyKey; 0] = [];
    let refused = store.acquire(&none, &req).unwrap_err();
    assert_eq!(store.retry_after(&none, "anyone", &refused), RETRY_DEFAULT);
}
