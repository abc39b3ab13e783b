//! The lease store: in-memory leases and cooldowns of this replica, guarded
//! by one mutex, driven by an injectable clock. Choice, TTL bounds, capacity
//! and cooldown rules are pure; the HTTP layer only translates.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

mod bounds;
mod cooldowns;
use bounds::{digest, later};
pub use bounds::{
    MAX_COOLDOWN_SITES, MAX_COOLDOWN_SITES_PER_PROXY, MAX_SITE_REPORTS_PER_CLIENT, MAX_STICKY_KEYS,
    MAX_STICKY_KEYS_PER_PROXY, STICKY_IDLE,
};

mod clock;
pub mod demand;
mod index;
pub use clock::{Clock, FakeClock, SystemClock};
pub use index::Candidates;
use index::{sorted_keys, Whole};
mod retry;
pub use retry::{RETRY_DEFAULT, RETRY_MAX};
mod ttl;
pub use ttl::{validate_ttl, TtlError};
mod terms;
pub use terms::{AcquireRequest, ClientLimits, LeaseConfig, Outcome};

/// A proxy the caller found eligible (healthy and matching the filters).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProxyKey {
    /// Namespace of the Proxy.
    pub namespace: String,
    /// Name of the Proxy.
    pub name: String,
}

impl std::fmt::Display for ProxyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One granted lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Unguessable id.
    pub id: String,
    /// The leased proxy.
    pub proxy: ProxyKey,
    /// When it was granted.
    pub granted_at: DateTime<Utc>,
    /// When it ends unless renewed.
    pub expires_at: DateTime<Utc>,
    /// Who holds it: the name of the caller's token.
    pub client: Arc<str>,
}

/// Why nothing was granted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AcquireError {
    /// No healthy proxy matches the filters.
    #[error("no healthy proxy matches the request")]
    NoProxy,
    /// The client holds `--max-leases-per-client` leases already.
    #[error("this client holds {max} leases, the most one client may hold")]
    ClientLimit {
        /// The cap.
        max: u32,
    },
    /// Matching proxies exist but all are at capacity or cooling down.
    #[error("all {matching} matching proxies are at capacity ({at_capacity}) or cooling down ({cooling})")]
    NoCapacity {
        /// Healthy proxies matching the filters.
        matching: usize,
        /// Of those, at capacity.
        at_capacity: usize,
        /// Of those, cooling down (globally or for the site).
        cooling: usize,
    },
    /// A new leader's recovery window: leases the previous one granted may
    /// still be presented.
    #[error("a new leader is recovering the leases of the previous one; retry in {} s", wait.as_secs())]
    Recovering {
        /// Until grants resume.
        wait: Duration,
    },
    /// The store remembers [`MAX_LEASE_IDS`] live leases and released ids.
    #[error("the lease table holds {max} live and released leases, the most it keeps; retry once some end")]
    TableFull {
        /// The cap.
        max: usize,
    },
}

mod gateway;
use gateway::cool;
mod released;
pub use released::{CROWDED_TTL, MAX_LEASE_IDS, MAX_RELEASED, MAX_RELEASED_PER_CLIENT};
mod state;
use state::State;
mod delta;
mod log;
use log::Touched;
pub use log::MAX_LOG;
mod snapshot;
pub use snapshot::{unix_ms, LeaseEntry, Snapshot, SnapshotError, SNAPSHOT_VERSION};
pub mod wire;

mod ids;
pub use ids::random_id;
mod failover;
mod recovery;
pub use failover::{readmit_decision, Admission, Presented, Refusal};
pub use recovery::{grant_end, horizon, window_end, HeldUntil, HORIZON_ANNOTATION};
pub mod keyring;
pub mod signed;
pub use signed::LeaseKey;

