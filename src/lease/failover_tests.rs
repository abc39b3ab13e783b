use std::time::Duration;

use chrono::{TimeZone, Utc};

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
    LeaseStore::with(cfg, Arc::new(clock.clone())).with_key(key(key_byte))
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
    let room = Presented {
        eligible: true,
        active: 1,
        max: 2,
        held: 0,
        client_max: 0,
    };
    let cases = [
        ("room left", room, Ok(())),
        (
            "empty table",
            Presented {
                active: 0,
                max: 1,
                ..room
            },
            Ok(()),
        ),
        (
            "full: first come first served",
            Presented { active: 2, ..room },
            Err(Refusal::NoRoom),
        ),
        (
            "leasing turned off",
            Presented {
                active: 0,
                max: 0,
                ..room
            },
            Err(Refusal::NoRoom),
        ),
        (
            "proxy left the healthy set",
            Presented {
                eligible: false,
                active: 0,
                ..room
            },
            Err(Refusal::Ineligible),
        ),
        (
            "client below its cap",
            Presented {
                held: 2,
                client_max: 3,
                ..room
            },
            Ok(()),
        ),
        (
            "client at its cap: taking it in would pass it",
            Presented {
                held: 3,
                client_max: 3,
                ..room
            },
            Err(Refusal::ClientLimit),
        ),
        (
            "no client cap",
            Presented {
                held: 1_000,
                client_max: 0,
                ..room
            },
            Ok(()),
        ),
    ];
    for (name, presented, want) in cases {
        assert_eq!(readmit_decision(presented), want, "{name}");
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

#[test]
fn leases_taken_in_count_against_the_clients_cap() {
    let clock = clock();
    let limits = crate::lease::ClientLimits {
        max_leases: 2,
        global_cooldown_min_clients: 1,
    };
    let old = leader(10, 1, &clock).with_client_limits(limits);
    let held: Vec<_> = ["a", "b"]
        .map(|p| old.acquire(&[k(p)], &req("greedy")).unwrap())
        .into();
    let new = leader(10, 1, &clock).with_client_limits(limits);
    // A grant at the new leader before the old leases are presented...
    let extra = new.acquire(&[k("c")], &req("greedy")).unwrap();
    assert!(matches!(
        new.admit(&held[0].id, any),
        Admission::Readmitted(_)
    ));
    // ...leaves room for one of the two old leases only.
    assert_eq!(
        new.admit(&held[1].id, any),
        Admission::Refused(Refusal::ClientLimit)
    );
    assert_eq!(new.get(&held[1].id), None);
    assert!(new.acquire(&[k("d")], &req("greedy")).is_err());
    assert!(new.get(&extra.id).is_some());
    let other = new.acquire(&[k("d")], &req("polite"));
    assert!(other.is_ok(), "another client's cap is its own");
}

#[test]
fn a_released_id_is_remembered_for_its_whole_ttl_however_many_follow() {
    let clock = clock();
    let old = leader(1, 1, &clock);
    let first = old.acquire(&[k("a")], &req("c")).unwrap();
    assert!(old.release(&first.id));
    // More releases than the count the memory used to be capped at.
    for _ in 0..100_001 {
        let l = old.acquire(&[k("a")], &req("c")).unwrap();
        assert!(old.release(&l.id));
    }
    assert_eq!(
        old.admit(&first.id, any),
        Admission::Unknown,
        "still remembered while its TTL runs"
    );
    assert_eq!(old.active_on(&k("a")), 0);
    clock.advance(Duration::from_secs(61));
    let s = old.acquire(&[k("a")], &req("c")).unwrap();
    assert!(old.release(&s.id));
}
