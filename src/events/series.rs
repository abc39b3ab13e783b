//! Which Events are repeats (issue 19). An Event identical to one this
//! process recorded on the same object within [`SERIES_TTL`] is counted on
//! that Event's series (one patch) instead of becoming a new object, as
//! kube-runtime's recorder does. Unlike that recorder, which kept every
//! whole Event for six minutes in a map it scanned on every publish (tens
//! of MiB, and quadratic time, while 10,000 Proxies turn Ready at once),
//! this keeps a 16-byte digest and the Event's name per entry, at most
//! [`MAX_SERIES`] of them, and expires them in order. Past the cap the
//! oldest is forgotten: a repeat of it is a new Event, nothing is lost.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sha2::{Digest as _, Sha256};

/// How long a recorded Event takes repeats on its series (kube-runtime's
/// figure, the same as client-go's event correlator window is of the order
/// of).
pub const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// Recorded Events remembered at most.
pub const MAX_SERIES: usize = 4096;

/// What makes two Events the same: who regards what, and what was said.
pub type Key = [u8; 16];

/// The key of an Event of `severity`, `reason`, `action` and `note` on
/// the object `regarding` (API version, kind, namespace, name, UID: not
/// its resourceVersion, which every status write changes).
pub fn key(regarding: [&str; 5], severity: &str, reason: &str, action: &str, note: &str) -> Key {
    let mut h = Sha256::new();
    for part in regarding.iter().chain(&[severity, reason, action, note]) {
        // Length-prefixed, so no two different tuples hash alike.
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    let mut k = [0u8; 16];
    k.copy_from_slice(&digest[..16]);
    k
}

/// The Event a repeat is counted on (its namespace is the regarded
/// object's, part of the key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// Its name.
    pub name: String,
    /// Times seen so far, the first included.
    pub count: i32,
    last: DateTime<Utc>,
}

/// What to send for an Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Publish {
    /// A new Event object; tell [`Series::created`] once it exists.
    Create,
    /// A patch of this Event's series to `count`, seen now.
    Repeat {
        /// Name of the Event.
        name: String,
        /// The new count (2 for the first repeat).
        count: i32,
    },
}

/// The recorded Events still taking repeats, oldest first.
#[derive(Debug)]
pub struct Series {
    by_key: HashMap<Key, Recorded>,
    /// (last seen, key), in the order they were seen; an entry whose time
    /// is no longer its key's last sighting is stale and skipped.
    order: VecDeque<(DateTime<Utc>, Key)>,
    max: usize,
    ttl: chrono::Duration,
}

impl Default for Series {
    fn default() -> Self {
        Series::new(MAX_SERIES, SERIES_TTL)
    }
}

impl Series {
    /// At most `max` Events, each taking repeats for `ttl` after it was
    /// last seen.
    pub fn new(max: usize, ttl: Duration) -> Self {
        Series {
            by_key: HashMap::new(),
            order: VecDeque::new(),
            max: max.max(1),
            ttl: chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX),
        }
    }

    /// How many Events are remembered.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// What to send for an Event of `key` at `now`; a repeat is counted
    /// here at once (a failed patch is forgotten with [`Series::forget`]).
    pub fn publish(&mut self, key: Key, now: DateTime<Utc>) -> Publish {
        self.expire(now);
        let Some(r) = self.by_key.get_mut(&key) else {
            return Publish::Create;
        };
        r.count = r.count.saturating_add(1);
        let seen_before = std::mem::replace(&mut r.last, now);
        let publish = Publish::Repeat {
            name: r.name.clone(),
            count: r.count,
        };
        // One queue entry per key and instant is enough.
        if seen_before != now {
            self.order.push_back((now, key));
            self.compact();
        }
        publish
    }

    /// The Event of `key` was created as `name` at `now`.
    pub fn created(&mut self, key: Key, name: String, now: DateTime<Utc>) {
        self.expire(now);
        while self.by_key.len() >= self.max && !self.by_key.contains_key(&key) {
            if !self.drop_oldest() {
                break;
            }
        }
        self.by_key.insert(
            key,
            Recorded {
                name,
                count: 1,
                last: now,
            },
        );
        self.order.push_back((now, key));
        self.compact();
    }

    /// Forgets `key` (its Event could not be patched: a repeat then
    /// creates a new one).
    pub fn forget(&mut self, key: &Key) {
        self.by_key.remove(key);
    }

    /// Drops the Events last seen `ttl` or longer before `now`.
    fn expire(&mut self, now: DateTime<Utc>) {
        while let Some(&(at, key)) = self.order.front() {
            if at + self.ttl > now {
                break;
            }
            self.order.pop_front();
            if self.by_key.get(&key).is_some_and(|r| r.last == at) {
                self.by_key.remove(&key);
            }
        }
    }

    /// Drops the least recently seen Event; false when none is left.
    fn drop_oldest(&mut self) -> bool {
        while let Some((at, key)) = self.order.pop_front() {
            if self.by_key.get(&key).is_some_and(|r| r.last == at) {
                self.by_key.remove(&key);
                return true;
            }
        }
        false
    }

    /// Keeps the order queue within a small multiple of the live entries
    /// (an Event repeated often leaves stale entries behind).
    fn compact(&mut self) {
        if self.order.len() <= 2 * self.by_key.len() + 16 {
            return;
        }
        let by_key = &self.by_key;
        self.order
            .retain(|(at, key)| by_key.get(key).is_some_and(|r| r.last == *at));
    }
}

#[cfg(test)]
#[path = "series_tests.rs"]
mod tests;
