#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::collections::HashMap;

use super::*;

fn proxies(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("crawl/proxy-{i}")).collect()
}

/// [`rendezvous`] with `usable` asked alike of one and of all.
fn rv(session: u64, set: &[String], usable: impl Fn(&String) -> bool + Copy) -> Option<usize> {
    let all = |cs: &[String]| cs.iter().map(usable).collect();
    rendezvous(session, set, |p| stable_hash(&[p]), usable, all)
}

/// [`two_choices`] over `set` with `usable` asked alike of one and of all.
fn tc(
    set: &[String],
    draw: impl FnMut(usize) -> usize,
    load: impl Fn(&String) -> u32,
    usable: impl Fn(&String) -> bool + Copy,
) -> Option<usize> {
    let all = || set.iter().map(usable).collect();
    two_choices((set.len(), |i| &set[i]), draw, load, (usable, all))
}

fn pick(session: &str, set: &[String]) -> String {
    let s = stable_hash(&["client", session]);
    set[rv(s, set, |_| true).unwrap()].clone()
}

#[test]
fn the_stable_hash_is_fixed_across_builds() {
    // Replicas of different builds must agree: these values are the
    // contract, not an accident of this build.
    let got = [
        stable_hash(&[]),
        upstream_hash(&crate::lease::ProxyKey {
            namespace: "crawl".into(),
            name: "proxy-0".into(),
        }),
        weight(
            stable_hash(&["crawler-a", "s81"]),
            stable_hash(&["crawl/proxy-0"]),
        ),
    ];
    assert_eq!(
        got,
        [
            0xf52a_15e9_a9b5_e89b,
            0x86b0_f57b_2acf_25bc,
            0x7f4b_7658_c11f_497d
        ],
        "{got:#x?}"
    );
}

#[test]
fn a_session_keeps_its_proxy_and_only_a_leaving_proxys_sessions_move() {
    let all = proxies(10);
    let sessions: Vec<String> = (0..1000).map(|i| format!("s{i}")).collect();
    let before: HashMap<&String, String> = sessions.iter().map(|s| (s, pick(s, &all))).collect();
    // Asked again, in another order of candidates: the same answers.
    let mut shuffled = all.clone();
    shuffled.reverse();
    for s in &sessions {
        assert_eq!(pick(s, &shuffled), before[s], "{s}");
    }
    // Spread over all ten, none with more than twice its share.
    let mut per: HashMap<&String, usize> = HashMap::new();
    for p in before.values() {
        *per.entry(p).or_default() += 1;
    }
    assert_eq!(per.len(), 10);
    assert!(per.values().all(|&n| n < 200), "{per:?}");
    // proxy-3 leaves: its sessions move, no other does.
    let gone = "crawl/proxy-3".to_string();
    let rest: Vec<String> = all.iter().filter(|p| **p != gone).cloned().collect();
    for s in &sessions {
        let now = pick(s, &rest);
        if before[s] == gone {
            assert_ne!(now, gone);
        } else {
            assert_eq!(now, before[s], "{s} moved though its proxy stayed");
        }
    }
    // An unusable winner is passed over for the next by weight, which is
    // where the session goes once the winner leaves.
    for s in sessions.iter().filter(|s| before[*s] == gone) {
        let h = stable_hash(&["client", s]);
        let i = rv(h, &all, |p| *p != gone).unwrap();
        assert_eq!(all[i], pick(s, &rest));
    }
}

#[test]
fn rendezvous_with_nothing_usable_is_none() {
    assert_eq!(rv(1, &proxies(3), |_| false), None);
    assert_eq!(rv(1, &[], |_| true), None);
}

#[test]
fn two_choices_takes_the_less_loaded_and_never_misses_a_usable_one() {
    let set = proxies(4);
    let load = |p: &String| if p.ends_with('1') { 0 } else { 5 };
    // Draws 0 then 1: proxy-1 is less loaded.
    let mut draws = [0, 1].into_iter().cycle();
    let got = tc(&set, |_| draws.next().unwrap(), load, |_| true);
    assert_eq!(got, Some(1));
    // Draws 2 then 3, equal load: the first.
    let mut draws = [2, 3].into_iter().cycle();
    assert_eq!(tc(&set, |_| draws.next().unwrap(), load, |_| true), Some(2));
    // Only proxy-3 usable, the draws never land on it: found anyway.
    let only3 = |p: &String| p.ends_with('3');
    assert_eq!(tc(&set, |_| 0, load, only3), Some(3));
    assert_eq!(tc(&set, |_| 0, load, |_| false), None);
    assert_eq!(tc(&[], |_| 0, load, |_| true), None);
}

#[test]
fn rotation_spreads_connections_over_every_proxy() {
    let set = proxies(3);
    let mut loads = [0u32; 3];
    let mut seed = 7u64;
    for _ in 0..30 {
        let i = tc(
            &set,
            |n| {
                seed = stable_hash(&[&seed.to_string()]);
                (seed % n as u64) as usize
            },
            |p| loads[set.iter().position(|q| q == p).unwrap()],
            |_| true,
        )
        .unwrap();
        loads[i] += 1;
    }
    assert!(loads.iter().all(|&l| l >= 5), "{loads:?}");
}

/// With 10,000 candidates and only the last usable, a choice asks a few
/// alone and then all of them once: no look per candidate (each look is
/// a lock of the lease store), no quadratic walk.
#[test]
fn a_full_fleet_is_asked_once_not_once_per_candidate() {
    use std::cell::Cell;
    let set = proxies(10_000);
    let last = set.len() - 1;
    let (ones, alls) = (Cell::new(0), Cell::new(0));
    let one = |p: &String| {
        ones.set(ones.get() + 1);
        *p == set[last]
    };
    let all = |cs: &[String]| {
        alls.set(alls.get() + 1);
        cs.iter().map(|p| *p == set[last]).collect()
    };
    assert_eq!(
        rendezvous(5, &set, |p| stable_hash(&[p]), one, all),
        Some(last)
    );
    assert!(ones.get() == 1 && alls.get() == 1, "{ones:?} {alls:?}");

    let (ones, alls) = (Cell::new(0), Cell::new(0));
    let one = |p: &String| {
        ones.set(ones.get() + 1);
        *p == set[last]
    };
    let all = || {
        alls.set(alls.get() + 1);
        set.iter().map(|p| *p == set[last]).collect()
    };
    let got = two_choices((set.len(), |i| &set[i]), |_| 0, |_| 0, (one, all));
    assert_eq!(got, Some(last));
    assert!(
        ones.get() <= 2 * DRAWS && alls.get() == 1,
        "{ones:?} {alls:?}"
    );
}
