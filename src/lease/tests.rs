use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::TimeZone;

use super::*;

fn k(name: &str) -> ProxyKey {
    ProxyKey {
        namespace: "default".into(),
        name: name.into(),
    }
}

fn keys(names: &[&str]) -> Vec<ProxyKey> {
    names.iter().map(|n| k(n)).collect()
}

fn cfg(max: u32) -> LeaseConfig {
    LeaseConfig {
        max_leases_per_proxy: max,
        default_ttl: Duration::from_secs(300),
        max_ttl: Duration::from_secs(3600),
        cooldown: Duration::from_secs(60),
    }
}

fn store(max: u32) -> (LeaseStore, FakeClock) {
    let clock = FakeClock::at(Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap());
    (LeaseStore::with(cfg(max), Arc::new(clock.clone())), clock)
}

fn req() -> AcquireRequest {
    AcquireRequest {
        ttl: Duration::from_secs(60),
        ..Default::default()
    }
}

fn names(ls: &[Lease]) -> Vec<String> {
    ls.iter().map(|l| l.proxy.name.clone()).collect()
}

#[test]
fn ttl_rules() {
    let d = Duration::from_secs(300);
    let m = Duration::from_secs(3600);
    struct Case {
        name: &'static str,
        ttl: Option<i64>,
        want: Result<u64, ()>,
    }
    let cases = [
        Case {
            name: "unset takes the default",
            ttl: None,
            want: Ok(300),
        },
        Case {
            name: "one second is the smallest",
            ttl: Some(1),
            want: Ok(1),
        },
        Case {
            name: "the maximum itself is allowed",
            ttl: Some(3600),
            want: Ok(3600),
        },
        Case {
            name: "over the maximum",
            ttl: Some(3601),
            want: Err(()),
        },
        Case {
            name: "zero",
            ttl: Some(0),
            want: Err(()),
        },
        Case {
            name: "negative",
            ttl: Some(-5),
            want: Err(()),
        },
        Case {
            name: "huge",
            ttl: Some(i64::MAX),
            want: Err(()),
        },
    ];
    for c in cases {
        let got = validate_ttl(c.ttl, d, m)
            .map(|d| d.as_secs())
            .map_err(|_| ());
        assert_eq!(got, c.want, "{}: {:?}", c.name, c.ttl);
    }
    assert_eq!(
        validate_ttl(Some(-1), d, m).unwrap_err().to_string(),
        "ttlSeconds must be positive, got -1"
    );
}

#[test]
fn fair_choice_least_loaded_then_least_recent_then_name() {
    struct Case {
        name: &'static str,
        max_per_proxy: u32,
        acquires: usize,
        want: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "one each, then full",
            max_per_proxy: 1,
            acquires: 3,
            want: &["a", "b", "c"],
        },
        Case {
            name: "two each, round robin",
            max_per_proxy: 2,
            acquires: 6,
            want: &["a", "b", "c", "a", "b", "c"],
        },
        Case {
            name: "second round starts at the least recent",
            max_per_proxy: 3,
            acquires: 4,
            want: &["a", "b", "c", "a"],
        },
    ];
    for c in cases {
        let (s, _) = store(c.max_per_proxy);
        let got: Vec<Lease> = (0..c.acquires)
            .map(|_| s.acquire(&keys(&["c", "a", "b"]), &req()).unwrap())
            .collect();
        assert_eq!(names(&got), c.want.to_vec(), "{}", c.name);
    }
}

#[test]
fn least_recently_granted_wins_among_equally_loaded() {
    let (s, clock) = store(1);
    let all = keys(&["a", "b", "c"]);
    let la = s.acquire(&all, &req()).unwrap();
    clock.advance(Duration::from_secs(1));
    let lb = s.acquire(&all, &req()).unwrap();
    s.release(&lb.id);
    s.release(&la.id);
    // a and b are idle; a was granted longer ago than b; c never: c first.
    let next: Vec<Lease> = (0..3).map(|_| s.acquire(&all, &req()).unwrap()).collect();
    assert_eq!(names(&next), ["c", "a", "b"]);
}

#[test]
fn capacity_and_max_zero() {
    let (s, _) = store(1);
    let two = keys(&["a", "b"]);
    s.acquire(&two, &req()).unwrap();
    s.acquire(&two, &req()).unwrap();
    assert_eq!(
        s.acquire(&two, &req()).unwrap_err(),
        AcquireError::NoCapacity {
            matching: 2,
            at_capacity: 2,
            cooling: 0
        }
    );
    assert_eq!(
        s.acquire::<ProxyKey>(&[], &req()).unwrap_err(),
        AcquireError::NoProxy
    );
    // max 0: leasing off.
    let (z, _) = store(0);
    assert!(matches!(
        z.acquire(&two, &req()),
        Err(AcquireError::NoCapacity { at_capacity: 2, .. })
    ));
    assert_eq!(z.active(), 0);
}

