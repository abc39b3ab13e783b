//! The index against a brute-force recomputation: random grants, releases,
//! renewals, reports, clock steps and eligible-set changes, and after each
//! step the indexes equal what the leases say and every choice equals the
//! walk over all candidates the store made before the index.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::TimeZone;

use super::*;
use crate::lease::{
    AcquireRequest, ClientLimits, Clock, FakeClock, LeaseConfig, LeaseStore, Outcome,
};

/// xorshift64*: a fixed sequence per seed, no dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n.max(1)
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

fn key(i: usize) -> ProxyKey {
    ProxyKey {
        namespace: format!("ns{}", i % 3),
        name: format!("p{i:02}"),
    }
}

const UNIVERSE: usize = 24;

fn store(max: u32, limits: ClientLimits) -> (LeaseStore, FakeClock) {
    let clock = FakeClock::at(Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap());
    let cfg = LeaseConfig {
        max_leases_per_proxy: max,
        default_ttl: Duration::from_secs(60),
        max_ttl: Duration::from_secs(3600),
        cooldown: Duration::from_secs(20),
    };
    let s = LeaseStore::with(cfg, Arc::new(clock.clone())).with_client_limits(limits);
    (s, clock)
}

/// A lease's end as the indexes keep it: the second it falls in, rounded
/// up.
fn indexed_end(ms: i64) -> DateTime<Utc> {
    let s = ms / 1000 + i64::from(ms % 1000 > 0);
    DateTime::from_timestamp(s, 0).unwrap()
}

/// The indexes as the leases and proxy states say they must be.
fn check_index(st: &State, step: usize) {
    let mut by_proxy: BTreeMap<&ProxyKey, Vec<DateTime<Utc>>> = BTreeMap::new();
    let mut by_client: BTreeMap<Arc<str>, Vec<DateTime<Utc>>> = BTreeMap::new();
    for l in st.leases.values() {
        let end = indexed_end(l.expires_ms);
        by_proxy.entry(&*l.proxy).or_default().push(end);
        by_client
            .entry(st.clients.name(l.client))
            .or_default()
            .push(end);
    }
    let mut free = BTreeSet::new();
    let mut soonest = BTreeSet::new();
    for (k, p) in &st.proxies {
        let ends = by_proxy.get(&**k).cloned().unwrap_or_default();
        assert_eq!(
            p.active() as usize,
            ends.len(),
            "step {step}: leases on {k}"
        );
        assert_eq!(
            p.ends.first(),
            ends.iter().min().copied(),
            "step {step}: {k}"
        );
        if p.eligible && p.active() < st.max {
            free.insert(((p.active(), p.last_granted), k.clone()));
        }
        if let (true, Some(t)) = (p.eligible, ends.iter().min()) {
            soonest.insert((*t, k.clone()));
        }
    }
    for k in by_proxy.keys() {
        assert!(
            st.proxies.contains_key(*k),
            "step {step}: {k} has leases, no state"
        );
    }
    assert_eq!(st.index.free, free, "step {step}: free index");
    assert_eq!(st.index.soonest, soonest, "step {step}: soonest index");
    let eligible: BTreeSet<&ProxyKey> = st
        .proxies
        .iter()
        .filter(|(_, p)| p.eligible)
        .map(|(k, _)| &**k)
        .collect();
    assert_eq!(
        eligible,
        st.index.eligible.iter().collect(),
        "step {step}: eligible flags"
    );
    let holding: BTreeMap<&str, &Ends> = st.clients.holding().collect();
    assert_eq!(holding.len(), by_client.len(), "step {step}: clients");
    for (c, ends) in &by_client {
        let e = holding[c.as_ref()];
        assert_eq!(e.len() as usize, ends.len(), "step {step}: client {c}");
        assert_eq!(
            e.first(),
            ends.iter().min().copied(),
            "step {step}: client {c}"
        );
    }
}

