//! What crawlers asked of each autoscaled ProxyPool: acquires naming the
//! pool (`pool=NAME`), and how many of them were refused. The lease API
//! counts here; the pool controller reads the counts as demand and says
//! how a refusal is answered: a pool at zero answers `503` with a
//! Retry-After while it comes back, a pool that can grow tells the crawler
//! to ask again soon (docs/pools.md).
//!
//! Only pools the controller registered are counted, so a crawler naming
//! pools that do not exist grows nothing here.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A registration not refreshed this long is dropped: the controller
/// looks at every autoscaled pool at least every few seconds, so only a
/// deleted pool (or a lost leadership) lets one age this far.
pub const FORGET_AFTER: Duration = Duration::from_secs(120);

/// The counts of one pool, as the controller reads them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Asked {
    /// Acquires that named the pool, since the registration.
    pub asked: u64,
    /// Of those, refused (no proxy, no capacity, the pool at zero).
    pub refused: u64,
}

/// How an acquire naming a pool is answered when it is refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Answer {
    /// As any refusal (`409`, Retry-After until a lease ends).
    #[default]
    Plain,
    /// The pool grows for it: `409` with a Retry-After of at most this.
    Growing(Duration),
    /// The pool is at zero or has no Ready proxy yet: `503
    /// pool_scaling_up` with this Retry-After.
    Waking(Duration),
}

impl Answer {
    /// The more urgent of two answers (waking over growing over plain;
    /// the shorter wait of two alike).
    fn or(self, other: Answer) -> Answer {
        use Answer::*;
        match (self, other) {
            (Waking(a), Waking(b)) => Waking(a.min(b)),
            (Waking(a), _) | (_, Waking(a)) => Waking(a),
            (Growing(a), Growing(b)) => Growing(a.min(b)),
            (Growing(a), _) | (_, Growing(a)) => Growing(a),
            (Plain, Plain) => Plain,
        }
    }
}

#[derive(Debug)]
struct Entry {
    namespace: Box<str>,
    counts: Asked,
    answer: Answer,
    seen: Instant,
}

/// The counts of the registered pools, by pool name (crawlers name a pool
/// with or without its namespace).
#[derive(Debug, Default)]
pub struct PoolDemand {
    pools: Mutex<HashMap<Box<str>, Vec<Entry>>>,
}

impl PoolDemand {
    fn map(&self) -> MutexGuard<'_, HashMap<Box<str>, Vec<Entry>>> {
        // A poisoned map only means a panic between two plain map calls.
        self.pools.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers (or refreshes) the pool `namespace/name`: its acquires
    /// are counted from now on, and refused ones get `answer`.
    /// Registrations older than [`FORGET_AFTER`] are dropped on the way.
    pub fn register(&self, namespace: &str, name: &str, answer: Answer, now: Instant) {
        let mut m = self.map();
        m.retain(|_, entries| {
            entries.retain(|e| now.saturating_duration_since(e.seen) < FORGET_AFTER);
            !entries.is_empty()
        });
        let entries = m.entry(name.into()).or_default();
        match entries.iter_mut().find(|e| &*e.namespace == namespace) {
            Some(e) => {
                e.answer = answer;
                e.seen = now;
            }
            None => entries.push(Entry {
                namespace: namespace.into(),
                counts: Asked::default(),
                answer,
                seen: now,
            }),
        }
    }

    /// Stops counting for `namespace/name` (the pool is gone or no longer
    /// autoscaled).
    pub fn forget(&self, namespace: &str, name: &str) {
        let mut m = self.map();
        if let Some(entries) = m.get_mut(name) {
            entries.retain(|e| &*e.namespace != namespace);
            if entries.is_empty() {
                m.remove(name);
            }
        }
    }

    /// Counts an acquire naming pool `name` (in `namespace` when the
    /// crawler said which); for a refused one (`refused`), how it is
    /// answered.
    pub fn asked(&self, namespace: Option<&str>, name: &str, refused: bool) -> Answer {
        let mut m = self.map();
        let Some(entries) = m.get_mut(name) else {
            return Answer::Plain;
        };
        let mut answer = Answer::Plain;
        for e in entries
            .iter_mut()
            .filter(|e| namespace.is_none_or(|ns| ns == &*e.namespace))
        {
            e.counts.asked += 1;
            if refused {
                e.counts.refused += 1;
                answer = answer.or(e.answer);
            }
        }
        answer
    }

    /// The counts of `namespace/name` (zero when not registered).
    pub fn read(&self, namespace: &str, name: &str) -> Asked {
        self.map()
            .get(name)
            .and_then(|v| v.iter().find(|e| &*e.namespace == namespace))
            .map(|e| e.counts)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_registered_pools_are_counted_by_namespace_when_named() {
        let d = PoolDemand::default();
        let t = Instant::now();
        let (soon, later) = (Duration::from_secs(3), Duration::from_secs(7));
        assert_eq!(d.asked(None, "eu", true), Answer::Plain, "not registered");
        d.register("a", "eu", Answer::Growing(soon), t);
        d.register("b", "eu", Answer::Waking(later), t);
        assert_eq!(d.asked(Some("a"), "eu", true), Answer::Growing(soon));
        assert_eq!(
            d.read("a", "eu"),
            Asked {
                asked: 1,
                refused: 1
            }
        );
        assert_eq!(d.read("b", "eu"), Asked::default());
        // Without a namespace the crawler may get either: both count, and
        // the pool coming back from zero decides the answer.
        assert_eq!(d.asked(None, "eu", true), Answer::Waking(later));
        assert_eq!(
            d.asked(None, "eu", false),
            Answer::Plain,
            "a grant is no refusal"
        );
        assert_eq!(
            d.read("a", "eu"),
            Asked {
                asked: 3,
                refused: 2
            }
        );
        assert_eq!(
            d.read("b", "eu"),
            Asked {
                asked: 2,
                refused: 1
            }
        );
        assert_eq!(d.read("a", "us"), Asked::default());
        d.register("c", "us", Answer::Plain, t);
        assert_eq!(
            d.asked(None, "us", true),
            Answer::Plain,
            "at its max: as any refusal"
        );
    }

    #[test]
    fn a_registration_not_refreshed_is_forgotten() {
        let d = PoolDemand::default();
        let t = Instant::now();
        d.register("a", "old", Answer::Plain, t);
        d.register("a", "kept", Answer::Plain, t);
        d.asked(None, "old", true);
        let later = t + FORGET_AFTER;
        d.register("a", "kept", Answer::Plain, later);
        assert_eq!(d.read("a", "old"), Asked::default(), "dropped on the way");
        d.forget("a", "kept");
        d.asked(None, "kept", true);
        assert_eq!(
            d.read("a", "kept"),
            Asked::default(),
            "not counted once forgotten"
        );
    }
}
