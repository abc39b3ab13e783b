//! The two maps clients can grow, bounded: sticky keys (here) and per-site
//! cooldowns ([`super::cooldowns`], re-exported). Each holds at most a fixed number of entries per proxy and
//! in total; keys are kept as 128-bit digests (a 256-byte key costs 16
//! bytes); entries expire with time, removed by the background sweep
//! ([`StickyMap::sweep`], [`Cooldowns::sweep`]), never by a request: a
//! request only compares an entry's end with the clock. Pure: time is an
//! argument.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sha2::{Digest as _, Sha256};

use super::ProxyKey;

/// Sticky keys remembered at most, in total.
pub const MAX_STICKY_KEYS: usize = 100_000;
/// Sticky keys remembered at most for one proxy.
pub const MAX_STICKY_KEYS_PER_PROXY: usize = 10_000;
/// A sticky key is forgotten this long after the end of the last lease
/// granted under it.
pub const STICKY_IDLE: Duration = Duration::from_secs(3600);
/// Site cooldowns held at most, in total.
pub const MAX_COOLDOWN_SITES: usize = 50_000;
/// Site cooldowns held at most for one proxy.
pub const MAX_COOLDOWN_SITES_PER_PROXY: usize = 1_000;

/// A key or site as stored: the first 128 bits of its SHA-256.
pub type KeyDigest = [u8; 16];

/// The stored form of a sticky key or site.
pub fn digest(s: &str) -> KeyDigest {
    let full = Sha256::digest(s.as_bytes());
    let mut d = [0u8; 16];
    d.copy_from_slice(&full[..16]);
    d
}

/// How many entries a map holds at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// In total.
    pub total: usize,
    /// For one proxy.
    pub per_proxy: usize,
}

/// Why an entry was not stored (the caller loses only stickiness or that
/// one cooldown; nothing else changes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The map holds `Caps::total` entries.
    Total,
    /// The proxy holds `Caps::per_proxy` entries.
    PerProxy,
}

/// `now + d`, saturating at the largest date instead of overflowing.
pub fn later(now: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| now.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Sticky key → proxy, with the time the mapping is forgotten.
#[derive(Debug)]
pub struct StickyMap {
    caps: Caps,
    map: HashMap<KeyDigest, (Arc<ProxyKey>, DateTime<Utc>)>,
    per_proxy: HashMap<Arc<ProxyKey>, usize>,
}

impl StickyMap {
    /// An empty map.
    pub fn new(caps: Caps) -> Self {
        StickyMap {
            caps,
            map: HashMap::new(),
            per_proxy: HashMap::new(),
        }
    }

    /// Mappings held (expired ones not yet swept included).
    #[allow(clippy::len_without_is_empty)] // only counted, never tested for empty
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The live mapping of `key`.
    pub fn get(&self, key: &str, now: DateTime<Utc>) -> Option<&ProxyKey> {
        self.map
            .get(&digest(key))
            .filter(|(_, until)| *until > now)
            .map(|(p, _)| p.as_ref())
    }

    /// Maps `key` to `proxy` until `until` (a later end never shortens).
    /// A key that moves to a full proxy is forgotten.
    pub fn remember(
        &mut self,
        key: &str,
        proxy: &ProxyKey,
        until: DateTime<Utc>,
    ) -> Result<(), Full> {
        self.remember_digest(digest(key), proxy, until)
    }

    /// [`StickyMap::remember`] for a key already digested (a hand-over).
    pub fn remember_digest(
        &mut self,
        d: KeyDigest,
        proxy: &ProxyKey,
        until: DateTime<Utc>,
    ) -> Result<(), Full> {
        if let Some((p, end)) = self.map.get_mut(&d) {
            if p.as_ref() == proxy {
                *end = (*end).max(until);
                return Ok(());
            }
            let old = p.clone();
            self.map.remove(&d);
            self.uncount(&old);
        }
        if self.map.len() >= self.caps.total {
            return Err(Full::Total);
        }
        let held = self.per_proxy.get(proxy).copied().unwrap_or(0);
        if held >= self.caps.per_proxy {
            return Err(Full::PerProxy);
        }
        let p = match self.per_proxy.get_key_value(proxy) {
            Some((p, _)) => p.clone(),
            None => Arc::new(proxy.clone()),
        };
        *self.per_proxy.entry(p.clone()).or_default() += 1;
        self.map.insert(d, (p, until));
        Ok(())
    }

    /// The mapping of digest `d` live at `now`: (proxy, end).
    pub fn live_digest(
        &self,
        d: &KeyDigest,
        now: DateTime<Utc>,
    ) -> Option<(&ProxyKey, DateTime<Utc>)> {
        self.map
            .get(d)
            .filter(|(_, until)| *until > now)
            .map(|(p, until)| (p.as_ref(), *until))
    }

    /// Forgets the mapping of digest `d` (a follower's copy, when the
    /// leader holds it no more).
    pub fn forget_digest(&mut self, d: &KeyDigest) {
        if let Some((p, _)) = self.map.remove(d) {
            self.uncount(&p);
        }
    }

    fn uncount(&mut self, p: &ProxyKey) {
        if let Some(n) = self.per_proxy.get_mut(p) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_proxy.remove(p);
            }
        }
    }

    /// Forgets mappings that ended by `now`; returns how many.
    pub fn sweep(&mut self, now: DateTime<Utc>) -> usize {
        self.retain(|_, until| until > now)
    }

    /// Every mapping live at `now`: (key digest, proxy, end).
    pub fn live(
        &self,
        now: DateTime<Utc>,
    ) -> impl Iterator<Item = (&KeyDigest, &ProxyKey, DateTime<Utc>)> {
        self.map
            .iter()
            .filter(move |(_, (_, until))| *until > now)
            .map(|(d, (p, until))| (d, p.as_ref(), *until))
    }

    /// Forgets mappings to proxies not in `present`.
    pub fn retain_proxies(&mut self, present: &HashSet<ProxyKey>) {
        self.retain(|p, _| present.contains(p));
    }

    /// Forgets mappings to the proxies in `gone`; no pass over the map
    /// unless one of them has a mapping.
    pub fn forget_proxies(&mut self, gone: &HashSet<ProxyKey>) {
        if gone.iter().any(|k| self.per_proxy.contains_key(k)) {
            self.retain(|p, _| !gone.contains(p));
        }
    }

    fn retain(&mut self, keep: impl Fn(&ProxyKey, DateTime<Utc>) -> bool) -> usize {
        let before = self.map.len();
        let per_proxy = &mut self.per_proxy;
        self.map.retain(|_, (p, until)| {
            let k = keep(p, *until);
            if !k {
                if let Some(n) = per_proxy.get_mut(p.as_ref()) {
                    *n = n.saturating_sub(1);
                }
            }
            k
        });
        per_proxy.retain(|_, n| *n > 0);
        before - self.map.len()
    }
}

pub use super::cooldowns::{Cooldowns, MAX_SITE_REPORTS_PER_CLIENT};

#[cfg(test)]
#[path = "bounds_tests.rs"]
mod tests;