/// The lease store.
pub struct LeaseStore {
    config: LeaseConfig,
    limits: ClientLimits,
    clock: Arc<dyn Clock>,
    /// Signs ids so another leader can take them in (a random key of this
    /// process's own until [`LeaseStore::with_key`] gives the shared one).
    key: LeaseKey,
    state: Mutex<State>,
    /// Counts take-overs: a follower's copy of the leader's table is not
    /// applied once this store took over since it asked.
    term: AtomicU64,
    /// Counts changes a follower's copy would miss (grants, renewals,
    /// releases, reports, leases taken in).
    version: AtomicU64,
    /// Wakes long polls on a change.
    changes: tokio::sync::Notify,
    /// The leader feed of the warm copy held (`snapshot.rs`).
    copied: Mutex<Option<String>>,
    /// What crawlers asked of the autoscaled pools (`demand.rs`).
    demand: demand::PoolDemand,
}

impl LeaseStore {
    /// A store with the system clock.
    pub fn new(config: LeaseConfig) -> Self {
        Self::with(config, Arc::new(SystemClock))
    }

    /// A store with a given clock (tests).
    pub fn with(config: LeaseConfig, clock: Arc<dyn Clock>) -> Self {
        LeaseStore {
            config,
            limits: ClientLimits::default(),
            clock,
            key: LeaseKey::random(),
            state: Mutex::new(State::new(
                ClientLimits::default(),
                config.max_leases_per_proxy,
            )),
            term: AtomicU64::new(0),
            version: AtomicU64::new(0),
            changes: tokio::sync::Notify::new(),
            copied: Mutex::new(None),
            demand: demand::PoolDemand::default(),
        }
    }

    /// What crawlers asked of the autoscaled ProxyPools: the lease API
    /// counts, the pool controller reads.
    pub fn demand(&self) -> &demand::PoolDemand {
        &self.demand
    }

    /// The same (empty) store with per-client limits.
    pub fn with_client_limits(self, limits: ClientLimits) -> Self {
        LeaseStore {
            limits,
            state: Mutex::new(State::new(limits, self.config.max_leases_per_proxy)),
            ..self
        }
    }

