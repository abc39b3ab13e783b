//! The store's whole state as a value, for a planned hand-over: a leader
//! that stops on purpose exports it, the next leader imports it and grants
//! at once, with no recovery window (docs/architecture.md, "Hand-over").
//!
//! A follower keeps such a copy of the leader's table, taken whole on
//! joining and kept by deltas after (`delta.rs`, `replica::copy`); the
//! store's term and change log tell when.
//!
//! Every time is kept as a duration from the export, never as a wall-clock
//! date: the importer counts it from its own clock, so clock skew between
//! replicas cannot shorten a lease, a cooldown or a released id's memory.
//! The time the snapshot spends in transit is added to each (the importer
//! does not know it), which only errs on the safe side. Sticky keys and
//! sites are kept as the digests the store holds, never as sent.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::bounds::{later, KeyDigest};
use super::cooldowns::LiveCooldown;
use super::state::{self, Nonce, Record, State};
use super::{LeaseStore, ProxyKey, Touched};

/// The format's version. An importer takes this one, and version 1 (the
/// JSON of earlier releases, `wire::decode`) so that a hand-over written
/// by the release before survives the rollout that replaces it.
pub const SNAPSHOT_VERSION: u32 = 2;

/// A lease store's state, times relative to the export. Nonces and
/// digests are kept as the 16 bytes the store holds, proxies and clients
/// by their index in the tables below; encoded with `wire::encode` a
/// lease takes about 27 bytes (`wire::max_bytes` bounds the whole).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// [`SNAPSHOT_VERSION`].
    pub v: u32,
    /// Live leases: (nonce, proxy, client, ms left, ms since granted).
    pub leases: Vec<LeaseEntry>,
    /// Released nonces that could still be presented: (nonce, ms left).
    pub released: Vec<(Nonce, u64)>,
    /// Sticky keys: (key digest, proxy, ms left).
    pub sticky: Vec<(KeyDigest, u32, u64)>,
    /// Global cooldown reports: (proxy, client, ms left).
    pub global: Vec<(u32, u32, u64)>,
    /// Site cooldowns withheld from every client (enough clients agreed):
    /// (proxy, site digest, ms left).
    pub sites: Vec<(u32, KeyDigest, u64)>,
    /// Clients' own site reports: (proxy, site digest, client, ms left).
    pub site_reports: Vec<(u32, KeyDigest, u32, u64)>,
    /// The longest TTL granted recently and ms left of its count, so the
    /// next leader's horizons still cover it.
    pub longest: Option<(u64, u64)>,
    /// Ms left of the exporter's own recovery window: the leases of the
    /// leader before it may still be presented, so the importer waits too.
    pub window: Option<u64>,
    /// A delta's leases that ended without a release (expired on the
    /// leader).
    pub ended: Vec<Nonce>,
    /// A delta's sticky keys the leader holds no more.
    pub unstuck: Vec<KeyDigest>,
    /// A delta's proxies whose cooldowns it carries whole (none left when
    /// it carries none).
    pub cooled: Vec<u32>,
    /// Proxies named above by their index here: (namespace, name). Last,
    /// as clients: the entries name them as they are written
    /// (`wire::export_body`).
    pub proxies: Vec<(String, String)>,
    /// Clients (token names) named above by their index here.
    pub clients: Vec<String>,
}

/// A lease in a snapshot: (nonce, proxy, client, ms left, ms since
/// granted).
pub type LeaseEntry = (Nonce, u32, u32, u64, u64);

/// Why a snapshot was not imported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// Written by another version of the format.
    #[error("lease state format version {0} is not {SNAPSHOT_VERSION}")]
    Version(u32),
    /// An entry names a proxy past the table, or a digest is malformed.
    #[error("lease state is inconsistent: {0}")]
    Inconsistent(&'static str),
    /// The bytes do not parse.
    #[error("lease state is unreadable: {0}")]
    Unreadable(String),
}

pub(super) fn ms_left(now: DateTime<Utc>, end: DateTime<Utc>) -> Option<u64> {
    let ms = (end - now).num_milliseconds();
    u64::try_from(ms).ok().filter(|ms| *ms > 0)
}

fn after(now: DateTime<Utc>, ms: u64) -> DateTime<Utc> {
    later(now, Duration::from_millis(ms))
}

