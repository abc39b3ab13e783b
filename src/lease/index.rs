//! The lease index: what an acquire needs without walking every proxy or
//! lease (docs/architecture.md, "The lease index"). The eligible proxies
//! with room are kept in fairness order, the eligible proxies holding
//! leases by their earliest lease end, and every proxy's and client's
//! lease ends as a small ordered multiset; each is updated in O(log n)
//! when a lease starts or ends and when the eligible set changes.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::bounds::KeyDigest;
use super::state::State;
use super::{AcquireError, ProxyKey};

/// A proxy's place in the fairness order: fewest active leases, then least
/// recently granted (never granted first: `None` sorts first), then
/// namespace/name.
pub(super) type Rank = (u32, Option<(DateTime<Utc>, u64)>);

/// When the candidates of a filtered request are fewer than the index
/// divided by this, they are ranked one by one (O(candidates)) instead of
/// walking the index from the best rank skipping the others, which would
/// skip about this many entries per candidate.
const WALK_RATIO: usize = 8;

/// The proxies an acquire may choose from: every proxy of one listing of
/// the eligible set, or those of it that match a filter.
pub trait Candidates {
    /// How many.
    fn len(&self) -> usize;
    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// `Some(g)`: these are all the eligible proxies of the listing told to
    /// the store with generation `g` ([`super::LeaseStore::set_eligible`]);
    /// when the store holds that generation no membership is checked.
    fn whole(&self) -> Option<u64>;
    /// Whether `key` is one of them.
    fn contains(&self, key: &ProxyKey) -> bool;
    /// All of them (walked only when they are few).
    fn keys(&self) -> Box<dyn Iterator<Item = &ProxyKey> + '_>;
}

/// Every eligible proxy of one generation: what a caller that passes the
/// eligible set itself chooses from.
pub(super) struct Whole {
    pub(super) generation: u64,
    pub(super) len: usize,
}

impl Candidates for Whole {
    fn len(&self) -> usize {
        self.len
    }
    fn whole(&self) -> Option<u64> {
        Some(self.generation)
    }
    fn contains(&self, _: &ProxyKey) -> bool {
        // Asked only when the store holds another generation, which a
        // caller holding the store's lock from telling it to asking cannot
        // see: then nothing counts as a member.
        false
    }
    fn keys(&self) -> Box<dyn Iterator<Item = &ProxyKey> + '_> {
        Box::new(std::iter::empty())
    }
}

/// Candidates given as a slice.
pub(super) struct Listed<'a>(pub(super) HashSet<&'a ProxyKey>);

impl Candidates for Listed<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn whole(&self) -> Option<u64> {
        None
    }
    fn contains(&self, key: &ProxyKey) -> bool {
        self.0.contains(key)
    }
    fn keys(&self) -> Box<dyn Iterator<Item = &ProxyKey> + '_> {
        Box::new(self.0.iter().copied())
    }
}

/// `keys` sorted, without repeats (the form of an eligible set).
pub(super) fn sorted_keys<K: std::borrow::Borrow<ProxyKey>>(keys: &[K]) -> Vec<ProxyKey> {
    let mut v: Vec<ProxyKey> = keys.iter().map(|k| k.borrow().clone()).collect();
    v.sort();
    v.dedup();
    v
}

/// Lease ends as an ordered multiset, by the second (rounded up: what
/// they answer, a retry time or the end of a drain, is never early): how
/// many, and the earliest and latest, in O(log n). Leases ending in the
/// same second share an entry, so a client holding 100,000 leases costs
/// an entry per second of their ends, not per lease.
#[derive(Debug, Default)]
pub(super) struct Ends {
    at: BTreeMap<i64, u32>,
    len: u32,
}

/// The second `ms` falls in, rounded up.
pub(super) fn ceil_second(ms: i64) -> i64 {
    -(-ms).div_euclid(1000)
}

impl Ends {
    /// Counts an end, in milliseconds since the epoch.
    pub(super) fn add(&mut self, end_ms: i64) {
        *self.at.entry(ceil_second(end_ms)).or_default() += 1;
        self.len = self.len.saturating_add(1);
    }

    /// Uncounts an end counted by [`Ends::add`].
    pub(super) fn remove(&mut self, end_ms: i64) {
        let s = ceil_second(end_ms);
        if let Some(n) = self.at.get_mut(&s) {
            *n -= 1;
            if *n == 0 {
                self.at.remove(&s);
            }
            self.len = self.len.saturating_sub(1);
        }
    }

