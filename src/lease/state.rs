//! The store's maps under its one mutex, and the two ways a lease ends
//! (expiry, release) that keep them consistent.
//!
//! A lease is a fixed-size [`Record`] keyed by its 16-byte nonce: the proxy
//! shared by pointer, the client by a small number, times as milliseconds;
//! its signed id is derived again when it is answered, never stored
//! (docs/architecture.md, "The lease table").

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::bounds::{Caps, Cooldowns, StickyMap};
use super::index::{Ends, Index, ProxyState};
use super::released::Released;
use super::signed::NONCE_LEN;
use super::{
    ClientLimits, Lease, ProxyKey, MAX_COOLDOWN_SITES, MAX_COOLDOWN_SITES_PER_PROXY,
    MAX_SITE_REPORTS_PER_CLIENT, MAX_STICKY_KEYS, MAX_STICKY_KEYS_PER_PROXY,
};

/// What names a lease in the store: the nonce its ids carry.
pub(super) type Nonce = [u8; NONCE_LEN];

/// Milliseconds since the epoch of `t`.
pub(super) fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

/// The time of `ms` milliseconds since the epoch.
pub(super) fn at(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// A live lease as the store keeps it (32 bytes).
#[derive(Debug, Clone)]
pub(super) struct Record {
    /// The proxy, shared with its state and every other lease on it.
    pub(super) proxy: Arc<ProxyKey>,
    pub(super) granted_ms: i64,
    pub(super) expires_ms: i64,
    /// In [`Clients`].
    pub(super) client: u32,
}

/// A lease read out under the lock, answered after it (signing its id
/// needs no lock).
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub(super) nonce: Nonce,
    pub(super) proxy: Arc<ProxyKey>,
    pub(super) client: Arc<str>,
    pub(super) granted_ms: i64,
    pub(super) expires_ms: i64,
}

impl Held {
    /// The lease as answered, with `id`.
    pub(super) fn into_lease(self, id: String) -> Lease {
        Lease {
            id,
            proxy: (*self.proxy).clone(),
            granted_at: at(self.granted_ms),
            expires_at: at(self.expires_ms),
            client: self.client,
        }
    }
}

/// Clients (token names) by number, and their live leases' ends. A
/// number is never reused: clients are the few token names and the
/// names in ids this store's key signed.
#[derive(Debug, Default)]
pub(super) struct Clients {
    ids: HashMap<Arc<str>, u32>,
    names: Vec<(Arc<str>, Ends)>,
}

impl Clients {
    /// The number of `name`, given one when new.
    pub(super) fn intern(&mut self, name: &Arc<str>) -> u32 {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        let id = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        self.ids.insert(name.clone(), id);
        self.names.push((name.clone(), Ends::default()));
        id
    }

    fn get(&self, name: &str) -> Option<&Ends> {
        let id = self.ids.get(name)?;
        self.names.get(usize::try_from(*id).ok()?).map(|(_, e)| e)
    }

    /// The name of client `id`.
    pub(super) fn name(&self, id: u32) -> Arc<str> {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.names.get(i))
            .map_or_else(|| Arc::from(""), |(n, _)| n.clone())
    }

    pub(super) fn ends_mut(&mut self, id: u32) -> Option<&mut Ends> {
        let i = usize::try_from(id).ok()?;
        self.names.get_mut(i).map(|(_, e)| e)
    }

    /// Clients numbered.
    pub(super) fn len(&self) -> usize {
        self.names.len()
    }

    /// Live leases `name` holds.
    pub(super) fn held(&self, name: &str) -> u32 {
        self.get(name).map_or(0, Ends::len)
    }

    /// The earliest end of a lease `name` holds.
    pub(super) fn first_end(&self, name: &str) -> Option<DateTime<Utc>> {
        self.get(name).and_then(Ends::first)
    }

    /// Clients holding leases, with their ends.
    #[cfg(test)]
    pub(super) fn holding(&self) -> impl Iterator<Item = (&str, &Ends)> {
        self.names
            .iter()
            .filter(|(_, e)| e.len() > 0)
            .map(|(n, e)| (n.as_ref(), e))
    }
}

#[derive(Debug)]
pub(super) struct State {
    /// Live leases by nonce.
    pub(super) leases: HashMap<Nonce, Record>,
    /// Every lease by its end, so expiring is O(expired), not O(leases).
    pub(super) ends: BTreeSet<(i64, Nonce)>,
    /// Per proxy; change through [`State::update_proxy`] (keeps `index`).
    pub(super) proxies: HashMap<Arc<ProxyKey>, ProxyState>,
    /// The eligible proxies with room in fairness order, and those with
    /// leases by their earliest end (`index.rs`).
    pub(super) index: Index,
    /// `--max-leases-per-proxy`.
    pub(super) max: u32,
    pub(super) cooldowns: Cooldowns,
    pub(super) sticky: StickyMap,
    pub(super) clients: Clients,
    pub(super) grants: u64,
    /// Released here (`released.rs`).
    pub(super) released: Released,
    /// Horizons and the recovery window (`recovery.rs`).
    pub(super) recovery: super::recovery::Recovery,
    /// What each change touched (`log.rs`).
    pub(super) log: super::log::Log,
}

