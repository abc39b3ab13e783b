//! The store's change log: what each change touched, one entry a
//! version, bounded. A follower (or a gateway) that names a version the
//! log still covers is sent only the touched entries as they are now
//! (`delta.rs`); one that names an older version, or none, is sent the
//! whole table (docs/architecture.md, "The change log").
//!
//! An entry names what changed, never its value: the value is read when
//! the delta is made, so a lease granted and released in between is sent
//! once, as released. Entries are 24 bytes; [`MAX_LOG`] of them are 6 MiB.

use std::collections::VecDeque;
use std::sync::Arc;

use super::bounds::KeyDigest;
use super::state::Nonce;
use super::ProxyKey;

/// Entries the log keeps: about a minute of changes at 2,000
/// acquire+release pairs a second (two changes a pair, three with a
/// sticky key).
pub const MAX_LOG: usize = 262_144;

/// What one change touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Touched {
    /// A lease granted, renewed, released or taken in.
    Lease(Nonce),
    /// A sticky key (re)mapped.
    Sticky(KeyDigest),
    /// A proxy's cooldowns.
    Cooling(Arc<ProxyKey>),
}

/// The last changes, each one version past the one before.
#[derive(Debug)]
pub(super) struct Log {
    entries: VecDeque<Touched>,
    /// The version before the first entry: changes up to it are not here.
    floor: u64,
    cap: usize,
    /// When changes were made, at millisecond grain: the first version
    /// made in each millisecond and that millisecond (Unix, the leader's
    /// clock), so a member's answer can say how old its oldest change is.
    marks: VecDeque<(u64, u64)>,
}

/// Milliseconds the marks keep: 8,192 of 16 bytes (128 KiB), at least
/// 8 s of changes, longer than any member that stays in sync waits.
const MAX_MARKS: usize = 8_192;

impl Default for Log {
    fn default() -> Self {
        Self::with_cap(MAX_LOG)
    }
}

impl Log {
    pub(super) fn with_cap(cap: usize) -> Self {
        Log {
            entries: VecDeque::new(),
            floor: 0,
            cap: cap.max(1),
            marks: VecDeque::new(),
        }
    }

    /// The version after the last entry.
    pub(super) fn version(&self) -> u64 {
        self.floor + self.entries.len() as u64
    }

    /// Records a change; returns its version. The oldest entry goes once
    /// the log is full.
    pub(super) fn push(&mut self, t: Touched) -> u64 {
        if self.entries.len() >= self.cap {
            self.entries.pop_front();
            self.floor += 1;
        }
        self.entries.push_back(t);
        self.version()
    }

    /// A change the log cannot name (a whole table taken in): every
    /// version before `version` is no longer covered.
    pub(super) fn restart(&mut self, version: u64) {
        self.entries.clear();
        self.marks.clear();
        self.floor = version;
    }

    /// Notes that change `version` was made at Unix millisecond `ms`
    /// (only the first change of each millisecond is kept; a clock that
    /// went back adds nothing).
    pub(super) fn stamp(&mut self, version: u64, ms: u64) {
        if self.marks.back().is_some_and(|&(_, last)| last >= ms) {
            return;
        }
        if self.marks.len() >= MAX_MARKS {
            self.marks.pop_front();
        }
        self.marks.push_back((version, ms));
    }

    /// When change `version` was made (Unix ms, at most a millisecond
    /// early). Older than the marks reach (more than [`MAX_MARKS`]
    /// milliseconds with changes ago): the oldest mark's, so a copy that
    /// was away long counts as at least that far behind instead of not at
    /// all. `None` before the first mark since the log started or
    /// restarted: nothing dates it.
    pub(super) fn made_at(&self, version: u64) -> Option<u64> {
        let after = self.marks.partition_point(|&(v, _)| v <= version);
        match after.checked_sub(1) {
            Some(i) => self.marks.get(i).map(|&(_, ms)| ms),
            // Full, the marks lost their oldest for room (they stay full
            // until a restart clears them): the version is older still.
            None if self.marks.len() >= MAX_MARKS => self.marks.front().map(|&(_, ms)| ms),
            None => None,
        }
    }

    /// What changed after version `after`, when the log holds all of it.
    pub(super) fn since(&self, after: u64) -> Option<impl Iterator<Item = &Touched>> {
        let skip = after.checked_sub(self.floor)?;
        let skip = usize::try_from(skip).ok()?;
        (skip <= self.entries.len()).then(|| self.entries.iter().skip(skip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(i: u8) -> Touched {
        Touched::Lease([i; 16])
    }

    #[test]
    fn the_log_covers_what_it_still_holds_and_nothing_before_or_after() {
        let mut log = Log::with_cap(3);
        assert_eq!(log.since(0).map(Iterator::count), Some(0));
        for i in 1..=5 {
            assert_eq!(log.push(lease(i)), u64::from(i));
        }
        // Versions 3, 4 and 5 are held: an ask after 2 gets all three.
        let cases: [(u64, Option<Vec<Touched>>); 6] = [
            (0, None),
            (1, None),
            (2, Some(vec![lease(3), lease(4), lease(5)])),
            (4, Some(vec![lease(5)])),
            (5, Some(vec![])),
            // A version this log never reached (another leader's).
            (6, None),
        ];
        for (after, want) in cases {
            let got = log.since(after).map(|i| i.cloned().collect::<Vec<_>>());
            assert_eq!(got, want, "after {after}");
        }
        log.restart(9);
        assert_eq!(log.version(), 9);
        assert!(log.since(5).is_none(), "a restart covers nothing before it");
        assert_eq!(log.since(9).map(Iterator::count), Some(0));
    }

    #[test]
    fn a_change_is_dated_by_the_first_change_of_its_millisecond() {
        let mut log = Log::with_cap(100);
        for (version, ms) in [(1, 1000), (2, 1000), (3, 1002), (4, 1001), (5, 1005)] {
            log.push(lease(version as u8));
            log.stamp(version, ms);
        }
        // Version 4's clock went back: it counts as made in 1002's ms.
        let cases = [
            (0, None),
            (1, Some(1000)),
            (2, Some(1000)),
            (3, Some(1002)),
            (4, Some(1002)),
            (5, Some(1005)),
            (9, Some(1005)),
        ];
        for (version, want) in cases {
            assert_eq!(log.made_at(version), want, "version {version}");
        }
        log.restart(6);
        assert_eq!(
            log.made_at(5),
            None,
            "a whole table taken in dates nothing before it"
        );
    }

    #[test]
    fn a_change_older_than_the_marks_is_dated_by_the_oldest() {
        let mut log = Log::with_cap(2 * MAX_MARKS);
        let first = 1_000_000;
        for i in 0..=MAX_MARKS as u64 {
            let v = log.push(lease(1));
            log.stamp(v, first + i);
        }
        // Version 1's mark (ms `first`) went; the oldest kept is the next.
        assert_eq!(log.made_at(1), Some(first + 1));
        assert_eq!(log.made_at(2), Some(first + 1));
        assert_eq!(log.made_at(3), Some(first + 2));
        log.restart(log.version());
        assert_eq!(log.made_at(1), None, "a restart forgets the trimming too");
    }

    #[test]
    fn an_entry_is_small() {
        assert!(std::mem::size_of::<Touched>() <= 24);
    }
}