#[test]
fn release_is_idempotent_and_frees_capacity() {
    let (s, _) = store(1);
    let one = keys(&["a"]);
    let l = s.acquire(&one, &req()).unwrap();
    assert!(s.acquire(&one, &req()).is_err());
    assert!(s.release(&l.id));
    assert!(!s.release(&l.id));
    assert!(!s.release("nope"));
    assert_eq!(s.active_on(&k("a")), 0);
    s.acquire(&one, &req()).unwrap();
    assert_eq!(s.active_on(&k("a")), 1);
}

#[test]
fn expiry_follows_the_clock_and_renew_extends() {
    let (s, clock) = store(1);
    let one = keys(&["a"]);
    let l = s.acquire(&one, &req()).unwrap();
    assert_eq!(l.expires_at - l.granted_at, chrono::Duration::seconds(60));
    clock.advance(Duration::from_secs(59));
    assert_eq!(s.active(), 1);
    let r = s.renew(&l.id, Duration::from_secs(60)).unwrap();
    assert_eq!(r.expires_at, clock.now() + chrono::Duration::seconds(60));
    clock.advance(Duration::from_secs(59));
    assert!(s.get(&l.id).is_some());
    clock.advance(Duration::from_secs(1));
    assert_eq!(s.active(), 0);
    assert!(s.get(&l.id).is_none());
    assert!(s.renew(&l.id, Duration::from_secs(60)).is_none());
    assert!(s.report(&l.id, Outcome::Ok, None).is_none());
    // Capacity is back.
    s.acquire(&one, &req()).unwrap();
    assert_eq!(s.sweep(), 0);
}

#[test]
fn cooldowns_site_scoped_and_global() {
    struct Case {
        name: &'static str,
        reported: Option<&'static str>,
        wanted: Option<&'static str>,
        withheld: bool,
    }
    let cases = [
        Case {
            name: "same site cools down",
            reported: Some("x.com"),
            wanted: Some("x.com"),
            withheld: true,
        },
        Case {
            name: "other site is not affected",
            reported: Some("x.com"),
            wanted: Some("y.com"),
            withheld: false,
        },
        Case {
            name: "no site is not affected by a site report",
            reported: Some("x.com"),
            wanted: None,
            withheld: false,
        },
        Case {
            name: "global report cools every site",
            reported: None,
            wanted: Some("y.com"),
            withheld: true,
        },
        Case {
            name: "global report cools no-site requests",
            reported: None,
            wanted: None,
            withheld: true,
        },
    ];
    for c in cases {
        let (s, clock) = store(5);
        let one = keys(&["a"]);
        let l = s.acquire(&one, &req()).unwrap();
        assert!(s.report(&l.id, Outcome::Blocked, c.reported).is_some());
        // The report keeps the lease.
        assert!(s.get(&l.id).is_some());
        let r = AcquireRequest {
            site: c.wanted.map(String::from),
            ..req()
        };
        let got = s.acquire(&one, &r);
        assert_eq!(got.is_err(), c.withheld, "{}", c.name);
        if c.withheld {
            assert!(matches!(
                got,
                Err(AcquireError::NoCapacity { cooling: 1, .. })
            ));
            clock.advance(Duration::from_secs(60));
            s.acquire(&one, &r).unwrap();
        }
    }
    // ok never cools down.
    let (s, _) = store(5);
    let l = s.acquire(&keys(&["a"]), &req()).unwrap();
    s.report(&l.id, Outcome::Ok, None).unwrap();
    s.acquire(&keys(&["a"]), &req()).unwrap();
    assert!(s.report("nope", Outcome::Failed, None).is_none());
}

