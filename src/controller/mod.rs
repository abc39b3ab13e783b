//! The Proxy reconciler: pure decisions in [`plan`], effects in
//! [`reconcile`], and the kube-runtime controller that drives them.

pub mod cloud_init;
pub mod context;
pub mod error;
pub mod metrics;
pub mod plan;
pub mod reconcile;
pub mod status_patch;
pub mod throttle;
pub mod user_data;
pub mod written;

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{controller, watcher, Controller, WatchStreamExt};
use kube::Api;
use kube::ResourceExt;
use tracing::{debug, warn};

pub use crate::api::health::{HealthReport, HealthSource};
use crate::api::Proxy;
use crate::provider::error::plain_message;
use crate::proxy_store::{self, ProxyStore};
pub use context::Context;
pub use error::Error;

/// Runs the Proxy controller on `proxies` until `shutdown` resolves. The
/// providers' observations (the kubernetes provider's Pod watch) run
/// inside it, so a Pod turning Running reaches its Proxy within seconds
/// instead of at the next poll, and a Running Proxy's check costs no call.
pub async fn run(
    ctx: Arc<Context>,
    proxies: &ProxyStore,
    namespace: Option<&str>,
    concurrency: u16,
    health_events: Option<
        impl futures::Stream<Item = kube::runtime::reflector::ObjectRef<Proxy>> + Send + 'static,
    >,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    // Fed by the process's one Proxy watch (`proxy_store`), which keeps
    // running across reloads and terms; this controller opens none.
    let mut c = Controller::for_shared_stream(proxies.triggers(), proxies.reader())
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown);
    // A labelled cloud-init Secret that appears, changes or gains its label
    // re-triggers the Proxies that reference it. The same watch fills the
    // Secret cache reconciles read cloud-init from (only labelled Secrets
    // are watched, so the operator never reads unrelated ones, and it never
    // needs `get` on Secrets).
    let cache = c.store();
    let secrets: Api<Secret> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let wc = watcher::Config::default().labels(&cloud_init::secret_selector());
    let secret_events = match ctx.secrets.take_writer() {
        Some(writer) => watcher(secrets, wc)
            .modify(|s: &mut Secret| proxy_store::strip_meta(&mut s.metadata))
            .default_backoff()
            .reflect(writer)
            .boxed(),
        // A second run on the same context: the cache already has its
        // watch, this one only triggers.
        None => watcher(secrets, wc).default_backoff().boxed(),
    };
    let secret_events = secret_events
        .touched_objects()
        .filter_map(|res| {
            futures::future::ready(match res {
                Ok(secret) => Some(secret),
                Err(e) => {
                    warn!(error = %plain_message(&e), "Watching cloud-init Secrets");
                    None
                }
            })
        })
        .flat_map(move |secret| futures::stream::iter(referencing(&cache.state(), &secret)));
    c = c.reconcile_on(secret_events);
    // Each provider that observes its instances (the kubernetes provider's
    // Pod watch) names the Proxies whose instances changed; the watch
    // lives as long as this controller polls it.
    for (_, provider) in ctx.registry.providers() {
        if let Some(changes) = provider.observe(namespace, &proxies.reader()) {
            c = c.reconcile_on(changes);
        }
    }
    // The health engine names the Proxies whose status it affected.
    if let Some(events) = health_events {
        c = c.reconcile_on(events);
    }
    c.run(counted_reconcile, reconcile::error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => debug!(proxy = %obj, "Reconciled"),
                Err(e) => warn!(error = %plain_message(&e), "Controller error"),
            }
        })
        .await;
}

/// [`reconcile::reconcile`], counted and timed into the reconcile metrics.
async fn counted_reconcile(
    proxy: Arc<Proxy>,
    ctx: Arc<Context>,
) -> Result<kube::runtime::controller::Action, Error> {
    let started = std::time::Instant::now();
    let metrics = ctx.metrics.clone();
    let res = reconcile::reconcile(proxy, ctx).await;
    if let Some(m) = metrics {
        m.observe("proxy", res.is_ok(), started.elapsed());
    }
    res
}

/// The Proxies in `secret`'s namespace whose cloud-init comes from it.
pub fn referencing(proxies: &[Arc<Proxy>], secret: &Secret) -> Vec<ObjectRef<Proxy>> {
    let ns = secret.namespace();
    let name = secret.name_any();
    proxies
        .iter()
        .filter(|p| p.namespace() == ns)
        .filter(|p| {
            p.spec
                .cloud_init
                .as_ref()
                .and_then(|c| c.secret_ref.as_ref())
                .is_some_and(|r| r.name == name)
        })
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CloudInit, ProxySpec, SecretKeyRef};

    fn proxy(ns: &str, name: &str, secret: Option<&str>) -> Arc<Proxy> {
        let mut p = Proxy::new(
            name,
            ProxySpec {
                cloud_init: secret.map(|s| CloudInit {
                    inline: None,
                    secret_ref: Some(SecretKeyRef {
                        name: s.into(),
                        key: None,
                    }),
                    builtin: None,
                }),
                ..Default::default()
            },
        );
        p.metadata.namespace = Some(ns.into());
        Arc::new(p)
    }

    #[test]
    fn a_secret_maps_to_the_proxies_in_its_namespace_that_name_it() {
        let proxies = vec![
            proxy("a", "uses", Some("ci")),
            proxy("a", "other-secret", Some("ci2")),
            proxy("a", "inline", None),
            proxy("b", "other-namespace", Some("ci")),
            proxy("a", "uses-too", Some("ci")),
        ];
        let mut secret = Secret::default();
        secret.metadata.name = Some("ci".into());
        secret.metadata.namespace = Some("a".into());
        let names: Vec<String> = referencing(&proxies, &secret)
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["uses", "uses-too"]);
    }
}