/// A live lease as a snapshot entry (`None` once it ended).
pub(super) fn lease_entry(
    st: &State,
    t: &mut Table,
    (nonce, l): (&Nonce, &Record),
    now: DateTime<Utc>,
) -> Option<LeaseEntry> {
    let left = ms_left(now, state::at(l.expires_ms))?;
    Some(lease_entry_left(st, t, (nonce, l), now, left))
}

/// A lease as a snapshot entry with `left` ms left.
pub(super) fn lease_entry_left(
    st: &State,
    t: &mut Table,
    (nonce, l): (&Nonce, &Record),
    now: DateTime<Utc>,
    left: u64,
) -> LeaseEntry {
    let age = u64::try_from(state::ms(now).saturating_sub(l.granted_ms)).unwrap_or(0);
    let client = t.client(&st.clients.name(l.client));
    (*nonce, t.of(&l.proxy), client, left, age)
}

/// One proxy's live cooldowns into `s`.
pub(super) fn cooldown_entries(
    s: &mut Snapshot,
    t: &mut Table,
    c: LiveCooldown<'_>,
    now: DateTime<Utc>,
) {
    let i = t.of(c.proxy);
    for (who, until) in c.global {
        let left = ms_left(now, until);
        s.global.extend(left.map(|l| (i, t.client(who), l)));
    }
    for (d, until) in c.sites {
        s.sites.extend(ms_left(now, until).map(|l| (i, *d, l)));
    }
    for (d, who, until) in c.site_reports {
        let entry = ms_left(now, until).map(|l| (i, *d, t.client(who), l));
        s.site_reports.extend(entry);
    }
}

/// How a lease the store holds takes the end a snapshot gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ends {
    /// The later of the two (a hand-over: nothing is shortened).
    Later,
    /// The snapshot's (a follower's delta: the leader's table is the truth).
    Exact,
}

/// Numbers proxies and clients in the order first met.
#[derive(Default)]
pub(super) struct Table {
    index: BTreeMap<ProxyKey, u32>,
    pub(super) list: Vec<(String, String)>,
    client_index: HashMap<Arc<str>, u32>,
    pub(super) clients: Vec<String>,
}

impl Table {
    pub(super) fn of(&mut self, p: &ProxyKey) -> u32 {
        if let Some(i) = self.index.get(p) {
            return *i;
        }
        let i = u32::try_from(self.list.len()).unwrap_or(u32::MAX);
        self.index.insert(p.clone(), i);
        self.list.push((p.namespace.clone(), p.name.clone()));
        i
    }

    pub(super) fn client(&mut self, name: &Arc<str>) -> u32 {
        if let Some(i) = self.client_index.get(name) {
            return *i;
        }
        let i = u32::try_from(self.clients.len()).unwrap_or(u32::MAX);
        self.client_index.insert(name.clone(), i);
        self.clients.push(name.to_string());
        i
    }

    /// Puts the tables into `s`.
    pub(super) fn into(self, s: &mut Snapshot) {
        s.proxies = self.list;
        s.clients = self.clients;
    }
}

impl LeaseStore {
    /// Take-overs so far ([`LeaseStore::replace`]).
    pub fn term(&self) -> u64 {
        self.term.load(Ordering::SeqCst)
    }

    /// Changes so far: a follower's copy is up to date while it is the same.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    /// When the change after version `after` was made, by this process's
    /// clock (Unix ms): how old a member's copy is that asks from `after`.
    pub fn changed_at(&self, after: u64) -> Option<u64> {
        self.lock().log.made_at(after + 1)
    }

    /// Logs what a change touched, under the lock that made it: the
    /// version and the log move together.
    pub(super) fn changed(&self, st: &mut State, touched: impl IntoIterator<Item = Touched>) {
        let before = st.log.version();
        for t in touched {
            st.log.push(t);
        }
        let after = st.log.version();
        if after != before {
            st.log.stamp(before + 1, unix_ms());
            self.version.store(after, Ordering::SeqCst);
            self.changes.notify_waiters();
        }
    }

    /// A change the log cannot name (a table taken in whole): members
    /// behind it are sent the whole table.
    fn changed_whole(&self, st: &mut State) {
        let v = st.log.version() + 1;
        st.log.restart(v);
        self.version.store(v, Ordering::SeqCst);
        self.changes.notify_waiters();
    }

