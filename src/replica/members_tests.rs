use super::*;

fn key(n: u8) -> LeaseKey {
    LeaseKey::from_bytes(&[n; crate::lease::signed::KEY_LEN]).unwrap()
}

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_follower_is_named_only_once_it_holds_the_table_it_was_first_waited_for_at() {
    let t0 = Instant::now();
    let mut m = Members::new("f.1");
    m.saw("b", None, t0);
    assert!(
        m.plan(10, t0).is_empty(),
        "no copy of this feed: not waited for"
    );
    assert!(m.lagging(11).is_empty());
    m.saw("b", Some(7), t0);
    assert!(
        m.plan(10, t0).is_empty(),
        "waited for from version 10, holds 7: not named yet"
    );
    assert_eq!(
        m.lagging(11),
        vec!["b".to_string()],
        "grants now wait for it"
    );
    m.saw("b", Some(12), t0);
    assert!(m.lagging(11).is_empty());
    assert_eq!(m.plan(13, t0), set(&["b"]), "holds 12 >= 10: named");
    let (joined, gone) = m.written(&set(&["b"]));
    assert_eq!((joined, gone), (vec!["b".to_string()], vec![]));
}

#[test]
fn a_dropped_follower_is_waited_for_until_a_write_leaves_it_out() {
    let t0 = Instant::now();
    let mut m = Members::new("f.1");
    m.saw("b", Some(5), t0);
    m.saw("c", Some(5), t0);
    assert_eq!(m.plan(5, t0), set(&["b", "c"]));
    m.written(&set(&["b", "c"]));
    assert_eq!(m.drop_members(&["c".to_string()]), 1);
    assert_eq!(m.drop_members(&["c".to_string()]), 0, "marked once");
    assert_eq!(
        m.lagging(6),
        vec!["b".to_string(), "c".to_string()],
        "still named on the Lease: still waited for"
    );
    // A write planned before the drop named it: it stays.
    let (_, gone) = m.written(&set(&["b", "c"]));
    assert!(gone.is_empty());
    assert_eq!(m.plan(6, t0), set(&["b"]));
    let (_, gone) = m.written(&set(&["b"]));
    assert_eq!(gone, vec!["c".to_string()]);
    m.saw("b", Some(6), t0);
    assert!(m.lagging(6).is_empty(), "c is no longer waited for");
    // It asks again at once: not waited for again until REJOIN_AFTER.
    let now = Instant::now();
    m.saw("c", Some(6), now);
    assert_eq!(m.plan(6, now), set(&["b"]));
    assert!(
        m.lagging(7).iter().all(|w| w != "c"),
        "c still not waited for"
    );
    let later = now + REJOIN_AFTER;
    m.saw("b", Some(6), later);
    m.saw("c", Some(6), later);
    m.plan(6, later);
    assert_eq!(
        m.plan(6, later),
        set(&["b", "c"]),
        "back after REJOIN_AFTER"
    );
}

#[test]
fn a_silent_follower_is_dropped_at_the_next_write_and_forgotten_later() {
    let t0 = Instant::now();
    let mut m = Members::new("f.1");
    m.saw("b", Some(1), t0);
    assert_eq!(m.plan(1, t0), set(&["b"]));
    m.written(&set(&["b"]));
    let later = t0 + STALE;
    assert!(m.plan(1, later).is_empty(), "silent for STALE");
    let (_, gone) = m.written(&BTreeSet::new());
    assert_eq!(gone, vec!["b".to_string()]);
    assert!(m.plan(1, t0 + STALE * 10).is_empty());
    assert!(m.seen.is_empty(), "forgotten");
}

#[test]
fn only_a_sealed_set_naming_this_follower_for_its_copy_is_in_sync() {
    let named = set(&["a_1", "b_2"]);
    let read = annotations(&key(1), "n.3", &named);
    assert!(in_sync(&read, &key(1), "b_2", Some("n.3")));
    assert!(!in_sync(&read, &key(1), "c_9", Some("n.3")), "not named");
    assert!(
        !in_sync(&read, &key(1), "b_2", Some("n.2")),
        "a copy of another term"
    );
    assert!(!in_sync(&read, &key(1), "b_2", None), "no copy");
    assert!(
        !in_sync(&read, &key(2), "b_2", Some("n.3")),
        "another installation's key"
    );
    let mut forged = read.clone();
    forged.insert(SYNCED_ANNOTATION.to_string(), "n.3 b_2,x".to_string());
    assert!(
        !in_sync(&forged, &key(1), "b_2", Some("n.3")),
        "forged value"
    );
    let empty = annotations(&key(1), "n.3", &BTreeSet::new());
    assert!(!in_sync(&empty, &key(1), "b_2", Some("n.3")));
    assert!(!in_sync(&BTreeMap::new(), &key(1), "b_2", Some("n.3")));
}