/// The choice the store made before the index: one pass over every
/// candidate that is eligible.
fn brute_choice(
    st: &State,
    candidates: &[ProxyKey],
    a: &Ask<'_>,
) -> Result<ProxyKey, (usize, usize, usize)> {
    let (mut at_capacity, mut cooling) = (0, 0);
    let mut best: Option<(Rank, &ProxyKey)> = None;
    let mut sticky_open = false;
    for k in candidates {
        let p = st.proxies.get(k).filter(|p| p.eligible);
        let Some(p) = p.filter(|p| p.active() < st.max) else {
            at_capacity += 1;
            continue;
        };
        if st.cooldowns.blocks(k, a.site, a.client, a.now) {
            cooling += 1;
            continue;
        }
        sticky_open |= a.sticky == Some(k);
        let rank = (p.active(), p.last_granted);
        if best.is_none_or(|(r, bk)| (&rank, k) < (&r, bk)) {
            best = Some((rank, k));
        }
    }
    match (a.sticky, best) {
        (Some(k), _) if sticky_open => Ok(k.clone()),
        (_, Some((_, k))) => Ok(k.clone()),
        (_, None) => Err((candidates.len(), at_capacity, cooling)),
    }
}

/// The earliest end of a lease on an eligible candidate.
fn brute_end(st: &State, candidates: &[ProxyKey]) -> Option<DateTime<Utc>> {
    let set: HashSet<&ProxyKey> = candidates.iter().collect();
    st.leases
        .values()
        .filter(|l| set.contains(&*l.proxy))
        .filter(|l| st.proxies.get(&*l.proxy).is_some_and(|p| p.eligible))
        .map(|l| indexed_end(l.expires_ms))
        .min()
}

fn run(seed: u64, steps: usize, max: u32, limits: ClientLimits) {
    let (s, clock) = store(max, limits);
    let mut rng = Rng(seed);
    let mut generation = 0;
    let mut ids: Vec<String> = Vec::new();
    let clients = ["a", "b", "c"];
    for step in 0..steps {
        match rng.below(10) {
            // A new eligible set.
            0 => {
                generation += 1;
                let set: BTreeSet<ProxyKey> =
                    (0..UNIVERSE).filter(|_| rng.chance(70)).map(key).collect();
                s.set_eligible(generation, set.into_iter().collect());
            }
            1 => {
                if !ids.is_empty() {
                    let id = ids.swap_remove(rng.below(ids.len()));
                    s.release(&id);
                }
            }
            2 => clock.advance(Duration::from_secs(rng.below(30) as u64)),
            3 => {
                if !ids.is_empty() {
                    let id = &ids[rng.below(ids.len())];
                    let outcome = [Outcome::Ok, Outcome::Blocked, Outcome::Failed][rng.below(3)];
                    let site = ["x", "y"].get(rng.below(3)).copied();
                    s.report(id, outcome, site);
                }
            }
            4 => {
                if !ids.is_empty() {
                    let id = &ids[rng.below(ids.len())];
                    s.renew(id, Duration::from_secs(1 + rng.below(90) as u64));
                }
            }
            5 => {
                s.sweep();
            }
            _ => {
                let whole = rng.chance(50);
                let st_gen = s.lock().index.generation.unwrap_or(0);
                let eligible = s.lock().index.eligible.clone();
                // Filtered: some eligible, now and then one that is not.
                let picked: Vec<ProxyKey> = if whole {
                    eligible
                } else {
                    let share = [5, 30, 90][rng.below(3)];
                    (0..UNIVERSE)
                        .map(key)
                        .filter(|k| {
                            if eligible.contains(k) {
                                rng.chance(share)
                            } else {
                                rng.chance(5)
                            }
                        })
                        .collect()
                };
                let req = AcquireRequest {
                    ttl: Duration::from_secs(1 + rng.below(90) as u64),
                    sticky_key: ["k1", "k2"].get(rng.below(4)).map(|s| s.to_string()),
                    site: ["x", "y"].get(rng.below(3)).map(|s| s.to_string()),
                    client: Arc::from(clients[rng.below(3)]),
                };
                let listed = Listed(picked.iter().collect());
                let all = Whole {
                    generation: st_gen,
                    len: picked.len(),
                };
                let c: &dyn Candidates = if whole { &all } else { &listed };
                let want = {
                    let mut st = s.lock();
                    st.expire_leases(clock.now());
                    let site = req.site.as_deref().map(super::super::bounds::digest);
                    let sticky = req
                        .sticky_key
                        .as_ref()
                        .and_then(|k| st.sticky.get(k, clock.now()))
                        .cloned();
                    let ask = Ask {
                        sticky: sticky.as_ref(),
                        site: site.as_ref(),
                        client: &req.client,
                        now: clock.now(),
                    };
                    let own = st.clients.held(&req.client);
                    let limited = limits.max_leases > 0 && own >= limits.max_leases;
                    (!picked.is_empty() && !limited).then(|| brute_choice(&st, &picked, &ask))
                };
                let got = s.acquire_among(c, &req);
                match (&want, &got) {
                    (Some(Ok(k)), Ok(l)) => assert_eq!(&l.proxy, k, "step {step}"),
                    (
                        Some(Err((m, cap, cool))),
                        Err(AcquireError::NoCapacity {
                            matching,
                            at_capacity,
                            cooling,
                        }),
                    ) => {
                        assert_eq!(
                            (m, cap, cool),
                            (matching, at_capacity, cooling),
                            "step {step}"
                        );
                        let e = got.as_ref().unwrap_err();
                        let end = brute_end(&s.lock(), &picked);
                        let wait = s.retry_after_among(c, &req.client, e);
                        assert_eq!(
                            wait,
                            super::super::retry::wait_until(clock.now(), end),
                            "step {step}"
                        );
                    }
                    (None, Err(AcquireError::NoProxy | AcquireError::ClientLimit { .. })) => {}
                    _ => panic!("step {step}: brute force {want:?}, index {got:?}"),
                }
                if let Ok(l) = got {
                    ids.push(l.id);
                }
            }
        }
        check_index(&s.lock(), step);
    }
}

