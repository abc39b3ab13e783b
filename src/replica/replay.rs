//! The leader's memory of forwarded acquires by request key: a follower
//! that lost the answer to a forwarded acquire sends it again with the same
//! key, and gets the lease already granted instead of a second one nobody
//! would hold. Bounded in time (as long as a forward's seal is accepted,
//! far longer than any follower waits) and count. An entry is 32 bytes
//! of key and lease nonce (about 85 with the map's and the queue's
//! share): 100,000 of them, one client forwarding 1,700 acquires a
//! second, take some 8 MB, where the strings took 30.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// How long a request key is remembered: far longer than a follower's
/// forward timeout.
pub const REMEMBER_FOR: Duration = Duration::from_secs(60);

/// Request keys remembered at most (past it the oldest is forgotten: its
/// retry, long after the follower gave up, would grant again).
pub const MAX_KEYS: usize = 100_000;

/// What a (client, request key) pair is remembered by: the first 16
/// bytes of its SHA-256, not the two strings; two pairs meet only by a
/// SHA-256 collision.
type Key = [u8; 16];

/// The lease granted, by its nonce (`LeaseStore::nonce_of`), not its id.
pub type Nonce = [u8; crate::lease::signed::NONCE_LEN];

fn key_of(client: &str, key: &str) -> Key {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    // The client's length first, so ("ab", "c") and ("a", "bc") differ.
    ctx.update(&(client.len() as u64).to_be_bytes());
    ctx.update(client.as_bytes());
    ctx.update(key.as_bytes());
    let mut out = [0; 16];
    out.copy_from_slice(&ctx.finish().as_ref()[..16]);
    out
}

/// (client, request key) → lease nonce, oldest first.
#[derive(Debug, Default)]
pub struct Replays {
    ids: HashMap<Key, Nonce>,
    order: VecDeque<(Instant, Key)>,
}

impl Replays {
    /// The lease granted to `client` under `key`, if remembered at `now`.
    pub fn get(&mut self, client: &str, key: &str, now: Instant) -> Option<Nonce> {
        self.forget(now);
        self.ids.get(&key_of(client, key)).copied()
    }

    /// Remembers that `key` of `client` got the lease `nonce` at `now`.
    pub fn put(&mut self, client: &str, key: &str, nonce: Nonce, now: Instant) {
        self.forget(now);
        if self.ids.len() >= MAX_KEYS {
            if let Some((_, k)) = self.order.pop_front() {
                self.ids.remove(&k);
            }
        }
        let k = key_of(client, key);
        if self.ids.insert(k, nonce).is_none() {
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
        let (a, b) = ("team-a", "team-b");
        r.put(a, "k1", [1; 16], t0);
        assert_eq!(r.get(a, "k1", t0), Some([1; 16]));
        assert_eq!(r.get(b, "k1", t0), None, "another client's key is its own");
        assert_eq!(r.get(a, "k2", t0), None);
        r.put("team-", "ak1", [2; 16], t0);
        assert_eq!(
            r.get(a, "k1", t0),
            Some([1; 16]),
            "the pair, not the concatenation"
        );
        let later = t0 + REMEMBER_FOR;
        assert_eq!(r.get(a, "k1", later), None, "forgotten after a minute");
        assert!(r.ids.is_empty() && r.order.is_empty());
    }
}