    /// How many.
    pub(super) fn len(&self) -> u32 {
        self.len
    }

    /// The earliest.
    pub(super) fn first(&self) -> Option<DateTime<Utc>> {
        self.at.keys().next().map(|s| at_second(*s))
    }

    /// The latest.
    pub(super) fn last(&self) -> Option<DateTime<Utc>> {
        self.at.keys().next_back().map(|s| at_second(*s))
    }
}

fn at_second(s: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(s, 0).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// What the store knows of one proxy.
#[derive(Debug, Default)]
pub(super) struct ProxyState {
    pub(super) last_granted: Option<(DateTime<Utc>, u64)>,
    /// In the eligible set last told.
    pub(super) eligible: bool,
    /// Its live leases' ends.
    pub(super) ends: Ends,
}

impl ProxyState {
    /// Live leases on it.
    pub(super) fn active(&self) -> u32 {
        self.ends.len()
    }

    fn rank(&self) -> Rank {
        (self.active(), self.last_granted)
    }

    /// Its entries in the two indexes.
    fn entries(&self, max: u32) -> (Option<Rank>, Option<DateTime<Utc>>) {
        if !self.eligible {
            return (None, None);
        }
        let free = (self.active() < max).then(|| self.rank());
        (free, self.ends.first())
    }
}

/// The indexes over the eligible set.
#[derive(Debug, Default)]
pub(super) struct Index {
    /// Eligible proxies with room, best first.
    pub(super) free: BTreeSet<(Rank, Arc<ProxyKey>)>,
    /// Eligible proxies holding leases, by their earliest lease end.
    pub(super) soonest: BTreeSet<(DateTime<Utc>, Arc<ProxyKey>)>,
    /// The eligible set last told, sorted.
    eligible: Vec<ProxyKey>,
    /// Its generation.
    pub(super) generation: Option<u64>,
}

/// What a choice is made with besides the candidates.
pub(super) struct Ask<'a> {
    pub(super) sticky: Option<&'a ProxyKey>,
    pub(super) site: Option<&'a KeyDigest>,
    pub(super) client: &'a str,
    pub(super) now: DateTime<Utc>,
}

impl State {
    /// Changes `key`'s state with `f`, keeping the indexes in step
    /// (O(log n)). Creates the state when missing.
    pub(super) fn update_proxy(&mut self, key: &ProxyKey, f: impl FnOnce(&mut ProxyState)) {
        let max = self.max;
        // The index holds the state's own pointer: no key is copied.
        let key = self.proxy(key);
        let Some(p) = self.proxies.get_mut(&*key) else {
            return; // made by `proxy` just above
        };
        let before = p.entries(max);
        f(p);
        let after = p.entries(max);
        let idx = &mut self.index;
        if before.0 != after.0 {
            if let Some(r) = before.0 {
                idx.free.remove(&(r, key.clone()));
            }
            if let Some(r) = after.0 {
                idx.free.insert((r, key.clone()));
            }
        }
        if before.1 != after.1 {
            if let Some(t) = before.1 {
                idx.soonest.remove(&(t, key.clone()));
            }
            if let Some(t) = after.1 {
                idx.soonest.insert((t, key.clone()));
            }
        }
    }

    /// Makes `sorted` (sorted, without repeats) the eligible set, of
    /// `generation`: O(n) over both sets, O(log n) per proxy that joins or
    /// leaves. An older generation than the one held is ignored.
    pub(super) fn set_eligible(&mut self, generation: u64, sorted: Vec<ProxyKey>) -> Vec<ProxyKey> {
        if self.index.generation.is_some_and(|g| g > generation) {
            return sorted;
        }
        let old = std::mem::take(&mut self.index.eligible);
        let (mut i, mut j) = (0, 0);
        while i < old.len() || j < sorted.len() {
            let ord = match (old.get(i), sorted.get(j)) {
                (Some(a), Some(b)) => a.cmp(b),
                (Some(_), None) => Ordering::Less,
                _ => Ordering::Greater,
            };
            match ord {
                Ordering::Less => {
                    self.update_proxy(&old[i], |p| p.eligible = false);
                    i += 1;
                }
                Ordering::Greater => {
                    self.update_proxy(&sorted[j], |p| p.eligible = true);
                    j += 1;
                }
                Ordering::Equal => {
                    i += 1;
                    j += 1;
                }
            }
        }
        self.index.eligible = sorted;
        self.index.generation = Some(generation);
        old
    }

