//! Signed, self-describing lease ids: what a lease is (proxy, client,
//! expiry, nonce) travels in its id under an HMAC-SHA256 tag, so a leader
//! that never granted it can check it and take it in after a failover
//! (docs/architecture.md, "Leases across leader changes").
//!
//! Layout: `v1.` + base64url(payload ‖ tag), payload = expiry (unix ms,
//! i64 big-endian) ‖ nonce (16 bytes) ‖ namespace ‖ name ‖ client, each
//! string as a u16 big-endian length and its bytes; the tag covers the
//! version prefix and the payload.

use std::sync::{Arc, RwLock};

use chrono::{DateTime, Utc};
use ring::hmac;

use super::keyring::{ring_of, Entry, KeyId, Phase, Ring};
use super::ProxyKey;

/// The version prefix of ids this code writes.
pub const VERSION: &str = "v1.";

/// Bytes of a nonce.
pub const NONCE_LEN: usize = 16;

/// Bytes of a key (what the key Secret holds).
pub const KEY_LEN: usize = 32;

const TAG_LEN: usize = 32;

/// The signing key, shared by every replica through a Secret: during a
/// rotation, the key that signs and those still taken
/// ([`super::keyring`]). Clones share the keys, so a reload reaches every
/// holder at once.
#[derive(Clone)]
pub struct LeaseKey(Arc<RwLock<Arc<Ring>>>);

impl std::fmt::Debug for LeaseKey {
    // The key never reaches a log, even through a Debug dump.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LeaseKey({})", self.id())
    }
}

/// Why key bytes were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the lease key must be at least {KEY_LEN} bytes, got {0}")]
pub struct KeyTooShort(pub usize);

impl LeaseKey {
    /// A fresh random key, known to this process only.
    pub fn random() -> Self {
        Self::of(Ring::one(Entry::new(&random_bytes::<KEY_LEN>())))
    }

    /// A key from its bytes (at least [`KEY_LEN`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, KeyTooShort> {
        Self::rotating(bytes, None, Phase::Settled)
    }

    /// `key`, and `next` in a rotation in `phase`
    /// ([`super::keyring::phase`]).
    pub fn rotating(key: &[u8], next: Option<&[u8]>, phase: Phase) -> Result<Self, KeyTooShort> {
        let entry = |b: &[u8]| match b.len() < KEY_LEN {
            true => Err(KeyTooShort(b.len())),
            false => Ok(Entry::new(b)),
        };
        let next = next.map(entry).transpose()?;
        Ok(Self::of(ring_of(entry(key)?, next, phase)))
    }

    fn of(ring: Ring) -> Self {
        LeaseKey(Arc::new(RwLock::new(Arc::new(ring))))
    }

    fn ring(&self) -> Arc<Ring> {
        // A poisoned lock still holds whole keys: they are replaced whole.
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// From now on, the keys `other` holds, for every clone of this one.
    pub fn adopt(&self, other: &LeaseKey) {
        let ring = other.ring();
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = ring;
    }

    /// The id of the key that signs.
    pub fn id(&self) -> KeyId {
        self.ring().signing.id
    }

    /// The ids of every key taken, the signing one first.
    pub fn taken(&self) -> Vec<KeyId> {
        self.ring().taken().map(|e| e.id).collect()
    }
}

/// What a signed id says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// The leased proxy.
    pub proxy: ProxyKey,
    /// Who holds it.
    pub client: String,
    /// When it ends unless renewed, unix milliseconds.
    pub expires_ms: i64,
    /// Names the lease across renewals (each renewal signs a new expiry).
    pub nonce: [u8; NONCE_LEN],
}

impl Claims {
    /// The expiry as a time.
    pub fn expires_at(&self) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(self.expires_ms).unwrap_or(DateTime::<Utc>::MIN_UTC)
    }

    /// The store's key of the lease: its nonce, base32.
    pub fn slot(&self) -> String {
        slot_of(&self.nonce)
    }
}

/// The store's key of a lease with `nonce`.
pub fn slot_of(nonce: &[u8; NONCE_LEN]) -> String {
    data_encoding::BASE32_NOPAD
        .encode(nonce)
        .to_ascii_lowercase()
}

/// The nonce a slot names ([`slot_of`] reversed).
pub fn nonce_of(slot: &str) -> Option<[u8; NONCE_LEN]> {
    data_encoding::BASE32_NOPAD
        .decode(slot.to_ascii_uppercase().as_bytes())
        .ok()
        .and_then(|b| <[u8; NONCE_LEN]>::try_from(b).ok())
}

/// Why a presented id is not taken. The API answers every one of them the
/// same way (404 unknown_lease), so a caller learns nothing from trying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// Not an id of this version.
    #[error("not a version 1 lease id")]
    Version,
    /// Not base64url, or the payload does not parse.
    #[error("malformed lease id")]
    Malformed,
    /// Signed with another key, or altered.
    #[error("lease id signature does not match")]
    Tag,
    /// The signed expiry has passed.
    #[error("lease expired")]
    Expired,
}

/// The id of `claims` under `key`.
pub fn encode(key: &LeaseKey, claims: &Claims) -> String {
    encode_parts(
        key,
        claims.expires_ms,
        &claims.nonce,
        &claims.proxy,
        &claims.client,
    )
}

