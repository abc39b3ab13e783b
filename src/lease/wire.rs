//! A [`Snapshot`] as bytes, for the hand-over Secrets and the feed between
//! replicas: a 4-byte mark, then postcard (varints, nonces and digests as
//! their 16 bytes, no field names): about 27 bytes a lease, where the
//! JSON of version 1 took 68. Version 1 is still read, so a hand-over
//! written by the release before is taken in by the one that replaces it.
//!
//! [`max_bytes`] bounds what a store at its caps encodes to; the
//! hand-over's Secrets and the feed's answer limit are sized from it
//! (docs/architecture.md, "Sized from the caps").

use std::collections::HashMap;

use serde::Deserialize;

use super::bounds::KeyDigest;
use super::signed::nonce_of;
use super::snapshot::{
    cooldown_entries, lease_entry_left, ms_left, Snapshot, SnapshotError, Table, SNAPSHOT_VERSION,
};
use super::state::at;

/// The most any lease state is sent or written as: 64 Secrets of
/// 1,000,000 bytes (the hand-over's), and a follower's feed limit at most.
pub const CEILING: usize = 64_000_000;

/// Proxies and clients a limit allows for at least, whatever the store
/// knows of yet: a follower that just started knows none.
const FLEET: usize = 10_000;
const CLIENTS: usize = 1_000;

/// What starts version 2's bytes (never `{`, which starts version 1's).
const MARK: &[u8; 4] = b"EPL\x02";

/// `s` as bytes, allocated once at their size.
pub fn encode(s: &Snapshot) -> Vec<u8> {
    // Serializing fails only for a length past a varint, which no usize
    // is; the mark alone then reads as unreadable, never as another state.
    let size = postcard::serialize_with_flavor(s, postcard::ser_flavors::Size::default());
    let mut out = Vec::with_capacity(MARK.len() + size.unwrap_or(0));
    out.extend_from_slice(MARK);
    postcard::to_extend(s, out).unwrap_or_else(|_| MARK.to_vec())
}

/// `v` appended to `out` as postcard writes it.
pub fn put<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
    // Entries fit a small buffer; tables and names go through a Vec. An
    // error is a length past a varint, which no usize is.
    let mut buf = [0u8; 64];
    match postcard::to_slice(v, &mut buf) {
        Ok(used) => out.extend_from_slice(used),
        Err(_) => out.extend(postcard::to_allocvec(v).unwrap_or_default()),
    }
}

/// What [`super::LeaseStore::export_body`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exported {
    /// The store's version the table is at.
    pub version: u64,
    /// Live leases.
    pub leases: usize,
    /// Released ids still remembered.
    pub released: usize,
}

/// The snapshot in `bytes`: version 2, or version 1's JSON taken in as
/// version 2.
pub fn decode(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
    if let Some(rest) = bytes.strip_prefix(MARK.as_slice()) {
        return postcard::from_bytes(rest).map_err(|e| SnapshotError::Unreadable(e.to_string()));
    }
    if bytes.first() == Some(&b'{') {
        let v1: V1 =
            serde_json::from_slice(bytes).map_err(|e| SnapshotError::Unreadable(e.to_string()))?;
        return v1.upgrade();
    }
    Err(SnapshotError::Unreadable(
        "neither lease state format 2 nor 1".into(),
    ))
}

/// What a store holds at most, for [`max_bytes`]: its caps and the fleet.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Live leases and released ids together ([`super::MAX_LEASE_IDS`]).
    pub ids: usize,
    /// Sticky keys ([`super::MAX_STICKY_KEYS`]).
    pub sticky: usize,
    /// Site cooldown entries ([`super::MAX_COOLDOWN_SITES`]).
    pub sites: usize,
    /// Reports one site cooldown or one proxy's global cooldown keeps
    /// (`--global-cooldown-min-clients`).
    pub quorum: usize,
    /// Proxies in the fleet.
    pub proxies: usize,
    /// Clients (token names).
    pub clients: usize,
}

/// The most a varint of each width takes.
const U32: usize = 5;
const U64: usize = 10;
/// A Kubernetes namespace, a Proxy's name, a token's name at their longest.
const NAMESPACE: usize = 63;
const NAME: usize = 253;

/// The most bytes a store holding `z` encodes to, every number at its
/// widest and every name at its longest.
pub const fn max_bytes(z: Sizes) -> usize {
    let lease = 16 + U32 + U32 + U64 + U64;
    let sticky = 16 + U32 + U64;
    let site = U32 + 16 + U64;
    let report = U32 + 16 + U32 + U64;
    let global = U32 + U32 + U64;
    let proxy = U32 + NAMESPACE + U32 + NAME;
    let client = U32 + NAME;
    // The mark, the version, the options and fourteen lengths.
    let head = MARK.len() + U32 + 2 * (1 + 2 * U64) + 14 * U64;
    head + z.ids * lease
        + z.sticky * sticky
        + z.sites * (site + z.quorum * report)
        + z.proxies * (proxy + z.quorum * global)
        + z.clients * client
}

impl super::LeaseStore {
    /// The whole table as [`encode`] writes it, mark and all, straight
    /// from the store; see [`Self::export_body`].
    pub fn export_encoded(&self) -> (Exported, Vec<u8>) {
        self.export_body(MARK.to_vec())
    }

