use chrono::TimeZone;

use super::*;
use crate::lease::{AcquireError, AcquireRequest, FakeClock, LeaseConfig, ProxyKey};

fn store(clock: &FakeClock) -> Arc<LeaseStore> {
    let cfg = LeaseConfig {
        max_leases_per_proxy: 1,
        default_ttl: Duration::from_secs(60),
        max_ttl: Duration::from_secs(600),
        cooldown: Duration::from_secs(60),
    };
    Arc::new(LeaseStore::with(cfg, Arc::new(clock.clone())))
}

fn acquire(s: &LeaseStore) -> Result<(), AcquireError> {
    let k = ProxyKey {
        namespace: "ns".into(),
        name: "p".into(),
    };
    let req = AcquireRequest {
        ttl: Duration::from_secs(60),
        ..Default::default()
    };
    s.acquire(&[k], &req).map(|_| ())
}

#[test]
fn the_window_opens_when_the_take_over_is_written_and_not_for_our_own_horizon() {
    let clock = FakeClock::at(Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap());
    let margin = Duration::from_secs(1);
    let first = Horizon::new(store(&clock), margin, None);
    let on_lease = first.annotations(&BTreeMap::new(), Some(Duration::ZERO));
    first.written(&on_lease);
    assert_eq!(
        first.store.recovering_until(),
        None,
        "first start: no window"
    );
    assert!(acquire(&first.store).is_ok());

    let second = Horizon::new(store(&clock), margin, None);
    let attempt = second.annotations(&on_lease, Some(Duration::ZERO));
    assert!(
        attempt[HORIZON_ANNOTATION] >= on_lease[HORIZON_ANNOTATION],
        "the take-over publishes at least the previous horizon"
    );
    assert_eq!(
        second.store.recovering_until(),
        None,
        "a candidate whose write lost keeps serving as it did"
    );
    second.written(&attempt);
    let until = second.store.recovering_until().expect("a window");
    assert_eq!(Some(until), parse(on_lease.get(HORIZON_ANNOTATION)));
    assert!(matches!(
        acquire(&second.store),
        Err(AcquireError::Recovering { .. })
    ));

    let again = first.annotations(&on_lease, Some(Duration::ZERO));
    first.written(&again);
    assert_eq!(
        first.store.recovering_until(),
        None,
        "its own horizon, untouched: nobody led in between"
    );
}

#[test]
fn a_hand_over_starts_the_term_with_the_previous_table_and_no_window() {
    let clock = FakeClock::at(Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap());
    let margin = Duration::from_secs(1);
    let first = Horizon::new(store(&clock), margin, None);
    let on_lease = first.annotations(&BTreeMap::new(), Some(Duration::ZERO));
    first.written(&on_lease);
    acquire(&first.store).unwrap();
    let table = first.store.export();

    let next = Horizon::new(store(&clock), margin, None);
    *lock(&next.loaded) = Some(table);
    let attempt = next.annotations(&on_lease, Some(Duration::ZERO));
    assert_eq!(
        attempt.get(HANDOVER_ANNOTATION).map(String::as_str),
        Some(""),
        "the take-over marks the hand-over taken"
    );
    assert_eq!(next.store.active(), 0, "nothing before the write wins");
    next.written(&attempt);
    assert_eq!(next.store.recovering_until(), None, "no window");
    assert_eq!(next.store.active(), 1, "the lease granted before");
    assert!(
        matches!(acquire(&next.store), Err(AcquireError::NoCapacity { .. })),
        "its proxy is still full"
    );
}

#[test]
fn the_previous_horizon_is_counted_from_when_this_replica_saw_it() {
    let now = Utc.with_ymd_and_hms(2025, 1, 1, 0, 10, 0).unwrap();
    let s = |secs: i64| now + chrono::Duration::seconds(secs);
    let read = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let cases = [
        (
            "relative: from the first sight of that write, whatever the date says",
            read(&[
                (HORIZON_MS_ANNOTATION, "30000"),
                (HORIZON_ANNOTATION, "2025-01-01T00:00:01.000Z"),
            ]),
            Duration::from_secs(10),
            Some(s(20)),
        ),
        (
            "an older leader's date only",
            read(&[(HORIZON_ANNOTATION, "2025-01-01T00:10:07.000Z")]),
            Duration::from_secs(10),
            Some(s(7)),
        ),
        (
            "unreadable relative: the date",
            read(&[
                (HORIZON_MS_ANNOTATION, "soon"),
                (HORIZON_ANNOTATION, "2025-01-01T00:10:07.000Z"),
            ]),
            Duration::ZERO,
            Some(s(7)),
        ),
        ("nothing published", read(&[]), Duration::ZERO, None),
    ];
    for (name, read, unchanged_for, want) in cases {
        assert_eq!(previous_horizon(&read, unchanged_for, now), want, "{name}");
    }
}

#[test]
fn the_relative_horizon_is_rounded_up_never_down() {
    let now = Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap();
    let h = now + chrono::Duration::microseconds(1_500_001);
    let [_, (k, ms)] = published(h, now);
    assert_eq!((k.as_str(), ms.as_str()), (HORIZON_MS_ANNOTATION, "1501"));
}
