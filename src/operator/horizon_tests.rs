use chrono::TimeZone;

use super::*;
use crate::lease::{random_id, AcquireError, AcquireRequest, FakeClock, LeaseConfig, ProxyKey};

fn store(clock: &FakeClock) -> Arc<LeaseStore> {
    let cfg = LeaseConfig {
        max_leases_per_proxy: 1,
        default_ttl: Duration::from_secs(60),
        max_ttl: Duration::from_secs(600),
        cooldown: Duration::from_secs(60),
    };
    Arc::new(LeaseStore::with(
        cfg,
        Arc::new(clock.clone()),
        Box::new(random_id),
    ))
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
    let first = Horizon::new(store(&clock), margin);
    let on_lease = first.annotations(&BTreeMap::new(), true);
    first.written(&on_lease);
    assert_eq!(
        first.store.recovering_until(),
        None,
        "first start: no window"
    );
    assert!(acquire(&first.store).is_ok());

    let second = Horizon::new(store(&clock), margin);
    let attempt = second.annotations(&on_lease, true);
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

    let again = first.annotations(&on_lease, true);
    first.written(&again);
    assert_eq!(
        first.store.recovering_until(),
        None,
        "its own horizon, untouched: nobody led in between"
    );
}