    /// Waits until the version is past `seen`, at most `limit`; whether it
    /// is (a follower's long poll, answered in `discovery::feed`).
    pub async fn changed_since(&self, seen: u64, limit: Duration) -> bool {
        let wake = self.changes.notified();
        tokio::pin!(wake);
        // Registered before the version is read: a change in between wakes it.
        wake.as_mut().enable();
        if self.version() != seen {
            return true;
        }
        let _ = tokio::time::timeout(limit, wake).await;
        self.version() != seen
    }

    /// The leader feed the warm copy in this store came from
    /// ([`LeaseStore::replace`]), until this store takes over.
    pub fn copied_from(&self) -> Option<String> {
        self.copied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Everything live at this moment, for the next leader.
    pub fn export(&self) -> Snapshot {
        self.export_versioned().1
    }

    /// [`LeaseStore::export`] with the version the table is at.
    pub fn export_versioned(&self) -> (u64, Snapshot) {
        let now = self.clock.now();
        let mut st = self.lock();
        st.expire_leases(now);
        let version = st.log.version();
        let mut t = Table::default();
        // Sized up front: grown by doubling, a table at its caps would
        // take half again as much while it is copied.
        let mut s = Snapshot {
            v: SNAPSHOT_VERSION,
            leases: Vec::with_capacity(st.leases.len()),
            released: Vec::with_capacity(st.released.len()),
            sticky: Vec::with_capacity(st.sticky.len()),
            ..Default::default()
        };
        for (nonce, l) in &st.leases {
            s.leases.extend(lease_entry(&st, &mut t, (nonce, l), now));
        }
        s.released = st
            .released()
            .filter_map(|(end, nonce)| Some((*nonce, ms_left(now, end)?)))
            .collect();
        for (d, p, until) in st.sticky.live(now) {
            if let Some(left) = ms_left(now, until) {
                s.sticky.push((*d, t.of(p), left));
            }
        }
        for c in st.cooldowns.live(now) {
            cooldown_entries(&mut s, &mut t, c, now);
        }
        s.longest = st.recovery.longest_left(now);
        s.window = st.recovery.window_left(now);
        t.into(&mut s);
        (version, s)
    }

    /// Takes in `s`, exported by the previous leader, as if every lease,
    /// release, cooldown and sticky key had happened here. A lease this
    /// store holds keeps the later of the two ends; one `s` released ends
    /// here too. Past the store's caps an entry is not kept, as it would
    /// not have been here.
    pub fn import(&self, s: &Snapshot) -> Result<(), SnapshotError> {
        let plan = Plan::of(s)?;
        let now = self.clock.now();
        let mut st = self.lock();
        st.expire_leases(now);
        self.apply(&mut st, &plan, s, (now, Ends::Later));
        self.changed_whole(&mut st);
        Ok(())
    }

    /// A follower's warm copy: the store becomes `s` (the leader's state)
    /// as a whole, unless this store took over since `term` was read
    /// ([`LeaseStore::term`]): then it leads, and its table is its own.
    /// `feed` names the leader's feed it came from ([`Self::copied_from`]).
    pub fn replace(&self, s: &Snapshot, term: u64, feed: &str) -> Result<bool, SnapshotError> {
        let plan = Plan::of(s)?;
        let now = self.clock.now();
        let mut st = self.lock();
        if self.term() != term {
            return Ok(false);
        }
        let mut recovery = std::mem::take(&mut st.recovery);
        *st = super::state::State::new(self.limits, self.config.max_leases_per_proxy);
        // The leader's window is the copy's: its own window, if any, is over.
        recovery.clear_window();
        st.recovery = recovery;
        // Versions go on counting: a take-over serves from here.
        st.log.restart(self.version());
        self.apply(&mut st, &plan, s, (now, Ends::Later));
        *self.copied.lock().unwrap_or_else(|p| p.into_inner()) = Some(feed.to_string());
        Ok(true)
    }

    pub(super) fn apply(
        &self,
        st: &mut State,
        plan: &Plan,
        s: &Snapshot,
        (now, ends): (DateTime<Utc>, Ends),
    ) {
        // Indices checked by `Plan::of`: every one is in its table.
        let clients: Vec<u32> = plan.clients.iter().map(|c| st.clients.intern(c)).collect();
        let proxy = |i: &u32| &plan.proxies[*i as usize];
        let client = |i: &u32| &plan.clients[*i as usize];
        for (nonce, p, c, left, age) in &s.leases {
            let end = after(now, *left);
            if let Some(held) = st.leases.get(nonce).map(|l| l.expires_ms) {
                if ends == Ends::Exact || held < state::ms(end) {
                    st.move_end(nonce, end);
                }
                continue;
            }
            if st.was_released(nonce) {
                continue;
            }
            let age = i64::try_from(*age).unwrap_or(0);
            let record = state::Record {
                proxy: st.proxy(proxy(p)),
                granted_ms: state::ms(now).saturating_sub(age),
                expires_ms: state::ms(end),
                client: clients[*c as usize],
            };
            st.hold(*nonce, record);
        }
        for (nonce, left) in &s.released {
            st.end(nonce);
            st.remember_release(*nonce, after(now, *left));
        }
        for (d, p, left) in &s.sticky {
            // Bounded as a grant is: a key past the caps loses stickiness.
            let _ = st.sticky.remember_digest(*d, proxy(p), after(now, *left));
        }
        // Bounded as a report is: past the caps an entry is not kept.
        for (p, d, left) in &s.sites {
            let _ = st
                .cooldowns
                .put_site_everyone(proxy(p), *d, after(now, *left));
        }
        for (p, d, c, left) in &s.site_reports {
            let _ = st
                .cooldowns
                .put_site_digest(proxy(p), *d, client(c), after(now, *left));
        }
        for (p, c, left) in &s.global {
            st.cooldowns
                .put_global(proxy(p), client(c), after(now, *left));
        }
        if let Some(left) = s.window {
            st.recovery.extend_window(after(now, left));
        }
        if let Some((ttl, left)) = s.longest {
            st.recovery
                .count_longest(now, Duration::from_millis(ttl), left);
        }
    }
}

/// A snapshot checked whole: every index names an entry of its table,
/// so a bad snapshot changes nothing. The entries themselves are read
/// from the snapshot, never copied (a table at its caps is 16 MB).
pub(super) struct Plan {
    proxies: Vec<ProxyKey>,
    clients: Vec<Arc<str>>,
    pub(super) cooled: HashSet<ProxyKey>,
}

impl Plan {
    pub(super) fn of(s: &Snapshot) -> Result<Self, SnapshotError> {
        if s.v != SNAPSHOT_VERSION {
            return Err(SnapshotError::Version(s.v));
        }
        let (np, nc) = (s.proxies.len(), s.clients.len());
        let proxy = |i: &u32| match usize::try_from(*i).is_ok_and(|i| i < np) {
            true => Ok(()),
            false => Err(SnapshotError::Inconsistent("an entry names no proxy")),
        };
        let client = |i: &u32| match usize::try_from(*i).is_ok_and(|i| i < nc) {
            true => Ok(()),
            false => Err(SnapshotError::Inconsistent("an entry names no client")),
        };
        for (_, p, c, _, _) in &s.leases {
            proxy(p).and(client(c))?;
        }
        for (_, p, _) in &s.sticky {
            proxy(p)?;
        }
        for (p, _, _) in &s.sites {
            proxy(p)?;
        }
        for (p, _, c, _) in &s.site_reports {
            proxy(p).and(client(c))?;
        }
        for (p, c, _) in &s.global {
            proxy(p).and(client(c))?;
        }
        for p in &s.cooled {
            proxy(p)?;
        }
        let proxies: Vec<ProxyKey> = s
            .proxies
            .iter()
            .map(|(namespace, name)| ProxyKey {
                namespace: namespace.clone(),
                name: name.clone(),
            })
            .collect();
        let cooled = s
            .cooled
            .iter()
            .map(|p| proxies[*p as usize].clone())
            .collect();
        Ok(Plan {
            clients: s.clients.iter().map(|c| Arc::from(c.as_str())).collect(),
            proxies,
            cooled,
        })
    }
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
pub(super) mod tests;

/// Now, in Unix milliseconds (0 before 1970).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
