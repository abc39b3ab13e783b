//! The planned hand-over of the lease table (docs/architecture.md,
//! "Hand-over"): a leader that stops on purpose writes its lease store's
//! state to Secrets in the operator namespace, sealed with the shared lease
//! key, and names them on the election Lease in the write that releases it;
//! the next leader, of this process or another, loads them before the
//! write that takes the Lease and grants at once. A missing, altered or
//! unreadable hand-over falls back to the recovery window.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use kube::Client;

use crate::lease::signed::{seal, sealed};
use crate::lease::{LeaseKey, LeaseStore, Snapshot};
use crate::provider::error::plain_message;

/// The annotation on the election Lease that names a hand-over:
/// `<chunks>.<seal>`; empty once a leader took it.
pub const HANDOVER_ANNOTATION: &str = "crawl.example.com/lease-handover";

/// The Secrets' names: this and the chunk's index.
pub const STATE_SECRET_PREFIX: &str = "egress-proxies-operator-lease-state-";

/// Bytes a chunk holds at most: a Secret holds 1 MiB.
pub const CHUNK_BYTES: usize = 1_000_000;

/// Chunks at most (the RBAC Role names each): the state at its caps
/// (`lease::wire::CEILING`).
pub const MAX_CHUNKS: usize = crate::lease::wire::CEILING / CHUNK_BYTES;

/// The data key of a chunk.
const DATA_KEY: &str = "state";

/// The seal's domain.
const PURPOSE: &str = "lease-state";

/// Why a hand-over was not written or not loaded.
#[derive(Debug, thiserror::Error)]
pub enum HandOverError {
    /// The state is larger than the Secrets hold.
    #[error("the lease state is {0} bytes, more than the {MAX_CHUNKS} Secrets of {CHUNK_BYTES} bytes hold")]
    TooLarge(usize),
    /// Writing or reading a Secret failed.
    #[error("Secret {name}: {message}")]
    Api {
        /// The Secret.
        name: String,
        /// The API server's words.
        message: String,
    },
    /// The annotation is not `<chunks>.<seal>`.
    #[error("the hand-over annotation is malformed")]
    Malformed,
    /// The Secrets do not hold what the annotation's seal says: changed
    /// since, written by another installation, or forged.
    #[error("the lease state in the Secrets does not match the seal on the Lease")]
    Seal,
    /// The state does not parse or does not fit this store.
    #[error("the lease state is unreadable: {0}")]
    Unreadable(String),
}

/// A named hand-over: how many chunks and their seal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointer {
    /// Secrets `-0` to `-(chunks - 1)`.
    pub chunks: usize,
    /// The seal over the concatenated chunks.
    pub seal: Vec<u8>,
}

impl Pointer {
    /// The annotation value.
    pub fn value(&self) -> String {
        format!(
            "{}.{}",
            self.chunks,
            data_encoding::BASE64URL_NOPAD.encode(&self.seal)
        )
    }

    /// The pointer an annotation value names; `None` when empty (taken).
    pub fn parse(v: &str) -> Result<Option<Pointer>, HandOverError> {
        if v.is_empty() {
            return Ok(None);
        }
        let (n, tag) = v.split_once('.').ok_or(HandOverError::Malformed)?;
        let chunks = n
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_CHUNKS).contains(n))
            .ok_or(HandOverError::Malformed)?;
        let seal = data_encoding::BASE64URL_NOPAD
            .decode(tag.as_bytes())
            .map_err(|_| HandOverError::Malformed)?;
        Ok(Some(Pointer { chunks, seal }))
    }
}

/// The state `bytes` cut into Secret-sized chunks, and its pointer.
pub fn cut<'a>(key: &LeaseKey, bytes: &'a [u8]) -> Result<(Vec<&'a [u8]>, Pointer), HandOverError> {
    let chunks: Vec<&[u8]> = if bytes.is_empty() {
        vec![bytes]
    } else {
        bytes.chunks(CHUNK_BYTES).collect()
    };
    if chunks.len() > MAX_CHUNKS {
        return Err(HandOverError::TooLarge(bytes.len()));
    }
    let pointer = Pointer {
        chunks: chunks.len(),
        seal: seal(key, PURPOSE, bytes),
    };
    Ok((chunks, pointer))
}

/// The snapshot in `bytes` when `pointer` seals them under `key`.
pub fn open(key: &LeaseKey, pointer: &Pointer, bytes: &[u8]) -> Result<Snapshot, HandOverError> {
    if !sealed(key, PURPOSE, bytes, &pointer.seal) {
        return Err(HandOverError::Seal);
    }
    crate::lease::wire::decode(bytes).map_err(|e| HandOverError::Unreadable(e.to_string()))
}

/// What a hand-over wrote.
#[derive(Debug, Clone, Copy)]
pub struct Written {
    /// Live leases.
    pub leases: usize,
    /// Released ids still remembered.
    pub released: usize,
    /// The state's size, and the Secrets it took.
    pub bytes: usize,
    pub chunks: usize,
}

