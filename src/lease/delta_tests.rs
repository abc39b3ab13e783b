use std::time::Duration;

use chrono::{TimeZone, Utc};

use super::super::snapshot::tests::{k, store};
use super::super::{AcquireRequest, FakeClock, Outcome};
use super::*;

fn req(client: &str, sticky: Option<&str>, site: Option<&str>, ttl: u64) -> AcquireRequest {
    AcquireRequest {
        ttl: Duration::from_secs(ttl),
        client: client.into(),
        sticky_key: sticky.map(String::from),
        site: site.map(String::from),
    }
}

/// A snapshot as a sorted list of lines, proxies by name: two tables
/// are the same when these are.
fn canon(s: &Snapshot) -> Vec<String> {
    let p = |i: &u32| format!("{:?}", s.proxies[*i as usize]);
    let mut out: Vec<String> = Vec::new();
    let c = |i: &u32| &s.clients[*i as usize];
    out.extend(s.leases.iter().map(|(slot, i, who, left, age)| {
        format!("lease {slot:?} {} {} {left} {age}", p(i), c(who))
    }));
    out.extend(
        s.released
            .iter()
            .map(|(slot, l)| format!("released {slot:?} {l}")),
    );
    out.extend(
        s.sticky
            .iter()
            .map(|(d, i, l)| format!("sticky {d:?} {} {l}", p(i))),
    );
    out.extend(
        s.global
            .iter()
            .map(|(i, who, l)| format!("global {} {} {l}", p(i), c(who))),
    );
    out.extend(
        s.sites
            .iter()
            .map(|(i, d, l)| format!("site {} {d:?} {l}", p(i))),
    );
    out.extend(
        s.site_reports
            .iter()
            .map(|(i, d, who, l)| format!("report {} {d:?} {} {l}", p(i), c(who))),
    );
    out.push(format!("longest {:?} window {:?}", s.longest, s.window));
    out.sort();
    out
}

/// A leader and a follower holding its whole table under feed "f1".
fn pair(clock: &FakeClock) -> (LeaseStore, LeaseStore, u64) {
    let (leader, follower) = (store(clock), store(clock));
    leader
        .acquire(&[k("a")], &req("team-x", None, None, 60))
        .unwrap();
    let (v, whole) = leader.export_versioned();
    assert!(follower.replace(&whole, follower.term(), "f1").unwrap());
    (leader, follower, v)
}

