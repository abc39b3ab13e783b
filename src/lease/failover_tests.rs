use std::time::Duration;

use chrono::TimeZone;

use super::super::signed::KEY_LEN;
use super::super::{AcquireRequest, FakeClock, LeaseConfig};
use super::*;

fn k(name: &str) -> ProxyKey {
    ProxyKey {
        namespace: "default".into(),
        name: name.into(),
    }
}

fn key(b: u8) -> LeaseKey {
    LeaseKey::from_bytes(&[b; KEY_LEN]).unwrap()
}

/// A leader's store: capacity `max`, ids signed with `key(key_byte)`, on
/// the shared clock.
fn leader(max: u32, key_byte: u8, clock: &FakeClock) -> LeaseStore {
    let cfg = LeaseConfig {
        max_leases_per_proxy: max,
        default_ttl: Duration::from_secs(60),
        max_ttl: Duration::from_secs(600),
        cooldown: Duration::from_secs(60),
    };
    LeaseStore::with(
        cfg,
        Arc::new(clock.clone()),
        Box::new(super::super::random_id),
    )
    .with_key(key(key_byte))
}

fn clock() -> FakeClock {
    FakeClock::at(Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap())
}

fn req(client: &str) -> AcquireRequest {
    AcquireRequest {
        ttl: Duration::from_secs(60),
        client: client.into(),
        ..Default::default()
    }
}

fn any(_: &ProxyKey) -> bool {
    true
}

#[test]
fn readmit_rules() {
    struct Case {
        name: &'static str,
        eligible: bool,
        active: u32,
        max: u32,
        want: Result<(), Refusal>,
    }
    let cases = [
        Case {
            name: "room left",
            eligible: true,
            active: 1,
            max: 2,
            want: Ok(()),
        },
        Case {
            name: "empty table",
            eligible: true,
            active: 0,
            max: 1,
            want: Ok(()),
        },
        Case {
            name: "full: first come first served",
            eligible: true,
            active: 2,
            max: 2,
            want: Err(Refusal::NoRoom),
        },
        Case {
            name: "leasing turned off",
            eligible: true,
            active: 0,
            max: 0,
            want: Err(Refusal::NoRoom),
        },
        Case {
            name: "proxy left the healthy set",
            eligible: false,
            active: 0,
            max: 2,
            want: Err(Refusal::Ineligible),
        },
    ];
    for c in cases {
        assert_eq!(
            readmit_decision(c.eligible, c.active, c.max),
            c.want,
            "{}",
            c.name
        );
    }
}

#[test]
fn a_new_leader_takes_in_live_leases_and_renews_them_on_their_proxy() {
    let clock = clock();
    let old = leader(2, 1, &clock);
    let a = old.acquire(&[k("a")], &req("team-a")).unwrap();
    let b = old.acquire(&[k("a"), k("b")], &req("team-b")).unwrap();
    let new = leader(2, 1, &clock);
    assert_eq!(new.get(&a.id), None, "unknown before it is presented");
    match new.admit(&a.id, any) {
        Admission::Readmitted(l) => {
            assert_eq!(l.proxy, a.proxy);
            assert_eq!(&*l.client, "team-a");
            assert_eq!(l.expires_at, a.expires_at);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(new.admit(&a.id, any), Admission::Known, "taken in once");
    assert_eq!(new.active_on(&a.proxy), 1);
    clock.advance(Duration::from_secs(30));
    let renewed = new.renew(&a.id, Duration::from_secs(60)).unwrap();
    assert_eq!(renewed.proxy, a.proxy);
    assert_ne!(renewed.id, a.id, "a renewal signs the new expiry");
    assert!(matches!(new.admit(&b.id, any), Admission::Readmitted(_)));
    assert_eq!(new.active(), 2);
    assert!(new.release(&b.id));
    assert_eq!(new.active(), 1);
}

#[test]
fn the_newest_id_carries_the_lease_past_a_second_failover() {
    let clock = clock();
    let first = leader(1, 1, &clock);
    let l = first.acquire(&[k("a")], &req("c")).unwrap();
    clock.advance(Duration::from_secs(50));
    let second = leader(1, 1, &clock);
    assert!(matches!(second.admit(&l.id, any), Admission::Readmitted(_)));
    let renewed = second.renew(&l.id, Duration::from_secs(60)).unwrap();
    assert!(second.get(&l.id).is_some(), "the older id still works here");
    clock.advance(Duration::from_secs(20));
    let third = leader(1, 1, &clock);
    assert_eq!(
        third.admit(&l.id, any),
        Admission::Unknown,
        "the first id's signed expiry has passed"
    );
    assert!(matches!(
        third.admit(&renewed.id, any),
        Admission::Readmitted(_)
    ));
}

#[test]
fn capacity_is_never_exceeded_and_the_first_presented_wins() {
    for reused_first in [false, true] {
        let clock = clock();
        let old = leader(2, 1, &clock);
        let reused = old.acquire(&[k("a")], &req("c")).unwrap();
        assert!(old.release(&reused.id));
        let x = old.acquire(&[k("a")], &req("c")).unwrap();
        let y = old.acquire(&[k("a")], &req("c")).unwrap();
        let new = leader(2, 1, &clock);
        let order = if reused_first {
            [&reused.id, &x.id, &y.id]
        } else {
            [&x.id, &y.id, &reused.id]
        };
        let got: Vec<Admission> = order.iter().map(|id| new.admit(id, any)).collect();
        assert!(matches!(got[0], Admission::Readmitted(_)));
        assert!(matches!(got[1], Admission::Readmitted(_)));
        assert_eq!(got[2], Admission::Refused(Refusal::NoRoom));
        assert_eq!(new.active_on(&k("a")), 2);
        assert!(
            new.acquire(&[k("a")], &req("c")).is_err(),
            "no new grant past capacity"
        );
    }
}

#[test]
fn ids_that_do_not_check_out_are_unknown() {
    let clock = clock();
    let old = leader(2, 1, &clock);
    let l = old.acquire(&[k("a")], &req("c")).unwrap();
    let other_key = leader(2, 2, &clock);
    assert_eq!(other_key.admit(&l.id, any), Admission::Unknown);
    assert_eq!(other_key.get(&l.id), None);
    assert!(!other_key.release(&l.id));
    let new = leader(2, 1, &clock);
    assert_eq!(
        new.admit(&l.id, |_| false),
        Admission::Refused(Refusal::Ineligible)
    );
    clock.advance(Duration::from_secs(60));
    assert_eq!(new.admit(&l.id, any), Admission::Unknown, "expired");
    assert_eq!(new.active(), 0);
}

#[test]
fn every_id_of_a_live_lease_reaches_it_at_the_same_leader() {
    let clock = clock();
    let s = leader(1, 1, &clock);
    let l = s.acquire(&[k("a")], &req("c")).unwrap();
    let r1 = s.renew(&l.id, Duration::from_secs(60)).unwrap();
    clock.advance(Duration::from_secs(1));
    let r2 = s.renew(&l.id, Duration::from_secs(60)).unwrap();
    assert_eq!(
        s.get(&r1.id).unwrap().id,
        r2.id,
        "the lease carries the newest id"
    );
    assert!(s.release(&r1.id));
    assert_eq!(s.get(&r2.id), None);
    assert_eq!(
        s.admit(&r2.id, any),
        Admission::Unknown,
        "a released lease is not taken in again where it was released"
    );
    assert_eq!(s.active_on(&k("a")), 0);
}
