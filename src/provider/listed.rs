//! Observation by listing (issue 19), for providers without a watch (gcp,
//! kvm): one `list_by_tag` per interval (jittered) replaces a `get` per
//! Running Proxy. [`Listed`] wraps a decorated provider, so the listings
//! are counted and traced as `list` calls; everything else is forwarded.
//!
//! The pure parts: [`answer`] (what the newest listing says of one
//! instance) and [`changed`] (which Proxies' instances differ between two
//! listings, found by UID mark). Whether the reconciler takes a listed
//! instance is the plan's (`GetOutcome::observed`): only for an instance
//! already Running before the listing started.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;
use tracing::warn;

use super::error::plain_message;
use super::registry::ProviderType;
use super::slot::{Run, Slot};
use super::{Changes, CreateRequest, Instance, Listing, Observation, Provider, ProviderError};
use crate::api::Proxy;

/// Shortens each wait between listings (the operator passes its jitter,
/// up to 20% off, so fleets' listings do not line up).
pub type Spread = fn(Duration) -> Duration;

/// How many intervals a listing answers for: when listings keep failing,
/// checks go back to `get` instead of trusting an old picture.
pub const MAX_AGE_INTERVALS: u32 = 3;

/// One complete listing's instances by ID.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// When the listing started: it shows nothing newer.
    pub listed_at: DateTime<Utc>,
    /// Whether every scope was read (nothing is taken for gone otherwise).
    pub complete: bool,
    /// The listed instances.
    pub instances: HashMap<String, Instance>,
}

impl Snapshot {
    /// The snapshot of `listing`, started at `listed_at`.
    pub fn of(listing: Listing, listed_at: DateTime<Utc>) -> Self {
        Snapshot {
            listed_at,
            complete: listing.unread_scopes.is_empty(),
            instances: listing
                .instances
                .into_iter()
                .map(|i| (i.id.clone(), i))
                .collect(),
        }
    }
}

/// What the newest snapshot says of instance `id` at `now`: listed, or
/// Unknown when there is none, it is older than `max_age`, or it does not
/// hold the instance (absence is for `get` to confirm).
pub fn answer(
    snap: Option<&Snapshot>,
    id: &str,
    now: DateTime<Utc>,
    max_age: Duration,
) -> Observation {
    let fresh = snap.filter(|s| {
        now.signed_duration_since(s.listed_at)
            .to_std()
            .is_ok_and(|age| age <= max_age)
    });
    match fresh.and_then(|s| s.instances.get(id).map(|i| (s, i))) {
        Some((s, i)) => Observation::Listed {
            instance: i.clone(),
            listed_at: s.listed_at,
        },
        None => Observation::Unknown,
    }
}

/// The UID marks of the instances that changed state or address, appeared,
/// or (when `new` is complete) vanished since `old`. The first listing
/// changes nothing: the controller looks at every Proxy when it starts.
pub fn changed(old: Option<&Snapshot>, new: &Snapshot) -> BTreeSet<String> {
    let Some(old) = old else {
        return BTreeSet::new();
    };
    let mut uids = BTreeSet::new();
    for (id, was) in &old.instances {
        match new.instances.get(id) {
            Some(now) if now.state == was.state && now.ip == was.ip => {}
            Some(now) => {
                uids.insert(now.uid.clone());
            }
            None if new.complete => {
                uids.insert(was.uid.clone());
            }
            None => {}
        }
    }
    for (id, now) in &new.instances {
        if !old.instances.contains_key(id) {
            uids.insert(now.uid.clone());
        }
    }
    uids.remove("");
    uids
}

/// The Proxies among `proxies` whose UID is in `uids`.
pub fn proxies_of(proxies: &[Arc<Proxy>], uids: &BTreeSet<String>) -> Vec<ObjectRef<Proxy>> {
    proxies
        .iter()
        .filter(|p| p.uid().is_some_and(|u| uids.contains(&u)))
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

/// A provider observed by one listing per interval.
pub struct Listed {
    inner: Arc<dyn Provider>,
    interval: Duration,
    spread: Spread,
    slot: Slot<Arc<Snapshot>>,
}

impl Listed {
    /// Observes `inner` (decorated, so listings are counted) every
    /// `interval`, each wait shortened by `spread`.
    pub fn new(inner: Arc<dyn Provider>, interval: Duration, spread: Spread) -> Self {
        Listed {
            inner,
            interval,
            spread,
            slot: Slot::default(),
        }
    }

    fn max_age(&self) -> Duration {
        self.interval.saturating_mul(MAX_AGE_INTERVALS)
    }
}

/// What one round of the listing loop carries.
struct Round {
    inner: Arc<dyn Provider>,
    interval: Duration,
    spread: Spread,
    run: Run<Arc<Snapshot>>,
    proxies: Store<Proxy>,
    first: bool,
}

impl Round {
    /// Lists (after the jittered interval, but at once the first time)
    /// until a listing changes something; returns those Proxies, or `None`
    /// once a later start of the observation has taken over.
    async fn next(&mut self) -> Option<Vec<ObjectRef<Proxy>>> {
        loop {
            if !self.first {
                tokio::time::sleep((self.spread)(self.interval)).await;
            }
            self.first = false;
            let listed_at = Utc::now();
            let listing = match self.inner.list_by_tag().await {
                Ok(l) => l,
                Err(e) => {
                    warn!(provider = %self.inner.name(), error = %plain_message(&e), "Listing instances to observe them failed; checks use get until a listing succeeds");
                    continue;
                }
            };
            let snap = Arc::new(Snapshot::of(listing, listed_at));
            // A later start of the observation has taken over: end.
            let old = self.run.set(snap.clone())?;
            let uids = changed(old.as_deref(), &snap);
            if !uids.is_empty() {
                return Some(proxies_of(&self.proxies.state(), &uids));
            }
        }
    }
}

#[async_trait]
impl Provider for Listed {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn provider_type(&self) -> ProviderType {
        self.inner.provider_type()
    }
    async fn create(&self, req: &CreateRequest) -> Result<String, ProviderError> {
        self.inner.create(req).await
    }
    async fn get(&self, id: &str) -> Result<Instance, ProviderError> {
        self.inner.get(id).await
    }
    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        self.inner.delete(id).await
    }
    async fn list_by_tag(&self) -> Result<Listing, ProviderError> {
        self.inner.list_by_tag().await
    }
    async fn collect_shared(&self, installation_id: &str) -> Result<Vec<String>, ProviderError> {
        self.inner.collect_shared(installation_id).await
    }
    fn observed(&self, id: &str) -> Observation {
        answer(self.slot.get().as_deref(), id, Utc::now(), self.max_age())
    }
    fn observe(&self, _namespace: Option<&str>, proxies: &Store<Proxy>) -> Option<Changes> {
        let round = Round {
            inner: self.inner.clone(),
            interval: self.interval,
            spread: self.spread,
            run: self.slot.start(None),
            proxies: proxies.clone(),
            first: true,
        };
        let changes = futures::stream::unfold(round, |mut round| async move {
            let refs = round.next().await?;
            Some((futures::stream::iter(refs), round))
        });
        Some(changes.flatten().boxed())
    }
}

#[cfg(test)]
#[path = "listed_tests.rs"]
mod tests;
