//! The Proxy reconciler: pure decisions in [`plan`], effects in
//! [`reconcile`], and the kube-runtime controller that drives them.

pub mod cloud_init;
pub mod plan;
pub mod reconcile;
pub mod status_patch;

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{controller, watcher, Controller};
use kube::Api;
use tracing::{debug, warn};

use crate::api::constants::{MANAGED_MARK, MANAGED_MARK_VALUE};
use crate::api::Proxy;
pub use reconcile::{Context, HealthReport, HealthSource};

/// Runs the Proxy controller until `shutdown` resolves. With `watch_pods`
/// (a kubernetes provider is configured) the operator's Pods are watched
/// through their owner reference, so a Pod turning Running reaches its
/// Proxy within seconds instead of at the next poll.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<&str>,
    concurrency: u16,
    watch_pods: bool,
    health_events: Option<
        impl futures::Stream<Item = kube::runtime::reflector::ObjectRef<Proxy>> + Send + 'static,
    >,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let proxies: Api<Proxy> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let mut c = Controller::new(proxies, watcher::Config::default())
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown);
    if watch_pods {
        let pods: Api<Pod> = match namespace {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        };
        c = c.owns(
            pods,
            watcher::Config::default().labels(&format!("{MANAGED_MARK}={MANAGED_MARK_VALUE}")),
        );
    }
    // The health engine names the Proxies whose status it affected.
    if let Some(events) = health_events {
        c = c.reconcile_on(events);
    }
    c.run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => debug!(proxy = %obj, "Reconciled"),
                Err(e) => warn!(error = %e, "Controller error"),
            }
        })
        .await;
}