#[test]
fn sticky_key_keeps_its_proxy_while_it_can() {
    let (s, _) = store(2);
    let all = keys(&["a", "b"]);
    let sticky = AcquireRequest {
        sticky_key: Some("crawler-1".into()),
        ..req()
    };
    let first = s.acquire(&all, &sticky).unwrap();
    let other = s.acquire(&all, &req()).unwrap();
    assert_ne!(first.proxy, other.proxy);
    // Same proxy although the other is equally loaded and less recent.
    let again = s.acquire(&all, &sticky).unwrap();
    assert_eq!(again.proxy, first.proxy);
    // At capacity now: moves, and sticks to the new one.
    let moved = s.acquire(&all, &sticky).unwrap();
    assert_eq!(moved.proxy, other.proxy);
    s.release(&first.id);
    s.release(&again.id);
    s.release(&other.id);
    // a is idle, b holds one: still b.
    let stays = s.acquire(&all, &sticky).unwrap();
    assert_eq!(stays.proxy, other.proxy);
    // Not eligible (unhealthy): moves.
    let only_first = vec![first.proxy.clone()];
    assert_eq!(s.acquire(&only_first, &sticky).unwrap().proxy, first.proxy);
}

#[test]
fn forty_concurrent_acquires_never_exceed_capacity() {
    for max in [1u32, 3] {
        let (s, _) = store(max);
        let s = Arc::new(s);
        let all = Arc::new(keys(&["a", "b", "c", "d", "e"]));
        let granted: Vec<Option<Lease>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..40)
                .map(|_| {
                    let (s, all) = (s.clone(), all.clone());
                    scope.spawn(move || s.acquire(&all, &req()).ok())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let ok: Vec<Lease> = granted.into_iter().flatten().collect();
        assert_eq!(ok.len(), 5 * max as usize);
        for key in all.iter() {
            let n = ok.iter().filter(|l| &l.proxy == key).count();
            assert_eq!(n, max as usize, "{key}");
            assert_eq!(s.active_on(key), max);
        }
        let ids: HashSet<&String> = ok.iter().map(|l| &l.id).collect();
        assert_eq!(ids.len(), ok.len());
    }
}

#[test]
fn random_ids_are_distinct_and_url_safe() {
    let a = random_id();
    let b = random_id();
    assert_ne!(a, b);
    assert_eq!(a.len(), 2 + 26);
    assert!(a
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
}

#[test]
fn deleted_proxies_lose_cooldowns_and_sticky() {
    // The cooldown half: a failed proxy, deleted and back, is not cooling.
    let (s, _) = store(1);
    let l = s.acquire(&keys(&["a"]), &req()).unwrap();
    s.report(&l.id, Outcome::Failed, None);
    s.release(&l.id);
    s.retain_proxies(&HashSet::new());
    s.acquire(&keys(&["a"]), &req()).unwrap();

    // The sticky half: key K on z, while z holds one lease more than b, so
    // fairness alone would pick b. Before z's deletion K still goes to z;
    // after it (z back, again holding one lease) K goes by fairness to b.
    let (s, _) = store(2);
    let all = keys(&["b", "z"]);
    let only_z = keys(&["z"]);
    let sticky = AcquireRequest {
        sticky_key: Some("K".into()),
        ..req()
    };
    let first = s.acquire(&only_z, &sticky).unwrap();
    assert!(s.release(&first.id));
    let hold = s.acquire(&only_z, &req()).unwrap();
    let kept = s.acquire(&all, &sticky).unwrap();
    assert_eq!(kept.proxy.name, "z", "the key pins z over fairness");
    assert!(s.release(&kept.id) && s.release(&hold.id));

    s.retain_proxies(&keys(&["b"]).into_iter().collect());
    let _hold = s.acquire(&only_z, &req()).unwrap();
    let after = s.acquire(&all, &sticky).unwrap();
    assert_eq!(after.proxy.name, "b", "z's deletion forgot the key");
}

#[test]
fn per_client_lease_caps() {
    let (s, _) = store(10);
    let s = s.with_client_limits(ClientLimits {
        max_leases: 2,
        global_cooldown_min_clients: 2,
    });
    let all = keys(&["a", "b"]);
    let by = |c: &str| AcquireRequest {
        client: c.into(),
        ..req()
    };
    let first = s.acquire(&all, &by("greedy")).unwrap();
    s.acquire(&all, &by("greedy")).unwrap();
    assert_eq!(
        s.acquire(&all, &by("greedy")),
        Err(AcquireError::ClientLimit { max: 2 })
    );
    // Another client is not held back by the greedy one.
    assert_eq!(
        s.acquire(&all, &by("polite")).unwrap().client.as_ref(),
        "polite"
    );
    // A release gives the greedy client room again.
    assert!(s.release(&first.id));
    s.acquire(&all, &by("greedy")).unwrap();
}

#[test]
fn one_client_cannot_put_the_fleet_in_global_cooldown() {
    let (s, _) = store(10);
    let s = s.with_client_limits(ClientLimits {
        max_leases: 0,
        global_cooldown_min_clients: 2,
    });
    let one = keys(&["a"]);
    let by = |c: &str| AcquireRequest {
        client: c.into(),
        ..req()
    };
    let l = s.acquire(&one, &by("x")).unwrap();
    s.report(&l.id, Outcome::Failed, None).unwrap();
    assert!(
        matches!(
            s.acquire(&one, &by("x")),
            Err(AcquireError::NoCapacity { cooling: 1, .. })
        ),
        "the reporter itself is kept off the proxy"
    );
    let l = s.acquire(&one, &by("y")).unwrap();
    s.report(&l.id, Outcome::Failed, None).unwrap();
    assert!(
        matches!(
            s.acquire(&one, &by("z")),
            Err(AcquireError::NoCapacity { cooling: 1, .. })
        ),
        "two clients' reports withhold it from everyone"
    );
}

#[test]
fn the_gateway_leaves_exclusive_leases_alone_and_honours_cooldowns() {
    let (s, clock) = store(1);
    let all = keys(&["a", "b"]);
    let leased = s.acquire(&all, &req()).unwrap().proxy;
    let other = all.iter().find(|p| **p != leased).unwrap().clone();
    assert!(
        !s.lets_gateway_use("gw", &leased, None),
        "exclusively leased"
    );
    assert!(s.lets_gateway_use("gw", &other, None));
    // A ban for one site holds that site only.
    s.cool_down(&other, &Arc::from("gw"), Some("example.com"));
    assert!(!s.lets_gateway_use("gw", &other, Some("example.com")));
    assert!(s.lets_gateway_use("gw", &other, Some("example.org")));
    assert!(s.lets_gateway_use("gw", &other, None));
    // A report without a site holds it for the client, for the cooldown.
    s.cool_down(&other, &Arc::from("gw"), None);
    assert!(!s.lets_gateway_use("gw", &other, None));
    clock.advance(Duration::from_secs(61));
    assert!(s.lets_gateway_use("gw", &other, Some("example.com")));
    // The lease ran out (60 s TTL): its proxy is the gateway's again.
    assert!(s.lets_gateway_use("gw", &leased, None));
    // With shared leases (several per proxy), a lease is not exclusive.
    let (shared, _) = store(2);
    let l = shared.acquire(&all, &req()).unwrap();
    assert!(shared.lets_gateway_use("gw", &l.proxy, None));
}

/// One client looping acquire(3600 s) + release: once it holds its cap of
/// remembered releases its leases (and renewals) last at most
/// `CROWDED_TTL`, another client's do not, and each id it released stays
/// refused while it could be presented.
#[test]
fn a_client_looping_long_leases_and_releases_gets_short_leases_past_its_cap() {
    let (s, clock) = store(10);
    let hour = Duration::from_secs(3600);
    let ask = |c: &str| AcquireRequest {
        ttl: hour,
        client: c.into(),
        ..Default::default()
    };
    let proxies = keys(&["a"]);
    let mut first = None;
    for _ in 0..MAX_RELEASED_PER_CLIENT {
        let l = s.acquire(&proxies, &ask("looper")).unwrap();
        assert_eq!(l.expires_at - l.granted_at, chrono::Duration::hours(1));
        assert!(s.release(&l.id));
        first.get_or_insert(l.id);
    }
    let short = s.acquire(&proxies, &ask("looper")).unwrap();
    assert_eq!(
        short.expires_at - short.granted_at,
        chrono::Duration::from_std(CROWDED_TTL).unwrap()
    );
    let renewed = s.renew(&short.id, hour).unwrap();
    assert_eq!(
        renewed.expires_at - s.now(),
        chrono::Duration::from_std(CROWDED_TTL).unwrap()
    );
    let other = s.acquire(&proxies, &ask("other")).unwrap();
    assert_eq!(
        other.expires_at - other.granted_at,
        chrono::Duration::hours(1)
    );
    // The first id released is still dead, not forgotten for the cap.
    let first = first.unwrap();
    assert!(s.get(&first).is_none() && !s.release(&first));
    assert!(s.renew(&first, hour).is_none());
    // An hour on, the releases aged out: full leases again.
    assert!(s.release(&short.id));
    clock.advance(hour + Duration::from_secs(1));
    s.sweep();
    let full = s.acquire(&proxies, &ask("looper")).unwrap();
    assert_eq!(
        full.expires_at - full.granted_at,
        chrono::Duration::hours(1)
    );
}
