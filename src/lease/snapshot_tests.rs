use std::time::Duration;

use chrono::TimeZone;

use super::super::signed::KEY_LEN;
use super::super::{
    AcquireError, AcquireRequest, Admission, Clock, FakeClock, Lease, LeaseConfig, LeaseKey,
    Outcome,
};
use super::*;

pub(in crate::lease) fn k(name: &str) -> ProxyKey {
    ProxyKey {
        namespace: "crawl".into(),
        name: name.into(),
    }
}

pub(in crate::lease) fn store(clock: &FakeClock) -> LeaseStore {
    let cfg = LeaseConfig {
        max_leases_per_proxy: 2,
        default_ttl: Duration::from_secs(60),
        max_ttl: Duration::from_secs(600),
        cooldown: Duration::from_secs(120),
    };
    LeaseStore::with(cfg, Arc::new(clock.clone()))
        .with_key(LeaseKey::from_bytes(&[7; KEY_LEN]).unwrap())
}

fn req(client: &str, sticky: Option<&str>, site: Option<&str>) -> AcquireRequest {
    AcquireRequest {
        ttl: Duration::from_secs(60),
        client: client.into(),
        sticky_key: sticky.map(String::from),
        site: site.map(String::from),
    }
}

fn at(h: u32) -> FakeClock {
    FakeClock::at(Utc.with_ymd_and_hms(2026, 12, 4, h, 0, 0).unwrap())
}

/// The old leader's state: `a` full (two leases, one under a sticky key),
/// `b` reported failed by team-x and blocked for one site, one released
/// lease on `c`.
struct Old {
    store: LeaseStore,
    held: Vec<Lease>,
    released: Lease,
}

fn old_leader(clock: &FakeClock) -> Old {
    let store = store(clock);
    let all = [k("a"), k("b"), k("c")];
    let a1 = store
        .acquire(&[k("a")], &req("team-x", Some("session-1"), None))
        .unwrap();
    let a2 = store
        .acquire(&[k("a")], &req("team-y", None, None))
        .unwrap();
    let b = store
        .acquire(&[k("b")], &req("team-x", None, None))
        .unwrap();
    store.report(&b.id, Outcome::Failed, None).unwrap();
    store
        .report(&b.id, Outcome::Blocked, Some("shop.example"))
        .unwrap();
    let c = store
        .acquire(&[k("c")], &req("team-y", None, None))
        .unwrap();
    assert!(store.release(&c.id));
    assert_eq!(store.active(), 3, "{all:?}");
    Old {
        store,
        held: vec![a1, a2, b],
        released: c,
    }
}

#[test]
fn the_next_leader_starts_with_the_whole_state_whatever_its_clock_says() {
    // The next leader's clock is an hour behind the old one's: times travel
    // as durations, so nothing ends early or late.
    for next_hour in [11, 12, 13] {
        let old_clock = at(12);
        let old = old_leader(&old_clock);
        old_clock.advance(Duration::from_secs(10));
        let snap = old.store.export();
        let bytes = super::super::wire::encode(&snap);
        let clock = at(next_hour);
        let new = store(&clock);
        new.import(&super::super::wire::decode(&bytes).unwrap())
            .unwrap();
        let all = [k("a"), k("b"), k("c")];

        for l in &old.held {
            let got = new.get(&l.id).expect("every held lease is known");
            assert_eq!((&got.proxy, &got.client), (&l.proxy, &l.client));
            assert_eq!(
                got.expires_at,
                clock.now() + chrono::Duration::seconds(50),
                "50 s were left of its 60"
            );
            assert_ne!(got.id, l.id, "re-signed with this clock's expiry");
        }
        assert_eq!(new.active_on(&k("a")), 2, "a stays full");
        // The released id is still dead here.
        assert_eq!(new.admit(&old.released.id, |_| true), Admission::Unknown);
        // team-x's failure report still withholds b from team-x; the
        // sticky key still leads to a (full, so refused, not moved).
        let x = new.acquire(&all, &req("team-x", None, None)).unwrap();
        assert_eq!(x.proxy, k("c"), "b is cooling down for team-x");
        assert!(
            matches!(
                new.acquire(&[k("a")], &req("team-z", Some("session-1"), None)),
                Err(AcquireError::NoCapacity { .. })
            ),
            "a is at capacity"
        );
        // b is blocked for the site, for everyone.
        let site = new
            .acquire(
                &[k("b"), k("c")],
                &req("team-z", None, Some("shop.example")),
            )
            .unwrap();
        assert_eq!(site.proxy, k("c"));
        // Once a lease of `a` ends, its sticky key leads back to it.
        assert!(new.release(&old.held[1].id));
        let sticky = new
            .acquire(&all, &req("team-z", Some("session-1"), None))
            .unwrap();
        assert_eq!(sticky.proxy, k("a"), "the sticky key survived");
        // Renewing a lease the old leader granted works here.
        assert!(new
            .renew(&old.held[0].id, Duration::from_secs(60))
            .is_some());
        // Ends come with time: the cooldowns after their 120 s.
        clock.advance(Duration::from_secs(111));
        assert!(new.get(&old.held[2].id).is_none(), "its 50 s ran out");
        let b = new.acquire(&[k("b")], &req("team-x", None, None)).unwrap();
        assert_eq!(b.proxy, k("b"), "the cooldown ended");
    }
}