/// Hands the lease table of one replica over: where, and with what key.
pub struct HandOver {
    /// The discovery API's store.
    pub store: Arc<LeaseStore>,
    /// The shared key (never a key of this process only: no other
    /// process could open its seal).
    pub key: LeaseKey,
    /// The operator namespace.
    pub namespace: String,
    /// The API client.
    pub client: Client,
    /// Cancelled once the discovery API stopped serving: nothing changes
    /// the store after.
    pub served: tokio_util::sync::CancellationToken,
}

fn name(i: usize) -> String {
    format!("{STATE_SECRET_PREFIX}{i}")
}

impl HandOver {
    fn api(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Writes the store's state now; returns the annotation naming it and
    /// what was written. Call it once nothing changes the store any more.
    pub async fn write(&self) -> Result<(String, Written), HandOverError> {
        let (exported, bytes) = self.store.export_encoded();
        let (leases, released) = (exported.leases, exported.released);
        let (chunks, pointer) = cut(&self.key, &bytes)?;
        let api = self.api();
        for (i, chunk) in chunks.iter().enumerate() {
            put(&api, &name(i), chunk).await?;
        }
        let written = Written {
            leases,
            released,
            bytes: bytes.len(),
            chunks: chunks.len(),
        };
        Ok((pointer.value(), written))
    }

    /// Loads the state `value` (the annotation) names.
    pub async fn load(&self, pointer: &Pointer) -> Result<Snapshot, HandOverError> {
        let api = self.api();
        let mut bytes = Vec::new();
        for i in 0..pointer.chunks {
            let n = name(i);
            let s = api.get(&n).await.map_err(|e| api_error(&n, &e))?;
            let data = s
                .data
                .and_then(|mut d| d.remove(DATA_KEY))
                .ok_or_else(|| HandOverError::Unreadable(format!("Secret {n} holds no state")))?;
            bytes.extend_from_slice(&data.0);
        }
        open(&self.key, pointer, &bytes)
    }
}

fn api_error(name: &str, e: &kube::Error) -> HandOverError {
    HandOverError::Api {
        name: name.to_string(),
        message: plain_message(e),
    }
}

/// Creates or replaces the Secret `name` holding `chunk`.
async fn put(api: &Api<Secret>, name: &str, chunk: &[u8]) -> Result<(), HandOverError> {
    let secret = super::own_secret(name, DATA_KEY, chunk.to_vec());
    let data = secret.data.clone().unwrap_or_default();
    let pp = PostParams::default();
    match api.create(&pp, &secret).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let mut old = api.get(name).await.map_err(|e| api_error(name, &e))?;
            old.data = Some(data);
            old.string_data = None;
            api.replace(name, &pp, &old)
                .await
                .map(|_| ())
                .map_err(|e| api_error(name, &e))
        }
        Err(e) => Err(api_error(name, &e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::signed::KEY_LEN;

    fn key(b: u8) -> LeaseKey {
        LeaseKey::from_bytes(&[b; KEY_LEN]).unwrap()
    }

    #[test]
    fn a_hand_over_opens_only_whole_unaltered_and_under_the_shared_key() {
        let snap = Snapshot {
            v: crate::lease::SNAPSHOT_VERSION,
            proxies: vec![("crawl".into(), "sq-1".into())],
            released: vec![([9; 16], 1000)],
            ..Default::default()
        };
        let bytes = crate::lease::wire::encode(&snap);
        let (chunks, pointer) = cut(&key(1), &bytes).unwrap();
        assert_eq!(chunks.concat(), bytes);
        let value = pointer.value();
        let back = Pointer::parse(&value).unwrap().unwrap();
        assert_eq!(open(&key(1), &back, &bytes).unwrap(), snap);
        assert!(matches!(
            open(&key(2), &back, &bytes),
            Err(HandOverError::Seal)
        ));
        let mut altered = bytes.clone();
        altered[5] ^= 1;
        assert!(matches!(
            open(&key(1), &back, &altered),
            Err(HandOverError::Seal)
        ));
        assert!(matches!(
            open(&key(1), &back, &bytes[..bytes.len() - 1]),
            Err(HandOverError::Seal)
        ));
    }

    #[test]
    fn annotation_values() {
        assert_eq!(Pointer::parse("").unwrap(), None, "taken");
        for bad in ["3", "0.AAAA", "65.AAAA", "x.AAAA", "2.not base64!"] {
            assert!(
                matches!(Pointer::parse(bad), Err(HandOverError::Malformed)),
                "{bad}"
            );
        }
    }

    #[test]
    fn state_is_cut_into_secret_sized_chunks_up_to_the_named_secrets() {
        let big = vec![b'x'; CHUNK_BYTES * 2 + 1];
        let (chunks, pointer) = cut(&key(1), &big).unwrap();
        assert_eq!(pointer.chunks, 3);
        assert_eq!(chunks.iter().map(|c| c.len()).max(), Some(CHUNK_BYTES));
        let too_big = vec![b'x'; CHUNK_BYTES * MAX_CHUNKS + 1];
        assert!(matches!(
            cut(&key(1), &too_big),
            Err(HandOverError::TooLarge(n)) if n == too_big.len()
        ));
    }
}