    /// The generation of the eligible set held.
    pub(super) fn eligible_generation(&self) -> Option<u64> {
        self.index.generation
    }

    /// The next generation of the store's own (a caller that passes the
    /// eligible proxies itself).
    pub(super) fn next_generation(&self) -> u64 {
        self.index.generation.map_or(1, |g| g.saturating_add(1))
    }

    fn whole(&self, c: &dyn Candidates) -> bool {
        c.whole().is_some() && c.whole() == self.index.generation
    }

    /// Whether `key` is withheld from the asker by a cooldown.
    fn cooling(&self, key: &ProxyKey, a: &Ask<'_>) -> bool {
        !self.cooldowns.is_empty() && self.cooldowns.blocks(key, a.site, a.client, a.now)
    }

    /// The proxy to grant among `c`: the sticky one while it is eligible,
    /// has room and is not cooling down; else the first in fairness order
    /// that is a candidate and not cooling down. O(log n) plus the entries
    /// skipped (non-candidates, cooling), or O(candidates) when they are
    /// few; never a walk over every proxy or lease.
    pub(super) fn choose(
        &self,
        c: &dyn Candidates,
        a: &Ask<'_>,
    ) -> Result<Arc<ProxyKey>, AcquireError> {
        let whole = self.whole(c);
        let member = |k: &ProxyKey| whole || c.contains(k);
        if let Some(k) = a.sticky {
            let room = self
                .proxies
                .get_key_value(k)
                .filter(|(_, p)| p.eligible && p.active() < self.max);
            if let Some((k, _)) = room.filter(|(k, _)| member(k) && !self.cooling(k, a)) {
                return Ok(k.clone());
            }
        }
        if !whole && c.len().saturating_mul(WALK_RATIO) < self.index.free.len() {
            return self.choose_among(c, a);
        }
        let mut open = 0;
        for (_, k) in &self.index.free {
            if !member(k) {
                continue;
            }
            if !self.cooling(k, a) {
                return Ok(k.clone());
            }
            open += 1;
        }
        // Refused: every candidate with room is cooling down; the others
        // are at capacity.
        Err(AcquireError::NoCapacity {
            matching: c.len(),
            at_capacity: c.len().saturating_sub(open),
            cooling: open,
        })
    }

    /// [`State::choose`] for few candidates: each one ranked.
    fn choose_among(&self, c: &dyn Candidates, a: &Ask<'_>) -> Result<Arc<ProxyKey>, AcquireError> {
        let (mut at_capacity, mut cooling) = (0, 0);
        let mut best: Option<(Rank, &Arc<ProxyKey>)> = None;
        for k in c.keys() {
            let Some((k, p)) = self
                .proxies
                .get_key_value(k)
                .filter(|(_, p)| p.eligible && p.active() < self.max)
            else {
                at_capacity += 1;
                continue;
            };
            if self.cooling(k, a) {
                cooling += 1;
                continue;
            }
            let rank = p.rank();
            if best.is_none_or(|(r, bk)| (&rank, k) < (&r, bk)) {
                best = Some((rank, k));
            }
        }
        best.map(|(_, k)| k.clone())
            .ok_or(AcquireError::NoCapacity {
                matching: c.len(),
                at_capacity,
                cooling,
            })
    }

    /// The earliest end of a lease on one of `c`: the first eligible proxy
    /// by earliest end that is a candidate (O(log n) plus the entries
    /// skipped), or the least of the candidates' own earliest ends when
    /// they are few.
    pub(super) fn soonest_end(&self, c: &dyn Candidates) -> Option<DateTime<Utc>> {
        let whole = self.whole(c);
        if !whole && c.len().saturating_mul(WALK_RATIO) < self.index.soonest.len() {
            return c
                .keys()
                .filter_map(|k| self.proxies.get(k).filter(|p| p.eligible))
                .filter_map(|p| p.ends.first())
                .min();
        }
        self.index
            .soonest
            .iter()
            .find(|(_, k)| whole || c.contains(k))
            .map(|(t, _)| *t)
    }
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