#[test]
fn importing_keeps_what_the_store_holds_and_counts_each_lease_once() {
    let clock = at(12);
    let old = old_leader(&clock);
    let new = store(&clock);
    // Presented before the snapshot came: taken in, then not doubled.
    assert!(matches!(
        new.admit(&old.held[0].id, |_| true),
        Admission::Readmitted(_)
    ));
    new.import(&old.store.export()).unwrap();
    assert_eq!(new.active_on(&k("a")), 2);
    assert_eq!(new.active(), 3);
    // Twice changes nothing either.
    new.import(&old.store.export()).unwrap();
    assert_eq!(new.active(), 3);
}

#[test]
fn a_bad_snapshot_changes_nothing() {
    let clock = at(12);
    let old = old_leader(&clock);
    let good = old.store.export();
    let cases = [
        (
            "another version",
            Snapshot {
                v: 3,
                ..good.clone()
            },
            SnapshotError::Version(3),
        ),
        (
            "a lease names no proxy",
            Snapshot {
                proxies: vec![],
                ..good.clone()
            },
            SnapshotError::Inconsistent("an entry names no proxy"),
        ),
        (
            "a lease names no client",
            Snapshot {
                clients: vec![],
                ..good.clone()
            },
            SnapshotError::Inconsistent("an entry names no client"),
        ),
    ];
    for (name, snap, want) in cases {
        let new = store(&clock);
        assert_eq!(new.import(&snap), Err(want), "{name}");
        assert_eq!(new.active(), 0, "{name}: nothing taken in");
        assert_eq!(new.held(), (0, 0), "{name}");
    }
}

#[test]
fn what_has_ended_is_not_handed_over() {
    let clock = at(12);
    let old = old_leader(&clock);
    clock.advance(Duration::from_secs(60));
    let snap = old.store.export();
    assert!(snap.leases.is_empty(), "{snap:?}");
    assert!(snap.released.is_empty(), "{snap:?}");
    assert_eq!(snap.global.len(), 1, "the 120 s cooldown runs on");
    assert_eq!(snap.sticky.len(), 1, "sticky keys outlive their lease");
}

#[test]
fn a_followers_copy_is_the_leaders_table_until_it_takes_over() {
    let clock = at(12);
    let leader = old_leader(&clock);
    let follower = store(&clock);
    // Something the leader no longer has: gone after the copy.
    follower
        .acquire(&[k("z")], &req("team-z", None, None))
        .unwrap();
    let term = follower.term();
    assert_eq!(follower.copied_from(), None);
    assert_eq!(
        follower.replace(&leader.store.export(), term, "n.1"),
        Ok(true)
    );
    assert_eq!(follower.copied_from().as_deref(), Some("n.1"));
    assert_eq!(follower.active(), 3, "the leader's three leases, only");
    assert_eq!(follower.active_on(&k("z")), 0);
    assert_eq!(follower.active_on(&k("a")), 2);
    // Once it took over, a copy asked for before is not applied.
    follower.take_over(None);
    let fresh = store(&clock).export();
    assert_eq!(follower.replace(&fresh, term, "n.1"), Ok(false));
    assert_eq!(follower.active(), 3, "its own table stays");
    assert_eq!(follower.copied_from(), None, "its own table, no copy");
}

#[test]
fn a_leader_still_recovering_passes_its_window_on() {
    let clock = at(12);
    let ttl = Duration::from_secs(30);
    // A leader that took over after a crash: 20 s of window left.
    let leader = store(&clock);
    leader.take_over(Some(clock.now() + chrono::Duration::seconds(20)));
    let snap = leader.export();
    assert_eq!(snap.window, Some(20_000));
    // A follower in sync with it takes over warm: the window stays.
    let follower = store(&clock);
    assert_eq!(follower.replace(&snap, follower.term(), "n.2"), Ok(true));
    follower.take_over_warm();
    let refused = follower.acquire(&[k("a")], &req("team-a", None, None));
    assert!(
        matches!(refused, Err(AcquireError::Recovering { .. })),
        "{refused:?}"
    );
    clock.advance(Duration::from_secs(21));
    follower.published(clock.now() + chrono::Duration::from_std(ttl * 2).unwrap());
    assert!(follower
        .acquire(&[k("a")], &req("team-a", None, None))
        .is_ok());
    // A hand-over brings it too.
    let next = store(&clock);
    leader.take_over(Some(clock.now() + chrono::Duration::seconds(5)));
    next.take_over(None);
    next.import(&leader.export()).unwrap();
    assert!(next.recovering_until().is_some());
}

