//! Released ids, remembered and bounded. A released lease's id must not be
//! taken in again while it could still be presented (until the end it
//! signed), so its nonce is kept until then; nothing here forgets one
//! earlier. What bounds the memory is the TTL: a client holding
//! [`MAX_RELEASED_PER_CLIENT`] remembered releases, or any client once the
//! store holds [`MAX_RELEASED`], is granted and renewed leases of at most
//! [`CROWDED_TTL`], so each id it releases past the cap is kept at most
//! that long. One client looping acquire(3600 s) + release then keeps at
//! most its cap plus what it releases in [`CROWDED_TTL`], instead of
//! everything it released in the last hour. Pure: time is an argument.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::index::ceil_second;
use super::signed::NONCE_LEN;

/// Released ids one client may have remembered before the leases it is
/// granted are shortened (about 70 bytes each: 1.4 MB).
pub const MAX_RELEASED_PER_CLIENT: usize = 20_000;
/// Released ids remembered in the store before every client's leases are
/// shortened (14 MB at about 70 bytes each).
pub const MAX_RELEASED: usize = 200_000;
/// Live leases and released ids together the store remembers at most:
/// past it no lease is granted (`503 table_full`) until one ends or a
/// released id's end passes. A release turns a lease into a released id,
/// so the sum never grows past it by a release, and nothing is forgotten
/// early. With [`MAX_RELEASED`] and [`CROWDED_TTL`] below it, a fleet
/// holding 100,000 leases and releasing 1,500 a second never meets it.
pub const MAX_LEASE_IDS: usize = 400_000;
/// The longest lease granted or renewed to a client past a cap.
pub const CROWDED_TTL: Duration = Duration::from_secs(60);

/// The client of a release the store learned without one (a snapshot's):
/// counted in the total only.
pub(super) const UNKNOWN_CLIENT: u32 = u32::MAX;

type Nonce = [u8; NONCE_LEN];

/// Nonces released, by their end (whole seconds, rounded up), and how
/// many each client has.
#[derive(Debug, Default)]
pub(super) struct Released {
    /// Each nonce with its end (ms, rounded up to the second).
    nonces: HashMap<Nonce, i64>,
    by_end: BTreeMap<i64, Vec<(Nonce, u32)>>,
    per_client: HashMap<u32, usize>,
}

impl Released {
    /// Remembers `nonce` of `client` until `end_ms`.
    pub(super) fn remember(&mut self, nonce: Nonce, client: u32, end_ms: i64) {
        let end = ceil_second(end_ms);
        if let Entry::Vacant(v) = self.nonces.entry(nonce) {
            v.insert(end.saturating_mul(1000));
            self.by_end.entry(end).or_default().push((nonce, client));
            if client != UNKNOWN_CLIENT {
                *self.per_client.entry(client).or_default() += 1;
            }
        }
    }

    /// Forgets every nonce whose end is at or before `now_ms`: none of its
    /// ids can be presented any more.
    pub(super) fn forget_until(&mut self, now_ms: i64) {
        while let Some(entry) = self.by_end.first_entry() {
            if entry.key().saturating_mul(1000) > now_ms {
                break;
            }
            for (n, client) in entry.remove() {
                self.nonces.remove(&n);
                if let Some(c) = self.per_client.get_mut(&client) {
                    *c -= 1;
                    if *c == 0 {
                        self.per_client.remove(&client);
                    }
                }
            }
        }
    }

    /// Whether `nonce` is remembered.
    pub(super) fn contains(&self, nonce: &Nonce) -> bool {
        self.nonces.contains_key(nonce)
    }

    /// The end of `nonce` (ms, rounded up to the second), if remembered.
    pub(super) fn end_of(&self, nonce: &Nonce) -> Option<i64> {
        self.nonces.get(nonce).copied()
    }

    /// How many are remembered.
    pub(super) fn len(&self) -> usize {
        self.nonces.len()
    }

    /// The earliest end (ms) of one remembered.
    pub(super) fn first_end(&self) -> Option<i64> {
        self.by_end.keys().next().map(|s| s.saturating_mul(1000))
    }

    /// How many of `client`'s are remembered.
    pub(super) fn of(&self, client: u32) -> usize {
        self.per_client.get(&client).copied().unwrap_or(0)
    }

    /// The TTL `client` is granted when it asks `asked`: [`CROWDED_TTL`]
    /// at most once it, or the store, holds its cap of releases.
    pub(super) fn ttl_for(&self, client: u32, asked: Duration) -> Duration {
        let crowded = self.of(client) >= MAX_RELEASED_PER_CLIENT || self.len() >= MAX_RELEASED;
        match crowded {
            true => asked.min(CROWDED_TTL),
            false => asked,
        }
    }

    /// Every nonce with its end (ms, rounded up to the second).
    pub(super) fn iter(&self) -> impl Iterator<Item = (i64, &Nonce)> {
        self.by_end
            .iter()
            .flat_map(|(s, v)| v.iter().map(move |(n, _)| (s.saturating_mul(1000), n)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nonce(i: usize) -> Nonce {
        let mut n = [0u8; NONCE_LEN];
        n[..8].copy_from_slice(&(i as u64).to_le_bytes());
        n
    }

    #[test]
    fn a_client_past_its_cap_gets_short_leases_until_its_releases_age_out() {
        let hour = Duration::from_secs(3600);
        let mut r = Released::default();
        let (a, b) = (1, 2);
        for i in 0..MAX_RELEASED_PER_CLIENT - 1 {
            r.remember(nonce(i), a, 3_600_000);
        }
        assert_eq!(r.ttl_for(a, hour), hour, "below the cap");
        r.remember(nonce(usize::MAX), a, 7_200_000);
        assert_eq!(r.of(a), MAX_RELEASED_PER_CLIENT);
        assert_eq!(r.ttl_for(a, hour), CROWDED_TTL, "at the cap");
        assert_eq!(r.ttl_for(a, Duration::from_secs(5)), Duration::from_secs(5));
        assert_eq!(r.ttl_for(b, hour), hour, "another client is not shortened");
        // Nothing is forgotten before its end, whatever the count.
        r.forget_until(3_599_999);
        assert_eq!(r.of(a), MAX_RELEASED_PER_CLIENT);
        assert!(r.contains(&nonce(0)));
        r.forget_until(3_600_000);
        assert_eq!(r.of(a), 1);
        assert!(!r.contains(&nonce(0)) && r.contains(&nonce(usize::MAX)));
        assert_eq!(r.ttl_for(a, hour), hour, "aged out: full leases again");
        r.forget_until(7_200_000);
        assert_eq!((r.len(), r.of(a)), (0, 0));
        assert!(r.per_client.is_empty(), "no entry left for a client");
    }

    #[test]
    fn the_store_past_its_cap_shortens_every_client_and_unknown_releases_count_in_it() {
        let hour = Duration::from_secs(3600);
        let mut r = Released::default();
        for i in 0..MAX_RELEASED {
            r.remember(nonce(i), UNKNOWN_CLIENT, 1_000);
        }
        // The same nonce twice is one.
        r.remember(nonce(0), 7, 1_000);
        assert_eq!((r.len(), r.of(7)), (MAX_RELEASED, 0));
        assert_eq!(r.ttl_for(7, hour), CROWDED_TTL);
        r.forget_until(1_000);
        assert_eq!(r.ttl_for(7, hour), hour);
    }
}