impl State {
    pub(super) fn new(limits: ClientLimits, max: u32) -> Self {
        State {
            index: Index::default(),
            max,
            clients: Clients::default(),
            leases: HashMap::new(),
            ends: BTreeSet::new(),
            proxies: HashMap::new(),
            cooldowns: Cooldowns::new(
                Caps {
                    total: MAX_COOLDOWN_SITES,
                    per_proxy: MAX_COOLDOWN_SITES_PER_PROXY,
                },
                MAX_SITE_REPORTS_PER_CLIENT,
                limits.global_cooldown_min_clients,
            ),
            sticky: StickyMap::new(Caps {
                total: MAX_STICKY_KEYS,
                per_proxy: MAX_STICKY_KEYS_PER_PROXY,
            }),
            grants: 0,
            released: Released::default(),
            recovery: Default::default(),
            log: Default::default(),
        }
    }

    /// Removes expired leases (their capacity comes back at once); returns
    /// how many ended. Cooldowns and sticky keys are left to
    /// [`LeaseStore::sweep`]: requests only compare their ends with now.
    pub(super) fn expire_leases(&mut self, now: DateTime<Utc>) -> usize {
        let now = ms(now);
        self.released.forget_until(now);
        let mut n = 0;
        while self.ends.first().is_some_and(|(end, _)| *end <= now) {
            if let Some((_, nonce)) = self.ends.pop_first() {
                n += usize::from(self.end(&nonce).is_some());
            }
        }
        n
    }

    /// Ends a lease by release: its ids are dead here until they expire.
    pub(super) fn release(&mut self, nonce: &Nonce) -> Option<Record> {
        let rec = self.end(nonce)?;
        self.released.remember(*nonce, rec.client, rec.expires_ms);
        Some(rec)
    }

    /// Remembers that `nonce` was released, until `end`: as long as any of
    /// its ids could be presented, however many are released meanwhile
    /// (bounded by the TTLs granted, `released.rs`). Its client is not
    /// known here: it counts in the store's total only.
    pub(super) fn remember_release(&mut self, nonce: Nonce, end: DateTime<Utc>) {
        self.released
            .remember(nonce, super::released::UNKNOWN_CLIENT, ms(end));
    }

    /// Released nonces by their end (rounded up to the second).
    pub(super) fn released(&self) -> impl Iterator<Item = (DateTime<Utc>, &Nonce)> {
        self.released.iter().map(|(end, n)| (at(end), n))
    }

    /// Whether `nonce` was released here and could still be presented.
    pub(super) fn was_released(&self, nonce: &Nonce) -> bool {
        self.released.contains(nonce)
    }

    /// The shared pointer of `key`, its state made when missing.
    pub(super) fn proxy(&mut self, key: &ProxyKey) -> Arc<ProxyKey> {
        if let Some((k, _)) = self.proxies.get_key_value(key) {
            return k.clone();
        }
        let k = Arc::new(key.clone());
        self.proxies.insert(k.clone(), ProxyState::default());
        k
    }

    /// Holds a new lease under `nonce`: counted on its proxy and client.
    pub(super) fn hold(&mut self, nonce: Nonce, rec: Record) {
        let end = rec.expires_ms;
        self.update_proxy(&rec.proxy, |p| p.ends.add(end));
        if let Some(e) = self.clients.ends_mut(rec.client) {
            e.add(end);
        }
        self.ends.insert((end, nonce));
        self.leases.insert(nonce, rec);
    }

    /// Moves the end of the lease of `nonce` to `end`.
    pub(super) fn move_end(&mut self, nonce: &Nonce, end: DateTime<Utc>) -> Option<&Record> {
        let end = ms(end);
        let rec = self.leases.get(nonce)?;
        let (old, proxy, client) = (rec.expires_ms, rec.proxy.clone(), rec.client);
        self.update_proxy(&proxy, |p| {
            p.ends.remove(old);
            p.ends.add(end);
        });
        if let Some(c) = self.clients.ends_mut(client) {
            c.remove(old);
            c.add(end);
        }
        self.ends.remove(&(old, *nonce));
        self.ends.insert((end, *nonce));
        let rec = self.leases.get_mut(nonce)?;
        rec.expires_ms = end;
        Some(rec)
    }

    pub(super) fn end(&mut self, nonce: &Nonce) -> Option<Record> {
        let rec = self.leases.remove(nonce)?;
        let end = rec.expires_ms;
        self.ends.remove(&(end, *nonce));
        if self.proxies.contains_key(&*rec.proxy) {
            self.update_proxy(&rec.proxy, |p| p.ends.remove(end));
        }
        if let Some(c) = self.clients.ends_mut(rec.client) {
            c.remove(end);
        }
        Some(rec)
    }

    /// The lease of `nonce`, read out to be answered.
    pub(super) fn held(&self, nonce: &Nonce) -> Option<Held> {
        let rec = self.leases.get(nonce)?;
        Some(Held {
            nonce: *nonce,
            proxy: rec.proxy.clone(),
            client: self.clients.name(rec.client),
            granted_ms: rec.granted_ms,
            expires_ms: rec.expires_ms,
        })
    }

    /// The latest end of a live lease.
    pub(super) fn latest_end(&self) -> Option<DateTime<Utc>> {
        self.ends.last().map(|(end, _)| at(*end))
    }
}
