//! The store's side of a leader change: signed ids name a lease by its
//! nonce (its slot), and a leader that does not know a presented id takes
//! it in again when the id checks out and its proxy has room
//! (docs/architecture.md, "Leases across leader changes").

use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::signed::{self, Claims, LeaseKey, NONCE_LEN};
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

/// The id of `lease` (slot `slot`) signing its current expiry.
pub(super) fn resign(key: &LeaseKey, slot: &str, lease: &Lease) -> String {
    let nonce = data_encoding::BASE32_NOPAD
        .decode(slot.to_ascii_uppercase().as_bytes())
        .ok()
        .and_then(|b| <[u8; NONCE_LEN]>::try_from(b).ok())
        // Slots of a signing store are always encoded nonces.
        .unwrap_or_default();
    signed::encode(
        key,
        &claims(&lease.proxy, &lease.client, lease.expires_at, nonce),
    )
}

fn claims(
    proxy: &ProxyKey,
    client: &str,
    expires_at: DateTime<Utc>,
    nonce: [u8; NONCE_LEN],
) -> Claims {
    Claims {
        proxy: proxy.clone(),
        client: client.to_string(),
        expires_ms: expires_at.timestamp_millis(),
        nonce,
    }
}

impl LeaseStore {
    /// The same (empty) store signing its ids with `key`.
    pub fn with_key(self, key: LeaseKey) -> Self {
        LeaseStore {
            key: Some(key),
            ..self
        }
    }

    /// The slot of a presented id: its nonce when the tag checks out, the
    /// id itself when ids are not signed; `None`: no lease of ours.
    pub(super) fn slot(&self, id: &str) -> Option<String> {
        match &self.key {
            Some(key) => signed::open(key, id).ok().map(|c| c.slot()),
            None => Some(id.to_string()),
        }
    }

    /// The random part of a new lease, drawn before the store's lock is
    /// taken (a system call that no other request needs to wait for).
    pub(super) fn fresh(&self) -> Fresh {
        match &self.key {
            Some(_) => Fresh::Nonce(signed::random_bytes()),
            None => Fresh::Id((self.ids)()),
        }
    }

    /// (slot, id) of a new lease, from its `fresh` random part.
    pub(super) fn mint(
        &self,
        proxy: &ProxyKey,
        client: &str,
        expires_at: DateTime<Utc>,
        fresh: Fresh,
    ) -> (String, String) {
        match (&self.key, fresh) {
            (Some(key), Fresh::Nonce(nonce)) => {
                let c = claims(proxy, client, expires_at, nonce);
                (c.slot(), signed::encode(key, &c))
            }
            (Some(key), Fresh::Id(_)) => {
                let c = claims(proxy, client, expires_at, signed::random_bytes());
                (c.slot(), signed::encode(key, &c))
            }
            (None, Fresh::Id(id)) => (id.clone(), id),
            (None, Fresh::Nonce(_)) => {
                let id = (self.ids)();
                (id.clone(), id)
            }
        }
    }

    /// Makes sure the lease of `id` is held when it can be: a live id
    /// signed by the shared key that this store does not hold (another
    /// leader granted it) is taken in as if granted here, when `eligible`
    /// says its proxy is still offered and the proxy has room.
    pub fn admit(&self, id: &str, eligible: impl Fn(&ProxyKey) -> bool) -> Admission {
        let Some(key) = &self.key else {
            return Admission::Unknown;
        };
        let now = self.clock.now();
        let Ok(c) = signed::verify(key, id, now) else {
            return Admission::Unknown;
        };
        let slot = c.slot();
        let mut st = self.lock();
        st.expire_leases(now);
        if st.leases.contains_key(&slot) {
            return Admission::Known;
        }
        if st.was_released(&slot) {
            return Admission::Unknown;
        }
        let client: Arc<str> = Arc::from(c.client.as_str());
        let presented = Presented {
            eligible: eligible(&c.proxy),
            active: st.proxies.get(&c.proxy).map_or(0, |p| p.active()),
            max: self.config.max_leases_per_proxy,
            held: st.clients.get(&client).map_or(0, |e| e.len()),
            client_max: self.limits.max_leases,
        };
        if let Err(why) = readmit_decision(presented) {
            return Admission::Refused(why);
        }
        let lease = Lease {
            id: id.to_string(),
            proxy: c.proxy.clone(),
            granted_at: now,
            expires_at: c.expires_at(),
            site: None,
            client: client.clone(),
        };
        st.hold(slot, lease.clone());
        self.changed();
        Admission::Readmitted(lease)
    }
}

#[cfg(test)]
#[path = "failover_tests.rs"]
mod tests;

/// The random part of a lease about to be granted: a nonce for a signed
/// id, or the whole id when ids are not signed.
pub(super) enum Fresh {
    Nonce([u8; NONCE_LEN]),
    Id(String),
}