    /// The store's clock now.
    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// The limits in force.
    pub fn config(&self) -> LeaseConfig {
        self.config
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated
        // in a way that breaks invariants worse than losing the process.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Validates a requested TTL in seconds (`None`: the default TTL).
    pub fn ttl(&self, seconds: Option<i64>) -> Result<Duration, TtlError> {
        validate_ttl(seconds, self.config.default_ttl, self.config.max_ttl)
    }

    /// Grants a lease on one of `eligible` (healthy proxies matching the
    /// filters), which becomes the store's eligible set. Fair choice:
    /// fewest active leases, then least recently granted (never granted
    /// first), then namespace/name. A sticky key keeps its proxy while that
    /// one stays eligible and has capacity. O(eligible) to take the set in;
    /// the API tells the set once per listing ([`LeaseStore::set_eligible`])
    /// and asks [`LeaseStore::acquire_among`].
    pub fn acquire<K: std::borrow::Borrow<ProxyKey>>(
        &self,
        eligible: &[K],
        req: &AcquireRequest,
    ) -> Result<Lease, AcquireError> {
        let nonce = signed::random_bytes();
        let now = self.clock.now();
        let mut st = self.lock();
        let generation = st.next_generation();
        let _ = st.set_eligible(generation, sorted_keys(eligible));
        let all = Whole {
            generation,
            len: eligible.len(),
        };
        let held = self.grant(&mut st, (&all, nonce), req, now);
        drop(st);
        held.map(|h| self.answer(h))
    }

    /// Grants a lease on one of `c` (see [`LeaseStore::acquire`] for the
    /// order): O(log n) for the whole eligible set, plus the proxies
    /// skipped because they cool down or, for a filtered set, do not match.
    pub fn acquire_among(
        &self,
        c: &dyn Candidates,
        req: &AcquireRequest,
    ) -> Result<Lease, AcquireError> {
        let nonce = signed::random_bytes();
        let now = self.clock.now();
        let mut st = self.lock();
        let held = self.grant(&mut st, (c, nonce), req, now);
        drop(st);
        held.map(|h| self.answer(h))
    }

    /// The generation of the eligible set the store holds (`None`: none
    /// yet, or its table was replaced since).
    pub fn eligible_generation(&self) -> Option<u64> {
        self.lock().eligible_generation()
    }

    /// Tells the store the eligible set (healthy proxies) of listing
    /// `generation`; candidates of that listing then need no membership
    /// test. Sorted, without repeats; an older generation is ignored.
    pub fn set_eligible(&self, generation: u64, sorted: Vec<ProxyKey>) {
        let old = self.lock().set_eligible(generation, sorted);
        // Freed after the lock is let go: 10,000 keys are 20,000 strings.
        drop(old);
    }

    fn grant(
        &self,
        st: &mut State,
        (c, nonce): (&dyn Candidates, state::Nonce),
        req: &AcquireRequest,
        now: DateTime<Utc>,
    ) -> Result<state::Held, AcquireError> {
        st.expire_leases(now);
        let client = &req.client;
        let client_id = st.clients.intern(client);
        // A client (or store) holding its cap of released ids gets short
        // leases, so what it releases next is not remembered for long.
        let ttl = st.released.ttl_for(client_id, req.ttl);
        let expires_at = st.recovery.grant(now, ttl)?;
        if st.leases.len() + st.released.len() >= MAX_LEASE_IDS {
            return Err(AcquireError::TableFull { max: MAX_LEASE_IDS });
        }
        if c.is_empty() {
            return Err(AcquireError::NoProxy);
        }
        let max_own = self.limits.max_leases;
        if max_own > 0 && st.clients.held(client) >= max_own {
            return Err(AcquireError::ClientLimit { max: max_own });
        }
        let site = req.site.as_deref().map(digest);
        let sticky = req.sticky_key.as_ref().and_then(|s| st.sticky.get(s, now));
        let ask = index::Ask {
            sticky,
            site: site.as_ref(),
            client: client.as_ref(),
            now,
        };
        let chosen = st.choose(c, &ask)?;
        st.recovery.note(now, ttl);
        st.grants += 1;
        let seq = st.grants;
        st.update_proxy(&chosen, |p| p.last_granted = Some((now, seq)));
        if let Some(s) = &req.sticky_key {
            // Bounded: a key the map has no room for only loses stickiness.
            let _ = st
                .sticky
                .remember(s, &chosen, later(expires_at, STICKY_IDLE));
        }
        let record = state::Record {
            proxy: chosen,
            granted_ms: state::ms(now),
            expires_ms: state::ms(expires_at),
            client: client_id,
        };
        st.hold(nonce, record);
        let sticky = req
            .sticky_key
            .as_deref()
            .map(|k| Touched::Sticky(digest(k)));
        self.changed(st, std::iter::once(Touched::Lease(nonce)).chain(sticky));
        st.held(&nonce).ok_or(AcquireError::NoProxy)
    }

    /// The lease as answered: its id signs what it is now.
    fn answer(&self, h: state::Held) -> Lease {
        let id = signed::encode_parts(&self.key, h.expires_ms, &h.nonce, &h.proxy, &h.client);
        h.into_lease(id)
    }

    /// Extends a live lease to now + `ttl`; `None` when unknown or expired.
    /// With signed ids the answer carries a fresh id signing the new expiry.
    pub fn renew(&self, id: &str, ttl: Duration) -> Option<Lease> {
        let slot = self.slot(id)?;
        let now = self.clock.now();
        let mut st = self.lock();
        st.expire_leases(now);
        let rec = st.leases.get(&slot)?;
        let (old_end, ttl) = (
            state::at(rec.expires_ms),
            st.released.ttl_for(rec.client, ttl),
        );
        let end = st.recovery.renewal(now, ttl, old_end);
        st.move_end(&slot, end)?;
        let held = st.held(&slot)?;
        self.changed(&mut st, [Touched::Lease(slot)]);
        drop(st);
        Some(self.answer(held))
    }

    /// A live lease.
    pub fn get(&self, id: &str) -> Option<Lease> {
        self.get_by_nonce(&self.slot(id)?)
    }

    /// The nonce of the lease `id` names, when this store's key signed it:
    /// 16 bytes to remember a lease by (`replica::replay`) instead of its
    /// id of some 125.
    pub fn nonce_of(&self, id: &str) -> Option<[u8; signed::NONCE_LEN]> {
        self.slot(id)
    }

    /// [`LeaseStore::get`] by the lease's nonce ([`LeaseStore::nonce_of`]).
    pub fn get_by_nonce(&self, nonce: &[u8; signed::NONCE_LEN]) -> Option<Lease> {
        let now = self.clock.now();
        let mut st = self.lock();
        st.expire_leases(now);
        let held = st.held(nonce)?;
        drop(st);
        Some(self.answer(held))
    }

    /// Ends a lease; releasing an unknown or already released lease is not
    /// an error (returns false).
    pub fn release(&self, id: &str) -> bool {
        let Some(slot) = self.slot(id) else {
            return false;
        };
        let now = self.clock.now();
        let mut st = self.lock();
        st.expire_leases(now);
        let released = st.release(&slot).is_some();
        if released {
            self.changed(&mut st, [Touched::Lease(slot)]);
        }
        released
    }

    /// Records a client's report on a live lease (which it keeps). Blocked
    /// or failed puts the proxy in cooldown: for `site` when given, for all
    /// sites otherwise (for the lease's client at once, for every client
    /// once `global_cooldown_min_clients` distinct clients reported it).
    /// Returns the lease, or `None` when unknown.
    pub fn report(&self, id: &str, outcome: Outcome, site: Option<&str>) -> Option<Lease> {
        let slot = self.slot(id)?;
        let now = self.clock.now();
        let mut st = self.lock();
        st.expire_leases(now);
        let held = st.held(&slot)?;
        if outcome != Outcome::Ok {
            let until = later(now, self.config.cooldown);
            cool(&mut st, &held.proxy, &held.client, site, until);
            self.changed(&mut st, [Touched::Cooling(held.proxy.clone())]);
        }
        drop(st);
        Some(self.answer(held))
    }

    /// The background sweep: removes expired leases, cooldowns and sticky
    /// keys; returns the leases that ended.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        let mut st = self.lock();
        st.cooldowns.sweep(now);
        st.sticky.sweep(now);
        st.expire_leases(now)
    }