#[test]
fn a_warm_take_over_with_no_window_grants_at_once() {
    let clock = at(12);
    let leader = old_leader(&clock);
    let follower = store(&clock);
    assert_eq!(
        follower.replace(&leader.store.export(), follower.term(), "n.1"),
        Ok(true)
    );
    follower.take_over_warm();
    assert_eq!(follower.recovering_until(), None);
    assert_eq!(follower.active(), 3, "every copied lease held");
    assert_eq!(follower.copied_from(), None);
    follower.published(clock.now() + chrono::Duration::seconds(600));
    let got = follower.acquire(&[k("c")], &req("team-c", None, None));
    assert!(got.is_ok(), "{got:?}");
}

#[test]
fn clients_own_site_reports_travel_and_a_hand_over_of_the_release_before_is_read() {
    use super::super::wire;
    let clock = at(12);
    let limits = super::super::ClientLimits {
        max_leases: 0,
        global_cooldown_min_clients: 2,
    };
    let two = || store(&clock).with_client_limits(limits);
    let old = two();
    let (x, y) = (Arc::<str>::from("team-x"), Arc::<str>::from("team-y"));
    // b: team-x alone said shop.example bans it; c: team-x and team-y
    // agreed on news.example.
    old.cool_down(&k("b"), &x, Some("shop.example"));
    old.cool_down(&k("c"), &x, Some("news.example"));
    old.cool_down(&k("c"), &y, Some("news.example"));
    let snap = old.export();
    assert_eq!(snap.site_reports.len(), 3, "{snap:?}");
    assert_eq!(snap.sites.len(), 1, "only the agreed site is everyone's");

    let new = two();
    new.import(&wire::decode(&wire::encode(&snap)).unwrap())
        .unwrap();
    let on = |client: &str, p: &str, site: &str| new.lets_gateway_use(client, &k(p), Some(site));
    assert!(!on("team-x", "b", "shop.example"), "team-x's own word");
    assert!(on("team-z", "b", "shop.example"), "not team-z's");
    assert!(!on("team-z", "c", "news.example"), "agreed: everyone's");
    assert_eq!(new.site_reports("team-x"), (3, 2));

    // Version 1, the JSON the release before wrote (a lease of team-y's
    // for a site, the agreed site, no site_reports): read in whole.
    let d = |s: &str| data_encoding::BASE64URL_NOPAD.encode(&super::super::bounds::digest(s));
    let slot = super::super::signed::slot_of(&[5; 16]);
    let v1 = serde_json::json!({
        "v": 1,
        "proxies": [["crawl", "a"], ["crawl", "c"]],
        "leases": [[slot, 0, "team-y", 30_000, 5_000, "shop.example"]],
        "released": [],
        "sticky": [[d("session-1"), 0, 90_000]],
        "global": [[0, "team-x", 60_000]],
        "sites": [[1, d("news.example"), 60_000]],
        "longest": [60_000, 10_000],
    });
    let new = two();
    new.import(&wire::decode(v1.to_string().as_bytes()).unwrap())
        .unwrap();
    let on = |client: &str, p: &str, site: &str| new.lets_gateway_use(client, &k(p), Some(site));
    assert!(!on("team-z", "c", "news.example"));
    assert!(on("team-x", "b", "shop.example"));
    assert_eq!(new.site_reports("team-x"), (0, 0));
    assert_eq!(new.active_on(&k("a")), 1, "the lease is held");
    let back = new.export();
    assert_eq!((back.sticky.len(), back.global.len()), (1, 1));
    assert_eq!(back.clients.len(), 2);
    let bad = v1.to_string().replace("\"v\":1", "\"v\":7");
    assert_eq!(wire::decode(bad.as_bytes()), Err(SnapshotError::Version(7)));
}

#[test]
fn the_table_written_straight_from_the_store_reads_as_its_export() {
    use super::super::wire;
    let clock = at(12);
    let old = old_leader(&clock);
    old.store
        .cool_down(&k("c"), &Arc::from("team-z"), Some("news.example"));
    let want = old.store.export();
    assert!(
        [want.leases.len(), want.released.len(), want.sticky.len()] == [3, 1, 1]
            && !want.global.is_empty()
            && !want.site_reports.is_empty(),
        "every kind of entry: {want:?}"
    );
    let (exported, bytes) = old.store.export_encoded();
    let got = wire::decode(&bytes).unwrap();
    assert_eq!(got, want);
    assert_eq!(bytes, wire::encode(&want), "the same bytes as the value's");
    assert_eq!(
        (exported.version, exported.leases, exported.released),
        (old.store.version(), 3, 1)
    );
    let follower = store(&clock);
    assert!(follower.replace(&got, 0, "f1").unwrap());
    assert_eq!(
        (follower.active(), follower.held()),
        (old.store.active(), old.store.held())
    );
}
