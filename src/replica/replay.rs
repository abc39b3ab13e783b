//! The leader's memory of forwarded acquires by request key: a follower
//! that lost the answer to a forwarded acquire sends it again with the same
//! key, and gets the lease already granted instead of a second one nobody
//! would hold. Bounded in time (longer than any follower waits) and count.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a request key is remembered: far longer than a follower's
/// forward timeout.
pub const REMEMBER_FOR: Duration = Duration::from_secs(60);

/// Request keys remembered at most (past it the oldest is forgotten: its
/// retry, long after the follower gave up, would grant again).
pub const MAX_KEYS: usize = 100_000;

/// (client, request key) → lease id, oldest first.
#[derive(Debug, Default)]
pub struct Replays {
    ids: HashMap<(Arc<str>, String), String>,
    order: VecDeque<(Instant, (Arc<str>, String))>,
}

impl Replays {
    /// The lease granted to `client` under `key`, if remembered at `now`.
    pub fn get(&mut self, client: &Arc<str>, key: &str, now: Instant) -> Option<&String> {
        self.forget(now);
        self.ids.get(&(client.clone(), key.to_string()))
    }

    /// Remembers that `key` of `client` got lease `id` at `now`.
    pub fn put(&mut self, client: Arc<str>, key: &str, id: String, now: Instant) {
        self.forget(now);
        if self.ids.len() >= MAX_KEYS {
            if let Some((_, k)) = self.order.pop_front() {
                self.ids.remove(&k);
            }
        }
        let k = (client, key.to_string());
        if self.ids.insert(k.clone(), id).is_none() {
            self.order.push_back((now, k));
        }
    }

    fn forget(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front() {
            if now.saturating_duration_since(*at) < REMEMBER_FOR {
                break;
            }
            if let Some((_, k)) = self.order.pop_front() {
                self.ids.remove(&k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_answers_its_clients_lease_for_a_minute() {
        let t0 = Instant::now();
        let mut r = Replays::default();
        let (a, b): (Arc<str>, Arc<str>) = ("team-a".into(), "team-b".into());
        r.put(a.clone(), "k1", "lease-1".into(), t0);
        assert_eq!(r.get(&a, "k1", t0).map(String::as_str), Some("lease-1"));
        assert_eq!(r.get(&b, "k1", t0), None, "another client's key is its own");
        assert_eq!(r.get(&a, "k2", t0), None);
        let later = t0 + REMEMBER_FOR;
        assert_eq!(r.get(&a, "k1", later), None, "forgotten after a minute");
        assert!(r.ids.is_empty() && r.order.is_empty());
    }
}