#[test]
fn index_equals_brute_force_over_random_steps() {
    struct Case {
        name: &'static str,
        max: u32,
        max_own: u32,
        quorum: usize,
    }
    let cases = [
        Case {
            name: "one lease per proxy",
            max: 1,
            max_own: 0,
            quorum: 1,
        },
        Case {
            name: "three per proxy, client cap",
            max: 3,
            max_own: 6,
            quorum: 2,
        },
        Case {
            name: "leasing off",
            max: 0,
            max_own: 0,
            quorum: 1,
        },
    ];
    for c in cases {
        for seed in 1..=20 {
            let limits = ClientLimits {
                max_leases: c.max_own,
                global_cooldown_min_clients: c.quorum,
            };
            let r = std::panic::catch_unwind(|| run(seed * 7919, 400, c.max, limits));
            assert!(r.is_ok(), "{}: seed {seed}", c.name);
        }
    }
}

#[test]
fn an_older_eligible_set_is_ignored() {
    let (s, _) = store(1, ClientLimits::default());
    s.set_eligible(2, vec![key(1), key(2)]);
    s.set_eligible(1, vec![key(3)]);
    let st = s.lock();
    assert_eq!(st.index.eligible, vec![key(1), key(2)]);
    assert_eq!(st.index.free.len(), 2);
}

#[test]
fn a_proxy_leaving_the_eligible_set_leaves_the_indexes_and_keeps_its_leases() {
    let (s, _) = store(2, ClientLimits::default());
    s.set_eligible(1, vec![key(1), key(2)]);
    let req = AcquireRequest {
        ttl: Duration::from_secs(60),
        ..Default::default()
    };
    let all = Whole {
        generation: 1,
        len: 2,
    };
    let first = s.acquire_among(&all, &req).unwrap();
    s.set_eligible(2, vec![key(2)]);
    {
        let st = s.lock();
        assert!(st.index.free.iter().all(|(_, k)| **k == key(2)));
        assert!(st.index.soonest.is_empty());
        assert_eq!(st.proxies[&first.proxy].active(), 1);
    }
    let all = Whole {
        generation: 2,
        len: 1,
    };
    assert_eq!(s.acquire_among(&all, &req).unwrap().proxy, key(2));
    // Back in: its lease counts again.
    s.set_eligible(3, vec![key(1), key(2)]);
    check_index(&s.lock(), 0);
    assert_eq!(s.lock().index.soonest.len(), 2);
}
