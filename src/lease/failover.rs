//! The store's side of a leader change: signed ids name a lease by its
//! nonce (its slot), and a leader that does not know a presented id takes
//! it in again when the id checks out and its proxy has room
//! (docs/architecture.md, "Leases across leader changes").

use std::sync::Arc;

use super::signed::{self, LeaseKey};
use super::state::{ms, Nonce, Record};
use super::{Lease, LeaseStore, ProxyKey};

/// What a store made of a presented id before a GET, renew or report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// A lease this store holds.
    Known,
    /// Signed by the shared key, live, and taken in now.
    Readmitted(Lease),
    /// Signed and live, but not taken in.
    Refused(Refusal),
    /// Not a live lease id of the shared key (or ids are not signed).
    Unknown,
}

/// Why a signed, live id was not taken in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its proxy left the healthy set.
    Ineligible,
    /// Its proxy's table is full: others presented their ids first. Only a
    /// client that reused a released id can cause this.
    NoRoom,
    /// Its client holds `--max-leases-per-client` leases already: taking it
    /// in would let a client past its cap across a leader change.
    ClientLimit,
}

/// What a store knows when it is presented a signed, live lease it does
/// not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Presented {
    /// Its proxy is still offered.
    pub eligible: bool,
    /// Leases its proxy holds, of `max`.
    pub active: u32,
    /// `--max-leases-per-proxy`.
    pub max: u32,
    /// Leases its client holds, of `client_max` (0: no cap).
    pub held: u32,
    /// `--max-leases-per-client`.
    pub client_max: u32,
}

/// Whether a presented lease is taken in: first come, first served,
/// never past a proxy's capacity nor a client's cap.
pub fn readmit_decision(p: Presented) -> Result<(), Refusal> {
    if !p.eligible {
        return Err(Refusal::Ineligible);
    }
    if p.active >= p.max {
        return Err(Refusal::NoRoom);
    }
    if p.client_max > 0 && p.held >= p.client_max {
        return Err(Refusal::ClientLimit);
    }
    Ok(())
}

impl LeaseStore {
    /// The same (empty) store signing its ids with `key`.
    pub fn with_key(self, key: LeaseKey) -> Self {
        LeaseStore { key, ..self }
    }

    /// The nonce of a presented id when its tag checks out; `None`: no
    /// lease of ours.
    pub(super) fn slot(&self, id: &str) -> Option<Nonce> {
        signed::open(&self.key, id).ok().map(|c| c.nonce)
    }

    /// Makes sure the lease of `id` is held when it can be: a live id
    /// signed by the shared key that this store does not hold (another
    /// leader granted it) is taken in as if granted here, when `eligible`
    /// says its proxy is still offered and the proxy has room.
    pub fn admit(&self, id: &str, eligible: impl Fn(&ProxyKey) -> bool) -> Admission {
        let now = self.clock.now();
        let Ok(c) = signed::verify(&self.key, id, now) else {
            return Admission::Unknown;
        };
        let nonce = c.nonce;
        let mut st = self.lock();
        st.expire_leases(now);
        if st.leases.contains_key(&nonce) {
            return Admission::Known;
        }
        if st.was_released(&nonce) {
            return Admission::Unknown;
        }
        let presented = Presented {
            eligible: eligible(&c.proxy),
            active: st.proxies.get(&c.proxy).map_or(0, |p| p.active()),
            max: self.config.max_leases_per_proxy,
            held: st.clients.held(&c.client),
            client_max: self.limits.max_leases,
        };
        if let Err(why) = readmit_decision(presented) {
            return Admission::Refused(why);
        }
        let client: Arc<str> = Arc::from(c.client.as_str());
        let record = Record {
            proxy: st.proxy(&c.proxy),
            granted_ms: ms(now),
            expires_ms: c.expires_ms,
            client: st.clients.intern(&client),
        };
        st.hold(nonce, record);
        self.changed(&mut st, [super::Touched::Lease(nonce)]);
        drop(st);
        Admission::Readmitted(Lease {
            id: id.to_string(),
            expires_at: c.expires_at(),
            proxy: c.proxy,
            granted_at: now,
            client,
        })
    }
}

#[cfg(test)]
#[path = "failover_tests.rs"]
mod tests;
