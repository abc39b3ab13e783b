//! The proxy health engine (operator.md §3.1): probes every Proxy through
//! itself and tells the reconciler when a verdict or a material latency
//! changes.
//!
//! - [`probe`]: one probe (CONNECT + TLS, or a forward request).
//! - [`error`]: [`ProbeError`], why a probe failed, with a bounded reason.
//! - [`probes`]: [`Probes`], the pure state machine: targets from the
//!   Proxy set, what is due at `now`, results folded into verdicts.
//! - [`threshold`]: pure verdict folding and the status-affecting rule.
//! - [`schedule`]: pure min-heap schedule of next-due times.
//! - [`notify`]: the reconcile trigger channel to the Proxy controller.
//! - [`engine`]: the runnable tying them to the Proxy cache and the pool.

pub mod engine;
pub mod error;
pub mod fairness;
pub mod latency_writes;
pub mod metrics;
pub mod notify;
pub mod probe;
pub mod probes;
pub mod schedule;
pub mod threshold;

pub use engine::Engine;
pub use error::ProbeError;
pub use notify::{trigger_stream, Notifier, NOTIFY_CAPACITY};
pub use probes::{Defaults, Probes};

use futures::StreamExt;
use kube::runtime::reflector::{self, reflector, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};

use crate::api::Proxy;

/// A cache of Proxies (shared by the health engine and the discovery API)
/// and the future that keeps it filled; run it until shutdown.
pub fn proxy_cache(
    client: Client,
    namespace: Option<&str>,
) -> (Store<Proxy>, impl std::future::Future<Output = ()> + Send) {
    let api: Api<Proxy> = match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let (reader, writer) = reflector::store();
    let stream = reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .for_each(|ev| async move {
            if let Err(e) = ev {
                tracing::warn!(error = %crate::provider::error::plain_message(&e), "Proxy cache watch error");
            }
        });
    (reader, stream)
}
