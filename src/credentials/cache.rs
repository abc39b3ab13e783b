//! The operator's view of credentials Secrets: a watch of the Secrets
//! labelled `crawl.example.com/proxy-credentials=true` (those it generates,
//! and those users name for External Proxies), so that probes, leases and
//! reconciles read credentials without a call, and no unrelated Secret
//! enters the operator's memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::{self, ObjectRef, Store};

use super::{Credentials, CredentialsError};
use crate::api::constants::CREDENTIALS_SECRET_LABEL;

/// The cached credentials Secrets.
pub struct CredentialsCache {
    store: Store<Secret>,
    writer: Mutex<Option<reflector::store::Writer<Secret>>>,
    /// What this process wrote lately, which the watch may not show yet.
    written: Mutex<HashMap<(String, String), (Credentials, Instant)>>,
    /// Counts writes and the watch's events ([`CredentialsCache::version`]).
    changes: Arc<AtomicU64>,
    /// A gateway's copy of the leader's credentials, in place of a watch
    /// (its ServiceAccount reads no Secret): `None` until the first copy.
    fed: Mutex<Option<Arc<Fed>>>,
}

/// The leader's credentials, by Secret namespace and name.
type Fed = HashMap<(String, String), Credentials>;

/// One usable credentials Secret, as the leader hands it to gateways.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Entry {
    /// The Secret's namespace.
    pub namespace: String,
    /// The Secret's name.
    pub name: String,
    /// Its username.
    pub username: String,
    /// Its password (never in a log: this type is only serialized into a
    /// signed replica answer).
    pub password: String,
}

/// How long a write of this process outranks the watch's copy: far longer
/// than the watch lags, far shorter than credentials live.
const WRITTEN_FOR: Duration = Duration::from_secs(60);

impl Default for CredentialsCache {
    fn default() -> Self {
        let (store, writer) = reflector::store();
        CredentialsCache {
            store,
            writer: Mutex::new(Some(writer)),
            written: Mutex::default(),
            changes: Arc::default(),
            fed: Mutex::default(),
        }
    }
}

impl std::fmt::Debug for CredentialsCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CredentialsCache({} Secrets)", self.store.state().len())
    }
}

/// What the cache knows of one credentials Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The watch has not listed yet: nothing can be said.
    NotSynced,
    /// No labelled Secret of that name.
    Missing,
    /// It holds no usable credentials.
    Invalid(CredentialsError),
    /// Its credentials.
    Found(Credentials),
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Entry({}/{}, {})",
            self.namespace, self.name, self.username
        )
    }
}

impl CredentialsCache {
    /// The label selector of the watch.
    pub fn selector() -> String {
        format!("{CREDENTIALS_SECRET_LABEL}=true")
    }

    /// The writer the watch fills the cache through; `None` once taken.
    pub fn take_writer(&self) -> Option<reflector::store::Writer<Secret>> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Changes so far (this process's writes and the watch's events):
    /// lookups answer as they did while it stays the same, except that a
    /// write of this process stops outranking the watch after a minute.
    pub fn version(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// The counter the watch bumps after each event it applied.
    pub fn change_counter(&self) -> Arc<AtomicU64> {
        self.changes.clone()
    }

    /// Records that this process just wrote `creds` into `namespace/name`:
    /// lookups return them until the watch shows the same, or for a minute.
    pub fn wrote(&self, namespace: &str, name: &str, creds: &Credentials) {
        let mut w = self.written.lock().unwrap_or_else(|p| p.into_inner());
        w.retain(|_, (_, at)| at.elapsed() < WRITTEN_FOR);
        w.insert(
            (namespace.to_string(), name.to_string()),
            (creds.clone(), Instant::now()),
        );
        drop(w);
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    /// What the watch alone shows of `namespace/name` (this process's own
    /// recent writes not counted): whether the Secret exists now.
    pub fn watched(&self, namespace: &str, name: &str) -> Lookup {
        if let Some(fed) = self.fed() {
            let key = (namespace.to_string(), name.to_string());
            return match fed.get(&key) {
                Some(c) => Lookup::Found(c.clone()),
                None => Lookup::Missing,
            };
        }
        if !self.synced() {
            return Lookup::NotSynced;
        }
        match self
            .store
            .get(&ObjectRef::<Secret>::new(name).within(namespace))
        {
            None => Lookup::Missing,
            Some(secret) => match Credentials::from_secret(&secret) {
                Ok(c) => Lookup::Found(c),
                Err(e) => Lookup::Invalid(e),
            },
        }
    }

    /// The credentials of the Secret `namespace/name`.
    pub fn lookup(&self, namespace: &str, name: &str) -> Lookup {
        let key = (namespace.to_string(), name.to_string());
        let recent = {
            let w = self.written.lock().unwrap_or_else(|p| p.into_inner());
            w.get(&key)
                .filter(|(_, at)| at.elapsed() < WRITTEN_FOR)
                .map(|(c, _)| c.clone())
        };
        match recent {
            Some(creds) => Lookup::Found(creds),
            None => self.watched(namespace, name),
        }
    }

    /// The credentials of `namespace/name` when the cache holds usable
    /// ones.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Credentials> {
        match self.lookup(namespace, name) {
            Lookup::Found(c) => Some(c),
            _ => None,
        }
    }

    /// Every usable credentials Secret this cache knows (this process's
    /// recent writes outranking the watch), for the gateways' copy.
    pub fn entries(&self) -> Vec<Entry> {
        let mut all: HashMap<(String, String), Credentials> = HashMap::new();
        for secret in self.store.state() {
            if let (Some(ns), Some(name)) = (&secret.metadata.namespace, &secret.metadata.name) {
                if let Ok(c) = Credentials::from_secret(&secret) {
                    all.insert((ns.clone(), name.clone()), c);
                }
            }
        }
        let w = self.written.lock().unwrap_or_else(|p| p.into_inner());
        for (key, (c, at)) in w.iter() {
            if at.elapsed() < WRITTEN_FOR {
                all.insert(key.clone(), c.clone());
            }
        }
        drop(w);
        let mut out: Vec<Entry> = all
            .into_iter()
            .map(|((namespace, name), c)| Entry {
                namespace,
                name,
                password: c.expose().to_string(),
                username: c.username,
            })
            .collect();
        out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        out
    }

    /// Makes `entries` (the leader's, over its signed feed) what this
    /// cache holds, in place of a watch of its own.
    pub fn take_fed(&self, entries: Vec<Entry>) {
        let map: Fed = entries
            .into_iter()
            .map(|e| {
                (
                    (e.namespace, e.name),
                    Credentials::new(e.username, e.password),
                )
            })
            .collect();
        let mut fed = self.fed.lock().unwrap_or_else(|p| p.into_inner());
        if fed.as_deref() == Some(&map) {
            return;
        }
        *fed = Some(Arc::new(map));
        drop(fed);
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    fn fed(&self) -> Option<Arc<Fed>> {
        self.fed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether the watch has listed once, or a copy came from the leader.
    pub fn synced(&self) -> bool {
        if self.fed().is_some() {
            return true;
        }
        self.store
            .wait_until_ready()
            .now_or_never()
            .is_some_and(|r| r.is_ok())
    }

    /// Waits (at most `limit`) for the first list.
    pub async fn ready_within(&self, limit: std::time::Duration) -> bool {
        if self.fed().is_some() {
            return true;
        }
        tokio::time::timeout(limit, self.store.wait_until_ready())
            .await
            .is_ok_and(|r| r.is_ok())
    }
}
