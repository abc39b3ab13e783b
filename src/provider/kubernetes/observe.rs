//! The kubernetes provider's observation (issue 19): one watch of the
//! managed Pods per provider feeds a reflector store, which answers the
//! reconciler's checks of Running Proxies without a Pod GET, and whose
//! changes trigger the owning Proxy's reconcile (in place of the
//! controller's own `owns` watch). The store holds only what
//! [`pod_instance`] reads and the owner references.
//!
//! The watch runs inside the stream [`PodObserver::start`] returns, which
//! the Proxy controller polls: it ends with that controller (a reload of
//! the providers config, a lost term, shutdown), and the store it filled
//! is then dropped, so a stale store never answers.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource};
use tracing::warn;

use super::pod_instance;
use crate::api::constants::{INSTALLATION_MARK, MANAGED_MARK, MANAGED_MARK_VALUE, UID_MARK};
use crate::api::Proxy;
use crate::provider::error::plain_message;
use crate::provider::slot::Slot;
use crate::provider::{Changes, Observation};

/// The managed Pods as the provider's watch last saw them.
#[derive(Default)]
pub struct PodObserver {
    slot: Slot<Store<Pod>>,
}

impl PodObserver {
    /// What the store says of Pod `name` in `namespace`: Found while the
    /// watch holds it, Unknown otherwise (not started, not listed yet,
    /// created a moment ago, or deleted: only the API says NotFound).
    pub fn observed(&self, namespace: &str, name: &str) -> Observation {
        match self
            .slot
            .get()
            .and_then(|s| s.get(&ObjectRef::new(name).within(namespace)))
        {
            Some(pod) => Observation::Current(pod_instance(&pod)),
            None => Observation::Unknown,
        }
    }

    /// Starts a watch of the managed Pods in `namespace` (all when `None`)
    /// with a store of its own, which replaces any earlier one; the stream
    /// yields the Proxies owning each Pod the watch saw change.
    pub fn start(&self, client: Client, namespace: Option<&str>) -> Changes {
        let api: Api<Pod> = match namespace {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        };
        let (reader, writer) = reflector::store();
        let run = self.slot.start(Some(reader));
        let wc = watcher::Config::default().labels(&format!("{MANAGED_MARK}={MANAGED_MARK_VALUE}"));
        watcher(api, wc)
            .modify(strip_pod)
            .default_backoff()
            .reflect(writer)
            .touched_objects()
            .filter_map(move |res| {
                // Held by the stream: the store goes when the watch does.
                let _held = &run;
                futures::future::ready(match res {
                    Ok(pod) => Some(futures::stream::iter(owners(&pod))),
                    Err(e) => {
                        warn!(error = %plain_message(&e), "Watching the managed Pods");
                        None
                    }
                })
            })
            .flatten()
            .boxed()
    }
}

/// Keeps only what [`pod_instance`] and [`owners`] read: a Pod's spec
/// (with its Squid config) and most of its status are never cached.
pub fn strip_pod(pod: &mut Pod) {
    pod.spec = None;
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    meta.annotations = None;
    if let Some(labels) = meta.labels.take() {
        let kept: BTreeMap<String, String> = labels
            .into_iter()
            .filter(|(k, _)| k == UID_MARK || k == INSTALLATION_MARK)
            .collect();
        meta.labels = Some(kept);
    }
    pod.status = pod.status.take().map(|s| PodStatus {
        phase: s.phase,
        pod_ip: s.pod_ip,
        ..Default::default()
    });
}

/// The Proxies owning `pod` (through its owner references).
pub fn owners(pod: &Pod) -> Vec<ObjectRef<Proxy>> {
    let Some(ns) = pod.metadata.namespace.as_deref() else {
        return Vec::new();
    };
    let group = Proxy::group(&());
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|o| {
            o.kind == Proxy::kind(&()) && o.api_version.split('/').next() == Some(group.as_ref())
        })
        .map(|o| ObjectRef::new(&o.name).within(ns))
        .collect()
}

#[cfg(test)]
#[path = "observe_tests.rs"]
mod tests;