/// One step of the leader's, and a follower taking the delta after it.
type Step = (&'static str, fn(&LeaseStore, &FakeClock, &mut Vec<String>));

#[test]
fn a_follower_taking_each_delta_holds_the_leaders_table() {
    let steps: [Step; 12] = [
        ("a grant under a sticky key and a site", |l, _, ids| {
            let r = req("team-x", Some("s1"), Some("shop.example"), 300);
            ids.push(l.acquire(&[k("a")], &r).unwrap().id);
        }),
        ("a grant on another proxy", |l, _, ids| {
            ids.push(
                l.acquire(&[k("b")], &req("team-y", None, None, 60))
                    .unwrap()
                    .id,
            );
        }),
        ("a renewal", |l, _, ids| {
            ids[0] = l.renew(&ids[0], Duration::from_secs(500)).unwrap().id;
        }),
        ("a release", |l, _, ids| assert!(l.release(&ids[1]))),
        ("a failed report: a global cooldown", |l, _, ids| {
            l.report(&ids[0], Outcome::Failed, None).unwrap();
        }),
        ("a blocked report: a site cooldown", |l, _, ids| {
            l.report(&ids[0], Outcome::Blocked, Some("shop.example"))
                .unwrap();
        }),
        ("the sticky key moves to another proxy", |l, _, ids| {
            let r = req("team-x", Some("s1"), None, 60);
            ids.push(l.acquire(&[k("c")], &r).unwrap().id);
        }),
        ("a gateway's cooldown", |l, _, _| {
            l.cool_down(&k("c"), &Arc::from("gw"), Some("news.example"));
        }),
        ("time passes: the first leases end on both", |_, c, _| {
            c.advance(Duration::from_secs(90));
        }),
        ("a renewal that shortens the lease", |l, _, ids| {
            ids[0] = l.renew(&ids[0], Duration::from_secs(40)).unwrap().id;
        }),
        (
            "a shortening renewal, and its end, between two asks",
            |l, c, ids| {
                ids[0] = l.renew(&ids[0], Duration::from_secs(5)).unwrap().id;
                c.advance(Duration::from_secs(10));
            },
        ),
        ("a grant and its release between two asks", |l, _, _| {
            let id = l
                .acquire(&[k("d")], &req("team-z", None, None, 60))
                .unwrap()
                .id;
            assert!(l.release(&id));
        }),
    ];
    let clock = FakeClock::at(Utc.with_ymd_and_hms(2026, 12, 7, 9, 0, 0).unwrap());
    let (leader, follower, mut v) = pair(&clock);
    let mut ids = Vec::new();
    for (what, step) in steps {
        step(&leader, &clock, &mut ids);
        let (next, delta) = leader.export_since(v).expect("the log covers the copy");
        assert!(next >= v, "{what}");
        assert!(
            follower.patch(&delta, follower.term(), "f1").unwrap(),
            "{what}"
        );
        v = next;
        assert_eq!(
            canon(&follower.export()),
            canon(&leader.export()),
            "after {what}"
        );
    }
    // Nothing changed since: an empty delta.
    let (same, empty) = leader.export_since(v).unwrap();
    assert_eq!((same, empty.leases.len(), empty.released.len()), (v, 0, 0));
}

#[test]
fn a_delta_carries_only_what_changed() {
    let clock = FakeClock::at(Utc.with_ymd_and_hms(2026, 12, 7, 9, 0, 0).unwrap());
    let leader = store(&clock);
    let proxies: Vec<ProxyKey> = (0..500).map(|i| k(&format!("p{i}"))).collect();
    let mut ids = Vec::new();
    for _ in 0..1_000 {
        ids.push(
            leader
                .acquire(&proxies, &req("team-x", None, None, 60))
                .unwrap()
                .id,
        );
    }
    let v = leader.version();
    assert!(leader.release(&ids[7]));
    let (next, delta) = leader.export_since(v).unwrap();
    assert_eq!(next, v + 1);
    assert_eq!(
        (delta.leases.len(), delta.released.len(), delta.ended.len()),
        (0, 1, 0),
        "one release is one entry, not the 999 leases held"
    );
    assert_eq!(leader.export().leases.len(), 999);
}

#[test]
fn only_a_version_the_log_covers_gets_a_delta() {
    let clock = FakeClock::at(Utc.with_ymd_and_hms(2026, 12, 7, 9, 0, 0).unwrap());
    let (leader, _, v) = pair(&clock);
    assert!(leader.export_since(v).is_some());
    assert!(
        leader.export_since(v + 1).is_none(),
        "a version never reached"
    );
    // A table taken in whole (a hand-over) is a change the log cannot name.
    let other = store(&clock);
    other
        .acquire(&[k("z")], &req("team-q", None, None, 60))
        .unwrap();
    leader.import(&other.export()).unwrap();
    assert!(leader.export_since(v).is_none(), "behind a whole import");
    assert!(leader.export_since(leader.version()).is_some());
}

#[test]
fn a_delta_for_another_copy_or_after_a_take_over_is_not_taken() {
    let clock = FakeClock::at(Utc.with_ymd_and_hms(2026, 12, 7, 9, 0, 0).unwrap());
    let (leader, follower, v) = pair(&clock);
    leader
        .acquire(&[k("b")], &req("team-y", None, None, 60))
        .unwrap();
    let (_, delta) = leader.export_since(v).unwrap();
    let before = canon(&follower.export());
    assert!(
        !follower.patch(&delta, follower.term(), "f2").unwrap(),
        "another feed"
    );
    assert!(
        !follower.patch(&delta, follower.term() + 1, "f1").unwrap(),
        "a take-over"
    );
    assert_eq!(canon(&follower.export()), before, "nothing taken");
    // The negative control: the same delta is taken for the right copy.
    assert!(follower.patch(&delta, follower.term(), "f1").unwrap());
    assert_ne!(canon(&follower.export()), before);
}

#[test]
fn what_a_delta_says_the_leader_holds_no_more_goes_from_the_copy() {
    let clock = FakeClock::at(Utc.with_ymd_and_hms(2026, 12, 7, 9, 0, 0).unwrap());
    let (leader, follower, v) = pair(&clock);
    let id = leader
        .acquire(&[k("b")], &req("team-y", Some("s1"), None, 60))
        .unwrap()
        .id;
    leader.report(&id, Outcome::Failed, None).unwrap();
    let (_, delta) = leader.export_since(v).unwrap();
    assert!(follower.patch(&delta, follower.term(), "f1").unwrap());
    let held = follower.export();
    assert_eq!(
        (held.leases.len(), held.sticky.len(), held.global.len()),
        (2, 1, 1)
    );
    // The leader dropped all three (a cap evicted them, or they ended on
    // its clock first): a delta saying so.
    let b = held.proxies.iter().position(|(_, n)| n == "b").unwrap();
    let gone = Snapshot {
        v: SNAPSHOT_VERSION,
        proxies: held.proxies.clone(),
        unstuck: held.sticky.iter().map(|(d, _, _)| *d).collect(),
        cooled: vec![u32::try_from(b).unwrap()],
        ..Default::default()
    };
    let slot = held
        .leases
        .iter()
        .find(|l| held.proxies[l.1 as usize].1 == "b")
        .map(|l| l.0)
        .unwrap();
    let gone = Snapshot {
        ended: vec![slot],
        ..gone
    };
    assert!(follower.patch(&gone, follower.term(), "f1").unwrap());
    let left = follower.export();
    assert_eq!(
        (left.leases.len(), left.sticky.len(), left.global.len()),
        (1, 0, 0),
        "{left:?}"
    );
}

/// Review of issue 52: a member far behind is answered in chunks, the
/// lock let go between them; what changes meanwhile is in the answer or
/// the next one, and the copy ends equal to the leader's table.
#[test]
fn a_long_walk_lets_the_lock_go_between_chunks_and_misses_nothing() {
    let clock = FakeClock::at(Utc.with_ymd_and_hms(2026, 12, 7, 9, 0, 0).unwrap());
    let (leader, follower, v) = pair(&clock);
    let proxies: Vec<ProxyKey> = (0..500).map(|i| k(&format!("p{i}"))).collect();
    let mut ids = Vec::new();
    for i in 0..400 {
        let r = req("team-x", Some(&format!("s{}", i % 30)), None, 60);
        ids.push(leader.acquire(&proxies, &r).unwrap().id);
        if i % 3 == 2 {
            assert!(leader.release(&ids[i - 1]));
        }
    }
    let behind = leader.version() - v;
    let mut pauses = 0;
    let (next, delta) = leader
        .export_since_in(v, 64, || {
            // A grant, a release and a sticky move while no lock is held.
            pauses += 1;
            let r = req("team-y", Some("s1"), None, 30);
            let id = leader.acquire(&proxies, &r).unwrap().id;
            if pauses % 2 == 0 {
                assert!(leader.release(&id));
            }
        })
        .unwrap();
    assert!(
        pauses >= behind as usize / 64 - 1,
        "{pauses} pauses for {behind} entries"
    );
    assert!(follower.patch(&delta, follower.term(), "f1").unwrap());
    let (_, rest) = leader.export_since(next).unwrap();
    assert!(follower.patch(&rest, follower.term(), "f1").unwrap());
    assert_eq!(canon(&follower.export()), canon(&leader.export()));
    // The same walk in one lock answers the same table.
    let one = store(&clock);
    let (_, whole) = leader.export_versioned();
    assert!(one.replace(&whole, one.term(), "f1").unwrap());
    assert_eq!(canon(&one.export()), canon(&follower.export()));
}