/// The id of the lease `nonce` on `proxy` held by `client` until
/// `expires_ms`, under `key` (what [`encode`] writes, from its parts).
pub fn encode_parts(
    key: &LeaseKey,
    expires_ms: i64,
    nonce: &[u8; NONCE_LEN],
    proxy: &ProxyKey,
    client: &str,
) -> String {
    let mut payload = Vec::with_capacity(
        8 + NONCE_LEN + 6 + proxy.namespace.len() + proxy.name.len() + client.len() + TAG_LEN,
    );
    payload.extend_from_slice(&expires_ms.to_be_bytes());
    payload.extend_from_slice(nonce);
    for s in [proxy.namespace.as_str(), proxy.name.as_str(), client] {
        // Kubernetes names and token names are far below 64 KiB; a longer
        // string is cut, and the id then fails to verify (never a grant).
        let b = &s.as_bytes()[..s.len().min(usize::from(u16::MAX))];
        payload.extend_from_slice(&u16::try_from(b.len()).unwrap_or(u16::MAX).to_be_bytes());
        payload.extend_from_slice(b);
    }
    let tag = sign(key, &payload);
    payload.extend_from_slice(tag.as_ref());
    format!(
        "{VERSION}{}",
        data_encoding::BASE64URL_NOPAD.encode(&payload)
    )
}

fn sign(key: &LeaseKey, payload: &[u8]) -> hmac::Tag {
    let mut ctx = hmac::Context::with_key(&key.ring().signing.key);
    ctx.update(VERSION.as_bytes());
    ctx.update(payload);
    ctx.sign()
}

/// A tag over `data` for `purpose` (a domain of its own: never a valid
/// id's tag, whose payload starts with [`VERSION`]).
pub fn seal(key: &LeaseKey, purpose: &str, data: &[u8]) -> Vec<u8> {
    let mut ctx = hmac::Context::with_key(&key.ring().signing.key);
    ctx.update(purpose.as_bytes());
    ctx.update(&[0]);
    ctx.update(data);
    ctx.sign().as_ref().to_vec()
}

/// Whether `tag` is [`seal`]'s for `purpose` and `data` under a key taken
/// (constant time for each).
pub fn sealed(key: &LeaseKey, purpose: &str, data: &[u8], tag: &[u8]) -> bool {
    let mut signed = Vec::with_capacity(purpose.len() + 1 + data.len());
    signed.extend_from_slice(purpose.as_bytes());
    signed.push(0);
    signed.extend_from_slice(data);
    verified(key, &signed, tag)
}

/// Whether `tag` is a key's tag over `signed`, for a key taken.
fn verified(key: &LeaseKey, signed: &[u8], tag: &[u8]) -> bool {
    key.ring()
        .taken()
        .any(|e| hmac::verify(&e.key, signed, tag).is_ok())
}

/// The claims of `id` when a key taken signed it, whatever its expiry.
pub fn open(key: &LeaseKey, id: &str) -> Result<Claims, IdError> {
    let body = id.strip_prefix(VERSION).ok_or(IdError::Version)?;
    let raw = data_encoding::BASE64URL_NOPAD
        .decode(body.as_bytes())
        .map_err(|_| IdError::Malformed)?;
    let split = raw.len().checked_sub(TAG_LEN).ok_or(IdError::Malformed)?;
    let (payload, tag) = raw.split_at(split);
    // Constant-time comparison: ring's verify recomputes and compares.
    let mut signed = Vec::with_capacity(VERSION.len() + payload.len());
    signed.extend_from_slice(VERSION.as_bytes());
    signed.extend_from_slice(payload);
    if !verified(key, &signed, tag) {
        return Err(IdError::Tag);
    }
    parse(payload).ok_or(IdError::Malformed)
}

/// The claims of `id` when `key` signed it and it has not expired at `now`.
pub fn verify(key: &LeaseKey, id: &str, now: DateTime<Utc>) -> Result<Claims, IdError> {
    let claims = open(key, id)?;
    if claims.expires_ms <= now.timestamp_millis() {
        return Err(IdError::Expired);
    }
    Ok(claims)
}

fn parse(mut p: &[u8]) -> Option<Claims> {
    fn take<'a>(p: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if p.len() < n {
            return None;
        }
        let (head, tail) = p.split_at(n);
        *p = tail;
        Some(head)
    }
    fn string(p: &mut &[u8]) -> Option<String> {
        let len = take(p, 2)?;
        let n = usize::from(u16::from_be_bytes([len[0], len[1]]));
        String::from_utf8(take(p, n)?.to_vec()).ok()
    }
    let expires_ms = i64::from_be_bytes(take(&mut p, 8)?.try_into().ok()?);
    let nonce: [u8; NONCE_LEN] = take(&mut p, NONCE_LEN)?.try_into().ok()?;
    let namespace = string(&mut p)?;
    let name = string(&mut p)?;
    let client = string(&mut p)?;
    if !p.is_empty() {
        return None;
    }
    Some(Claims {
        proxy: ProxyKey { namespace, name },
        client,
        expires_ms,
        nonce,
    })
}

/// Random bytes from the system's secure source.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    use ring::rand::SecureRandom;
    let mut buf = [0u8; N];
    // ring's system source is a unit struct; building the TLS provider to
    // reach the same source allocated its suite lists on every call.
    if ring::rand::SystemRandom::new().fill(&mut buf).is_err() {
        // Never observed on Linux; a time-and-counter fill keeps the API up
        // (the tag, not the nonce, is what makes an id unforgeable).
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let t = Utc::now().timestamp_nanos_opt().unwrap_or_default();
        for (i, b) in buf.iter_mut().enumerate() {
            let src = if i % 16 < 8 { n } else { t as u64 };
            *b = src.to_le_bytes()[i % 8];
        }
    }
    buf
}

#[cfg(test)]
#[path = "signed_tests.rs"]
mod tests;