    /// Sticky keys and site cooldowns held (the abuse test's figures).
    pub fn held(&self) -> (usize, usize) {
        let st = self.lock();
        (st.sticky.len(), st.cooldowns.sites())
    }

    /// Live leases (expired ones not yet swept are not counted).
    pub fn active(&self) -> usize {
        let now = self.clock.now();
        let mut st = self.lock();
        st.expire_leases(now);
        st.leases.len()
    }

    /// Live leases per proxy, for the listing.
    pub fn active_on(&self, key: &ProxyKey) -> u32 {
        self.lock().proxies.get(key).map_or(0, |p| p.active())
    }

    /// Forgets everything about proxies not in `present` (deleted Proxies):
    /// their sticky mappings and cooldowns. Leases run out on their own.
    pub fn retain_proxies(&self, present: &std::collections::HashSet<ProxyKey>) {
        let mut st = self.lock();
        st.sticky.retain_proxies(present);
        st.cooldowns.retain_proxies(present);
        // An eligible proxy stays: its state is in the index.
        st.proxies
            .retain(|k, p| present.contains(&**k) || p.active() > 0 || p.eligible);
    }

    /// Forgets everything about the proxies in `gone` (deleted Proxies),
    /// as [`LeaseStore::retain_proxies`] does for those not present,
    /// without a pass over every proxy.
    pub fn forget_proxies(&self, gone: &std::collections::HashSet<ProxyKey>) {
        let mut st = self.lock();
        st.sticky.forget_proxies(gone);
        st.cooldowns.forget_proxies(gone);
        for k in gone {
            if st
                .proxies
                .get(k)
                .is_some_and(|p| p.active() == 0 && !p.eligible)
            {
                st.proxies.remove(k);
            }
        }
    }
}

#[cfg(test)]
mod caps_tests;
#[cfg(test)]
mod tests;
