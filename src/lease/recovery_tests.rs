use std::sync::Arc;

use chrono::TimeZone;

use super::super::{AcquireRequest, FakeClock, LeaseConfig, ProxyKey};
use super::*;

fn t(s: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap() + chrono::TimeDelta::seconds(s)
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn horizon_covers_every_expiry_and_the_next_grants() {
    struct Case {
        name: &'static str,
        latest_end: Option<i64>,
        until: Option<i64>,
        longest: u64,
        want: i64,
    }
    let cases = [
        Case {
            name: "no lease: the next grant of the longest TTL, plus margin",
            latest_end: None,
            until: None,
            longest: 60,
            want: 100 + 60 + 4,
        },
        Case {
            name: "a lease ends later than a new grant would",
            latest_end: Some(500),
            until: None,
            longest: 60,
            want: 504,
        },
        Case {
            name: "the window still running is carried on",
            latest_end: Some(120),
            until: Some(900),
            longest: 60,
            want: 904,
        },
        Case {
            name: "nothing asked recently",
            latest_end: None,
            until: None,
            longest: 0,
            want: 104,
        },
    ];
    for c in cases {
        assert_eq!(
            horizon(
                t(100),
                c.latest_end.map(t),
                c.until.map(t),
                secs(c.longest),
                secs(4)
            ),
            t(c.want),
            "{}",
            c.name
        );
    }
}

#[test]
fn window_rules() {
    struct Case {
        name: &'static str,
        previous: Option<i64>,
        want: Option<i64>,
    }
    let max_ttl = secs(3600);
    let cases = [
        Case {
            name: "first start: no horizon, no window",
            previous: None,
            want: None,
        },
        Case {
            name: "horizon passed",
            previous: Some(99),
            want: None,
        },
        Case {
            name: "until the previous horizon",
            previous: Some(160),
            want: Some(160),
        },
        Case {
            name: "never past --max-lease-ttl",
            previous: Some(100_000),
            want: Some(100 + 3600),
        },
    ];
    for c in cases {
        assert_eq!(
            window_end(t(100), c.previous.map(t), max_ttl),
            c.want.map(t),
            "{}",
            c.name
        );
    }
}

#[test]
fn grant_rules() {
    struct Case {
        name: &'static str,
        wanted: i64,
        until: Option<i64>,
        bounded: bool,
        published: Option<i64>,
        want: Result<i64, u64>,
    }
    let cases = [
        Case {
            name: "no election: as asked",
            wanted: 160,
            until: None,
            bounded: false,
            published: None,
            want: Ok(160),
        },
        Case {
            name: "inside the window: wait the seconds left, rounded up",
            wanted: 160,
            until: Some(130),
            bounded: true,
            published: Some(200),
            want: Err(30),
        },
        Case {
            name: "window over, within the horizon",
            wanted: 160,
            until: Some(100),
            bounded: true,
            published: Some(200),
            want: Ok(160),
        },
        Case {
            name: "clamped to the published horizon",
            wanted: 260,
            until: None,
            bounded: true,
            published: Some(200),
            want: Ok(200),
        },
        Case {
            name: "nothing published yet",
            wanted: 160,
            until: None,
            bounded: true,
            published: None,
            want: Err(1),
        },
        Case {
            name: "horizon about to pass (the leader cannot write)",
            wanted: 160,
            until: None,
            bounded: true,
            published: Some(100),
            want: Err(1),
        },
    ];
    for c in cases {
        assert_eq!(
            grant_end(
                t(100),
                t(c.wanted),
                c.until.map(t),
                c.bounded,
                c.published.map(t)
            ),
            c.want.map(t).map_err(secs),
            "{}",
            c.name
        );
    }
}

fn k(name: &str) -> ProxyKey {
    ProxyKey {
        namespace: "default".into(),
        name: name.into(),
    }
}

fn store(clock: &FakeClock) -> LeaseStore {
    let cfg = LeaseConfig {
        max_leases_per_proxy: 2,
        default_ttl: secs(60),
        max_ttl: secs(600),
        cooldown: secs(60),
    };
    LeaseStore::with(cfg, Arc::new(clock.clone()))
}

fn req(ttl: u64) -> AcquireRequest {
    AcquireRequest {
        ttl: secs(ttl),
        ..Default::default()
    }
}

#[test]
fn a_new_leader_grants_after_the_window_and_within_what_it_published() {
    let clock = FakeClock::at(t(0));
    let s = store(&clock);
    assert_eq!(
        s.take_over_horizon(Some(t(45)), secs(4)),
        t(64),
        "the write that takes over publishes what take_over will"
    );
    s.take_over(Some(t(45)));
    assert_eq!(s.recovering_until(), Some(t(45)));
    let h = s.horizon(secs(4));
    assert_eq!(h, t(64), "the default TTL counts from the take-over");
    s.published(h);
    let refused = s.acquire(&[k("a")], &req(60)).unwrap_err();
    assert_eq!(refused, AcquireError::Recovering { wait: secs(45) });
    assert_eq!(s.retry_after(&[k("a")], "", &refused), secs(45));
    clock.advance(secs(45));
    assert_eq!(s.recovering_until(), None);
    let l = s.acquire(&[k("a")], &req(60)).unwrap();
    assert_eq!(l.expires_at, t(64), "clamped to the published horizon");
    let h = s.horizon(secs(4));
    assert_eq!(h, t(45 + 60 + 4));
    s.published(h);
    let l = s.renew(&l.id, secs(60)).unwrap();
    assert_eq!(l.expires_at, t(105), "a full TTL once it is published");
    s.published(t(50));
    let l = s.renew(&l.id, secs(60)).unwrap();
    assert_eq!(l.expires_at, t(105), "a renewal never shortens a lease");
}

#[test]
fn without_an_election_nothing_waits_or_clamps() {
    let clock = FakeClock::at(t(0));
    let s = store(&clock);
    let l = s.acquire(&[k("a")], &req(600)).unwrap();
    assert_eq!(l.expires_at, t(600));
    assert_eq!(s.recovering_until(), None);
}

#[test]
fn only_a_granted_ttl_stretches_the_horizon() {
    let clock = FakeClock::at(t(0));
    let s = store(&clock);
    s.take_over(None);
    s.published(s.horizon(secs(4)));
    assert_eq!(s.horizon(secs(4)), t(64), "the default TTL");
    // Refused: no healthy proxy, then a full one. Neither counts.
    assert_eq!(
        s.acquire::<ProxyKey>(&[], &req(600)),
        Err(AcquireError::NoProxy)
    );
    s.acquire(&[k("a")], &req(60)).unwrap();
    s.acquire(&[k("a")], &req(60)).unwrap();
    assert!(matches!(
        s.acquire(&[k("a")], &req(600)),
        Err(AcquireError::NoCapacity { .. })
    ));
    assert_eq!(
        s.horizon(secs(4)),
        t(64),
        "asked for and refused: not counted"
    );
    // Granted (clamped to what is published): counted from now on.
    let l = s.acquire(&[k("b")], &req(600)).unwrap();
    assert_eq!(l.expires_at, t(64));
    assert_eq!(s.horizon(secs(4)), t(604));
    // It counts for as long as a lease of it could run, then only the
    // default TTL, which a grant may hand out at any moment.
    clock.advance(secs(601));
    assert_eq!(s.horizon(secs(4)), t(601 + 60 + 4));
}

#[test]
fn a_proxys_leases_are_known_until_their_last_end_outside_a_window() {
    let clock = FakeClock::at(t(0));
    let s = store(&clock);
    assert_eq!(s.held_until(&k("a")), HeldUntil::Known(None));
    s.acquire(&[k("a")], &req(60)).unwrap();
    clock.advance(secs(10));
    s.acquire(&[k("a")], &req(30)).unwrap();
    assert_eq!(s.held_until(&k("a")), HeldUntil::Known(Some(t(60))));
    assert_eq!(s.held_until(&k("b")), HeldUntil::Known(None));
    clock.advance(secs(51));
    assert_eq!(s.held_until(&k("a")), HeldUntil::Known(None), "run out");
    // A new leader inside its window cannot know.
    s.take_over(Some(t(300)));
    assert_eq!(s.held_until(&k("a")), HeldUntil::Unknown);
    clock.advance(secs(300));
    assert_eq!(s.held_until(&k("a")), HeldUntil::Known(None));
}
