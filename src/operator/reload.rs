//! Configuration without restarts: the providers file is read again every
//! `--providers-config-reload-interval`. A ConfigMap volume changes by the
//! kubelet swapping its `..data` symlink, so the file's content is compared
//! rather than watched with inotify (a swap replaces the directory the
//! watch would sit on), and the same loop serves `make run`'s plain file.
//! A valid change is published as a new [`ProviderSet`]; the leader
//! restarts its provider work on it. A broken one is refused: logged with
//! the entry, key and reason, counted, and recorded as a Warning Event on
//! the operator's Pod, while the last good set stays in force.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tracing::{debug, info, info_span, warn, Instrument};

use crate::config::reload::{judge, Verdict};
use crate::config::ProvidersConfig;
use crate::events::{Events, Note, Severity};
use crate::metrics::Registrar;
use crate::provider::metrics::ProviderMetrics;
use crate::provider::registry::{self, Registry};

/// The providers in force: the config and the providers built from it.
pub struct ProviderSet {
    /// The validated file.
    pub config: ProvidersConfig,
    /// Its providers, decorated.
    pub registry: Registry,
}

/// The reload series.
#[derive(Clone, Debug, Default)]
pub struct ReloadMetrics {
    failures: Counter,
    last_successful: Gauge,
    last_success_time: Gauge<f64, AtomicU64>,
}

impl ReloadMetrics {
    /// The families, registered in `registry`; the config loaded at
    /// startup counts as the first successful load.
    pub fn register(registry: &mut Registrar) -> Self {
        let m = ReloadMetrics::default();
        registry.register(
            "proxy_operator_config_reload_failures",
            "Rewrites of the providers file that were refused (invalid, unreadable, or a provider could not be built); the last good config stayed in force",
            m.failures.clone(),
        );
        registry.register(
            "proxy_operator_config_last_reload_successful",
            "1 when the providers file as it is now is the config in force, 0 while a refused rewrite waits to be fixed",
            m.last_successful.clone(),
        );
        registry.register(
            "proxy_operator_config_last_reload_success_timestamp_seconds",
            "Unix time the providers config in force was loaded (at startup or by a reload)",
            m.last_success_time.clone(),
        );
        m.succeeded();
        m
    }

    fn succeeded(&self) {
        self.last_successful.set(1);
        self.last_success_time
            .set(chrono::Utc::now().timestamp_micros() as f64 / 1e6);
    }

    fn failed(&self) {
        self.failures.inc();
        self.last_successful.set(0);
    }
}

/// Everything a reload needs.
pub struct Reloader {
    /// The file and how often it is read.
    pub path: PathBuf,
    /// Between reads.
    pub interval: Duration,
    /// What provider constructors use.
    pub deps: registry::Deps,
    /// Provider call series, for the decorators of new providers.
    pub provider_metrics: ProviderMetrics,
    /// The reload series.
    pub metrics: ReloadMetrics,
    /// Where a refusal is recorded.
    pub events: Events,
    /// The operator's Pod (or, outside one, the name it reports as).
    pub regarding: ObjectReference,
    /// Where a new set is published.
    pub sets: watch::Sender<Arc<ProviderSet>>,
}

impl Reloader {
    /// Reads the file every interval until `stop`; after the first read
    /// (which catches an edit made while the operator started), only a
    /// file whose bytes differ from the last read is judged, so a refused
    /// file is reported once, not at every read.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        let mut last: Option<Option<Vec<u8>>> = None;
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
            let read = std::fs::read(&self.path);
            let bytes = Some(read.as_ref().ok().cloned());
            if bytes == last {
                continue;
            }
            last = bytes;
            self.reload(read)
                .instrument(info_span!("providers_config_reload", path = %self.path.display()))
                .await;
        }
    }

    async fn reload(&self, read: std::io::Result<Vec<u8>>) {
        let parsed = match read {
            Ok(bytes) => ProvidersConfig::from_slice(&bytes).map_err(|e| e.to_string()),
            Err(e) => Err(format!("cannot read the file: {e}")),
        };
        let in_force = self.sets.borrow().clone();
        match judge(&in_force.config, parsed.as_ref().map_err(Clone::clone)) {
            Verdict::Unchanged => {
                debug!("Providers config read again: the same providers; nothing to reload");
                self.metrics.succeeded();
            }
            Verdict::Refuse(problems) => self.refuse(&problems).await,
            Verdict::Apply(change) => {
                let Ok(config) = parsed else { return };
                let built = Registry::build(&config, &self.provider_metrics, |e| {
                    registry::construct(e, &self.deps)
                })
                .map(|r| r.observed_by_listing(self.deps.list_interval, super::spread));
                match built {
                    Err(e) => self.refuse(&e.to_string()).await,
                    Ok(registry) => {
                        info!(added = ?change.added, removed = ?change.removed, changed = ?change.changed, "providers config reloaded ({change})");
                        self.sets
                            .send_replace(Arc::new(ProviderSet { config, registry }));
                        self.metrics.succeeded();
                    }
                }
            }
        }
    }

    async fn refuse(&self, problems: &str) {
        warn!(problems = %problems, "providers config reload refused; the last good config stays in force");
        self.metrics.failed();
        let note = Note {
            severity: Severity::Warning,
            reason: "ConfigReloadFailed",
            action: "ReloadProvidersConfig",
            text: format!(
                "providers config {} refused, the last good config stays in force: {problems}",
                self.path.display()
            ),
        };
        self.events.record(&self.regarding, note).await;
    }
}

/// The operator's Pod (`POD_NAME`/`POD_NAMESPACE` from the downward API);
/// outside a Pod, the name the process reports Events as, in the operator
/// namespace, so `kubectl get events -n` still lists the refusal.
pub fn operator_pod(operator_namespace: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(crate::events::instance()),
        namespace: Some(
            std::env::var("POD_NAMESPACE").unwrap_or_else(|_| operator_namespace.to_string()),
        ),
        ..Default::default()
    }
}
