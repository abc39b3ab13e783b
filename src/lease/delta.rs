//! Deltas: the entries changed since a version, as they are now, for a
//! member whose copy the change log still covers (`log.rs`); and a
//! follower taking one into its copy.
//!
//! A delta is a [`Snapshot`] of only the touched entries, plus what the
//! leader holds no more (`ended`, `unstuck`) and the proxies whose
//! cooldowns it carries whole (`cooled`). The lock is held for the
//! touched entries only (a long walk of the log lets it go between
//! chunks); the answer is serialized after it.

use std::collections::HashSet;
use std::sync::Arc;

use super::bounds::KeyDigest;
use super::snapshot::{cooldown_entries, lease_entry, ms_left, Ends, Plan, Table};
use super::state::{self, Nonce};
use super::{LeaseStore, ProxyKey, Snapshot, SnapshotError, Touched, SNAPSHOT_VERSION};

/// Log entries copied per lock by [`LeaseStore::export_since`]: 16,384
/// entries of 24 bytes, about 0.4 MB and well under a millisecond.
const WALK_CHUNK: usize = 16_384;

/// What log entries touched, each once.
#[derive(Default)]
struct Touches {
    leases: HashSet<Nonce>,
    sticky: HashSet<KeyDigest>,
    cooling: HashSet<Arc<ProxyKey>>,
}

impl Touches {
    fn add<'a>(&mut self, entries: impl Iterator<Item = &'a Touched>) {
        for t in entries {
            match t {
                Touched::Lease(n) => {
                    self.leases.insert(*n);
                }
                Touched::Sticky(d) => {
                    self.sticky.insert(*d);
                }
                Touched::Cooling(p) => {
                    self.cooling.insert(p.clone());
                }
            }
        }
    }
}

impl LeaseStore {
    /// What changed after version `after`, and the version it brings the
    /// copy to; `None` when the log no longer covers `after` (or never
    /// reached it): then only the whole table will do.
    pub fn export_since(&self, after: u64) -> Option<(u64, Snapshot)> {
        self.export_since_in(after, WALK_CHUNK, || {})
    }

    /// [`Self::export_since`], walking the log `chunk` entries per lock
    /// and calling `between` while no lock is held (a test's changes).
    ///
    /// A member far behind (up to [`super::MAX_LOG`] entries) must not
    /// hold the lock grants wait on for the whole walk: the log's entries
    /// never change once written, so each chunk is copied under the lock
    /// and deduplicated off it. Only the last stretch and the entries'
    /// state are read under one lock, whose version the answer names:
    /// everything touched after `after` up to it is in the sets.
    pub(super) fn export_since_in(
        &self,
        after: u64,
        chunk: usize,
        mut between: impl FnMut(),
    ) -> Option<(u64, Snapshot)> {
        let mut touched = Touches::default();
        let mut at = after;
        let mut st = loop {
            let st = self.lock();
            let behind = st.log.version().saturating_sub(at);
            if behind <= chunk as u64 {
                break st;
            }
            let copied: Vec<Touched> = st.log.since(at)?.take(chunk).cloned().collect();
            drop(st);
            at += copied.len() as u64;
            touched.add(copied.iter());
            between();
        };
        let now = self.clock.now();
        st.expire_leases(now);
        touched.add(st.log.since(at)?);
        let Touches {
            leases,
            sticky,
            cooling,
        } = touched;
        let version = st.log.version();
        let mut t = Table::default();
        let mut s = Snapshot {
            v: SNAPSHOT_VERSION,
            ..Default::default()
        };
        for nonce in &leases {
            if let Some(entry) = st
                .leases
                .get(nonce)
                .and_then(|l| lease_entry(&st, &mut t, (nonce, l), now))
            {
                s.leases.push(entry);
                continue;
            }
            let released = st.released.end_of(nonce);
            match released.and_then(|end| ms_left(now, state::at(end))) {
                Some(left) => s.released.push((*nonce, left)),
                None => s.ended.push(*nonce),
            }
        }
        for d in &sticky {
            let live = st.sticky.live_digest(d, now);
            match live.and_then(|(p, until)| Some((p, ms_left(now, until)?))) {
                Some((p, left)) => s.sticky.push((*d, t.of(p), left)),
                None => s.unstuck.push(*d),
            }
        }
        for p in &cooling {
            s.cooled.push(t.of(p));
            if let Some(c) = st.cooldowns.live_of(p, now) {
                cooldown_entries(&mut s, &mut t, c, now);
            }
        }
        s.longest = st.recovery.longest_left(now);
        s.window = st.recovery.window_left(now);
        t.into(&mut s);
        Some((version, s))
    }

    /// Takes the leader's delta `s` into this follower's copy, unless the
    /// copy is not the one the delta follows (another `feed`) or this
    /// store took over since `term` was read: then `false`, and the
    /// follower asks for the whole table.
    pub fn patch(&self, s: &Snapshot, term: u64, feed: &str) -> Result<bool, SnapshotError> {
        let plan = Plan::of(s)?;
        let now = self.clock.now();
        let mut st = self.lock();
        if self.term() != term || self.copied_from().as_deref() != Some(feed) {
            return Ok(false);
        }
        st.expire_leases(now);
        for n in &s.ended {
            st.end(n);
        }
        for d in &s.unstuck {
            st.sticky.forget_digest(d);
        }
        if !plan.cooled.is_empty() {
            st.cooldowns.forget_proxies(&plan.cooled);
        }
        self.apply(&mut st, &plan, s, (now, Ends::Exact));
        Ok(true)
    }
}

#[cfg(test)]
#[path = "delta_tests.rs"]
mod tests;