    /// Appends to `out` the whole table as postcard writes a
    /// [`Snapshot`] of it ([`super::LeaseStore::export`]), written
    /// straight from the store's maps under its lock: no copy of the
    /// table is made but its bytes (a snapshot of a table at its caps was
    /// 30 MB besides its 16.6 MB of bytes). The proxies and clients the
    /// entries name by index are numbered as they are met and written
    /// last, which is why a snapshot ends with them.
    pub fn export_body(&self, mut out: Vec<u8>) -> (Exported, Vec<u8>) {
        let now = self.clock.now();
        let mut st = self.lock();
        st.expire_leases(now);
        let version = st.log.version();
        let released = st.released().count();
        let sticky = st.sticky.live(now).count();
        // Reserved at the widest: what is never written is never touched,
        // so it costs address space, not memory.
        let widest = 16 + U32 + U32 + U64 + U64;
        out.reserve(st.leases.len() * widest + released * (16 + U64) + sticky * widest);
        let mut t = Table::default();
        put(&mut out, &SNAPSHOT_VERSION);
        // Every count is written before its entries, so each entry is
        // written whatever its time left (1 ms at least): the ones ending
        // now were taken out under this lock.
        put(&mut out, &st.leases.len());
        for (nonce, l) in &st.leases {
            let left = ms_left(now, at(l.expires_ms)).unwrap_or(1);
            put(
                &mut out,
                &lease_entry_left(&st, &mut t, (nonce, l), now, left),
            );
        }
        put(&mut out, &released);
        for (end, nonce) in st.released() {
            put(&mut out, &(nonce, ms_left(now, end).unwrap_or(1)));
        }
        put(&mut out, &sticky);
        for (d, p, until) in st.sticky.live(now) {
            put(&mut out, &(d, t.of(p), ms_left(now, until).unwrap_or(1)));
        }
        let mut c = Snapshot::default();
        for live in st.cooldowns.live(now) {
            cooldown_entries(&mut c, &mut t, live, now);
        }
        put(&mut out, &c.global);
        put(&mut out, &c.sites);
        put(&mut out, &c.site_reports);
        put(&mut out, &st.recovery.longest_left(now));
        put(&mut out, &st.recovery.window_left(now));
        // `ended`, `unstuck`, `cooled`: a whole table has none.
        let none: &[u8] = &[];
        put(&mut out, none);
        put(&mut out, none);
        put(&mut out, none);
        put(&mut out, &t.list);
        put(&mut out, &t.clients);
        let exported = Exported {
            version,
            leases: st.leases.len(),
            released,
        };
        (exported, out)
    }

    /// The most this store's state encodes to at its caps: its quorum,
    /// the proxies and clients it knows (at least 10,000 and 1,000), up
    /// to [`CEILING`]. A follower takes a table up to this size.
    pub fn state_limit(&self) -> usize {
        let st = self.lock();
        let z = Sizes {
            ids: super::MAX_LEASE_IDS,
            sticky: super::MAX_STICKY_KEYS,
            sites: super::MAX_COOLDOWN_SITES,
            quorum: self.limits.global_cooldown_min_clients.max(1),
            proxies: st.proxies.len().max(FLEET),
            clients: st.clients.len().max(CLIENTS),
        };
        max_bytes(z).min(CEILING)
    }
}

/// Version 1: JSON, nonces as slots, digests in base64, clients by name,
/// a lease's site (no longer kept).
#[derive(Deserialize)]
struct V1 {
    v: u32,
    proxies: Vec<(String, String)>,
    leases: Vec<(String, u32, String, u64, u64, Option<String>)>,
    released: Vec<(String, u64)>,
    sticky: Vec<(String, u32, u64)>,
    global: Vec<(u32, String, u64)>,
    sites: Vec<(u32, String, u64)>,
    #[serde(default)]
    site_reports: Vec<(u32, String, String, u64)>,
    longest: Option<(u64, u64)>,
    #[serde(default)]
    window: Option<u64>,
}

fn digest(s: &str) -> Result<KeyDigest, SnapshotError> {
    data_encoding::BASE64URL_NOPAD
        .decode(s.as_bytes())
        .ok()
        .and_then(|b| KeyDigest::try_from(b).ok())
        .ok_or(SnapshotError::Inconsistent("a digest is malformed"))
}

fn nonce(slot: &str) -> Result<[u8; 16], SnapshotError> {
    nonce_of(slot).ok_or(SnapshotError::Inconsistent("a lease slot is malformed"))
}

/// Numbers client names in the order first met.
#[derive(Default)]
struct Names(HashMap<String, u32>, Vec<String>);

impl Names {
    fn of(&mut self, name: String) -> u32 {
        let next = u32::try_from(self.1.len()).unwrap_or(u32::MAX);
        *self.0.entry(name.clone()).or_insert_with(|| {
            self.1.push(name);
            next
        })
    }
}

impl V1 {
    fn upgrade(self) -> Result<Snapshot, SnapshotError> {
        if self.v != 1 {
            return Err(SnapshotError::Version(self.v));
        }
        let mut c = Names::default();
        let mut s = Snapshot {
            v: SNAPSHOT_VERSION,
            proxies: self.proxies,
            longest: self.longest,
            window: self.window,
            ..Snapshot::default()
        };
        for (slot, p, client, left, age, _site) in self.leases {
            s.leases.push((nonce(&slot)?, p, c.of(client), left, age));
        }
        for (slot, left) in self.released {
            s.released.push((nonce(&slot)?, left));
        }
        for (d, p, left) in self.sticky {
            s.sticky.push((digest(&d)?, p, left));
        }
        for (p, client, left) in self.global {
            s.global.push((p, c.of(client), left));
        }
        for (p, d, left) in self.sites {
            s.sites.push((p, digest(&d)?, left));
        }
        for (p, d, client, left) in self.site_reports {
            s.site_reports.push((p, digest(&d)?, c.of(client), left));
        }
        s.clients = c.1;
        Ok(s)
    }
}
