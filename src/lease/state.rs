//! The store's maps under its one mutex, and the two ways a lease ends
//! (expiry, release) that keep them consistent.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::bounds::{Caps, Cooldowns, StickyMap};
use super::index::{Ends, Index, ProxyState};
use super::{
    ClientLimits, Lease, ProxyKey, MAX_COOLDOWN_SITES, MAX_COOLDOWN_SITES_PER_PROXY,
    MAX_STICKY_KEYS, MAX_STICKY_KEYS_PER_PROXY,
};

#[derive(Debug)]
pub(super) struct State {
    /// Live leases by slot: the nonce of a signed id, else the id itself.
    pub(super) leases: HashMap<String, Lease>,
    /// Every lease (slot) by its end, so expiring is O(expired), not O(leases).
    pub(super) ends: BTreeSet<(DateTime<Utc>, String)>,
    /// Per proxy; change through [`State::update_proxy`] (keeps `index`).
    pub(super) proxies: HashMap<ProxyKey, ProxyState>,
    /// The eligible proxies with room in fairness order, and those with
    /// leases by their earliest end (`index.rs`).
    pub(super) index: Index,
    /// `--max-leases-per-proxy`.
    pub(super) max: u32,
    pub(super) cooldowns: Cooldowns,
    pub(super) sticky: StickyMap,
    /// Live leases' ends per client.
    pub(super) clients: HashMap<Arc<str>, Ends>,
    pub(super) grants: u64,
    /// Slots released here, by their signed end: a released id is not
    /// taken in again by [`super::LeaseStore::admit`] while it could be.
    released: BTreeSet<(DateTime<Utc>, String)>,
    released_slots: HashSet<String>,
    /// Horizons and the recovery window (`recovery.rs`).
    pub(super) recovery: super::recovery::Recovery,
}

impl State {
    pub(super) fn new(limits: ClientLimits, max: u32) -> Self {
        State {
            index: Index::default(),
            max,
            clients: HashMap::new(),
            leases: HashMap::new(),
            ends: BTreeSet::new(),
            proxies: HashMap::new(),
            cooldowns: Cooldowns::new(
                Caps {
                    total: MAX_COOLDOWN_SITES,
                    per_proxy: MAX_COOLDOWN_SITES_PER_PROXY,
                },
                limits.global_cooldown_min_clients,
            ),
            sticky: StickyMap::new(Caps {
                total: MAX_STICKY_KEYS,
                per_proxy: MAX_STICKY_KEYS_PER_PROXY,
            }),
            grants: 0,
            released: BTreeSet::new(),
            released_slots: HashSet::new(),
            recovery: Default::default(),
        }
    }

    /// Removes expired leases (their capacity comes back at once); returns
    /// how many ended. Cooldowns and sticky keys are left to
    /// [`LeaseStore::sweep`]: requests only compare their ends with now.
    pub(super) fn expire_leases(&mut self, now: DateTime<Utc>) -> usize {
        while self.released.first().is_some_and(|(end, _)| *end <= now) {
            self.forget_oldest_release();
        }
        let mut n = 0;
        while self.ends.first().is_some_and(|(end, _)| *end <= now) {
            if let Some((_, id)) = self.ends.pop_first() {
                n += usize::from(self.end(&id).is_some());
            }
        }
        n
    }

    /// Ends a lease by release: its ids are dead here until they expire.
    pub(super) fn release(&mut self, slot: &str) -> Option<Lease> {
        let lease = self.end(slot)?;
        self.remember_release(slot, lease.expires_at);
        Some(lease)
    }

    /// Remembers that `slot` was released, until `end`: as long as any of
    /// its ids could be presented, however many are released meanwhile
    /// (each costs about 100 bytes for at most `--max-lease-ttl`).
    pub(super) fn remember_release(&mut self, slot: &str, end: DateTime<Utc>) {
        if self.released_slots.insert(slot.to_string()) {
            self.released.insert((end, slot.to_string()));
        }
    }

    /// Released slots by their end.
    pub(super) fn released(&self) -> impl Iterator<Item = (DateTime<Utc>, &str)> {
        self.released
            .iter()
            .map(|(end, slot)| (*end, slot.as_str()))
    }

    /// Whether `slot` was released here and could still be presented.
    pub(super) fn was_released(&self, slot: &str) -> bool {
        self.released_slots.contains(slot)
    }

    fn forget_oldest_release(&mut self) {
        if let Some((_, slot)) = self.released.pop_first() {
            self.released_slots.remove(&slot);
        }
    }

    /// Holds a new lease under `slot`: counted on its proxy and client.
    pub(super) fn hold(&mut self, slot: String, lease: Lease) {
        let end = lease.expires_at;
        self.update_proxy(&lease.proxy, |p| p.ends.add(end));
        self.clients
            .entry(lease.client.clone())
            .or_default()
            .add(end);
        self.ends.insert((end, slot.clone()));
        self.leases.insert(slot, lease);
    }

    /// Moves the end of the lease in `slot` to `end`.
    pub(super) fn move_end(&mut self, slot: &str, end: DateTime<Utc>) -> Option<&mut Lease> {
        let lease = self.leases.get(slot)?;
        let (old, proxy, client) = (lease.expires_at, lease.proxy.clone(), lease.client.clone());
        self.update_proxy(&proxy, |p| {
            p.ends.remove(old);
            p.ends.add(end);
        });
        if let Some(c) = self.clients.get_mut(&client) {
            c.remove(old);
            c.add(end);
        }
        self.ends.remove(&(old, slot.to_string()));
        self.ends.insert((end, slot.to_string()));
        let lease = self.leases.get_mut(slot)?;
        lease.expires_at = end;
        Some(lease)
    }

    pub(super) fn end(&mut self, slot: &str) -> Option<Lease> {
        let lease = self.leases.remove(slot)?;
        let end = lease.expires_at;
        self.ends.remove(&(end, slot.to_string()));
        if self.proxies.contains_key(&lease.proxy) {
            self.update_proxy(&lease.proxy, |p| p.ends.remove(end));
        }
        if let Some(c) = self.clients.get_mut(&lease.client) {
            c.remove(end);
            if c.len() == 0 {
                self.clients.remove(&lease.client);
            }
        }
        Some(lease)
    }
}
