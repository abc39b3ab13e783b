//! The operator as one value: built from [`Settings`], then run until a
//! cancellation token fires. Two groups of runnables share one token and
//! one join set: every replica serves the probes, `/metrics`, the Proxy
//! cache and the discovery API; the leader (or the only replica) also runs
//! GC, the provider health monitor and writer, the health engine and the
//! Proxy controller. Leadership comes in terms: a replica that steps down
//! stops its leader-only work, keeps serving, and campaigns again.

mod campaign;
pub(crate) use campaign::leader_identity;
pub mod client;
pub mod edge_budget;
pub mod metrics;
mod readiness;
pub mod reload;
mod replace;
pub mod runnables;
pub mod settings;
mod term;
mod tokens;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

pub use self::metrics::Metrics;
pub use self::settings::Settings;
use crate::api::constants::LEADER_ELECTION_ID;
use crate::events::Events;
use crate::provider::error::plain_message;
use crate::provider::naming::derive_installation_id;
use crate::provider::registry::{self, Registry};
use crate::proxy_store;
use crate::replica::{handover, horizon, key_reload, lease_key};
use crate::{http, leader};
use reload::{ProviderSet, Reloader};

/// How long runnables get to finish after the stop signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How long handing the Lease over may take at shutdown.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a gateway's readiness waits for the leader's credentials.
const CREDENTIALS_WAIT: Duration = Duration::from_secs(10);

/// Why the operator could not start. Each message is for the person
/// reading the log: it says what failed, in the upstream's own words.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot build a Kubernetes client (in-cluster config or KUBECONFIG): {0}")]
    Client(String),
    #[error("cannot build the providers: {0}")]
    Providers(String),
    #[error("cannot read the kube-system namespace to derive the installation id (pass --installation-id): {0}")]
    InstallationId(String),
    #[error("cannot have the lease signing key: {0}")]
    LeaseKey(String),
    #[error("leader election stopped before this replica won")]
    LeaderElection,
}

/// The operator, built and ready to run.
pub struct Operator {
    settings: Settings,
    client: Client,
    /// The providers in force; a valid reload of the file sends a new set.
    providers: tokio::sync::watch::Sender<Arc<ProviderSet>>,
    /// What provider constructors use, kept for reloads.
    deps: registry::Deps,
    metrics: Metrics,
    /// The one Event recorder of the process, shared by the controller,
    /// the ProviderHealth writer and the GC.
    events: Events,
    /// The discovery API's lease table, once it serves: drains read it.
    lease_store: std::sync::OnceLock<Arc<crate::lease::LeaseStore>>,
    /// Replaces the proxies crawlers ask to, through each term's fleet.
    replacer: Arc<replace::ProxyReplacer>,
}

impl Operator {
    /// Builds the Kubernetes client (from the in-cluster config or
    /// KUBECONFIG) and every configured provider. Dials nothing.
    pub async fn build(settings: Settings) -> Result<Operator, StartError> {
        let kube_config = kube::Config::infer()
            .await
            .map_err(|e| StartError::Client(plain_message(&e)))?;
        let api_url = kube_config.cluster_url.to_string();
        let client =
            client::build(kube_config).map_err(|e| StartError::Client(plain_message(&e)))?;
        let metrics = Metrics::with_per_proxy(settings.per_proxy_metrics);
        let deps = registry::Deps {
            client: client.clone(),
            api_url,
            gcp_wire_log_full_payloads: settings.gcp_wire_log_full_payloads,
            list_interval: settings.provider_list_interval,
        };
        let registry = Registry::build(&settings.providers, &metrics.provider, |e| {
            registry::construct(e, &deps)
        })
        .map_err(|e| StartError::Providers(e.to_string()))?
        .observed_by_listing(deps.list_interval, spread);
        let (providers, _) = tokio::sync::watch::channel(Arc::new(ProviderSet {
            config: settings.providers.clone(),
            registry,
        }));
        Ok(Operator {
            settings,
            events: Events::new(client.clone()),
            replacer: Arc::new(replace::ProxyReplacer::new(client.clone())),
            client,
            providers,
            deps,
            metrics,
            lease_store: std::sync::OnceLock::new(),
        })
    }

    /// Runs until `stop` is cancelled, then gives the runnables
    /// [`SHUTDOWN_GRACE`] to finish and hands the leader Lease over.
    pub async fn run(self, stop: CancellationToken) -> Result<(), StartError> {
        let s = &self.settings;
        edge_budget::warn_if_over(s);
        let mut tasks = JoinSet::new();
        let ready = http::Readiness::new();
        self.spawn_servers(&mut tasks, &stop, &ready);
        let gateway_only = s.role == crate::cli::Role::Gateway;
        // Only the leader's work names its resources after the installation.
        let installation_id = match gateway_only {
            true => String::new(),
            false => self.installation_id().await?,
        };
        if !gateway_only {
            info!(installationID = %installation_id, "Installation identity");
        }
        // Every replica follows the file, so a replica that wins the
        // election starts on the config in force.
        if let Some((path, interval)) = s.providers_reload.clone() {
            let reloader = Reloader {
                path,
                interval,
                deps: self.deps.clone(),
                provider_metrics: self.metrics.provider.clone(),
                metrics: self.metrics.reload.clone(),
                events: self.events.clone(),
                regarding: reload::operator_pod(&s.operator_namespace),
                sets: self.providers.clone(),
            };
            tasks.spawn(reloader.run(stop.clone().cancelled_owned()));
        }

        // One Proxy store on every replica feeds the phase gauge, the
        // discovery API and (on the leader) the health engine, the fleet
        // view and the controller: one watch, each Proxy held once.
        let (proxies, fill_cache) =
            proxy_store::proxy_store(self.client.clone(), s.proxy_namespace.as_deref());
        let proxy_cache = proxies.reader();
        let cache_stop = stop.clone();
        tasks.spawn(async move {
            tokio::select! {
                _ = fill_cache => {}
                _ = cache_stop.cancelled() => {}
            }
        });
        // A gateway reads no Secret: the leader hands it the credentials
        // (discovery::credentials_feed).
        if !gateway_only {
            runnables::watch_credentials(&mut tasks, s, &self.client, &stop);
        }
        // The operator's replicas count phases; a gateway's would count twice.
        if !gateway_only {
            runnables::count_phases(
                &self.metrics,
                proxy_cache.clone(),
                self.providers.subscribe(),
            );
        }
        // What the election last saw; without it this replica leads.
        let (observed, seen) = tokio::sync::watch::channel(match s.leader {
            None => leader::Observed::Me,
            Some(_) => leader::Observed::Nobody,
        });
        // Lease calls are answered as the leader's only while it holds.
        let fence = match s.leader {
            None => leader::Fence::always(),
            Some(_) => leader::Fence::default(),
        };
        let mut leases = None;
        if let Some(addr) = s.discovery_bind {
            let keys = lease_key::keys_for(
                &self.client,
                (&s.operator_namespace, gateway_only, s.leases.max_ttl),
                &stop,
                &|shared| self.metrics.discovery.lease_key(shared),
                &ready,
            )
            .await
            .map_err(|e| StartError::LeaseKey(e.to_string()))?;
            let Some((keys, shared)) = keys else {
                return Ok(()); // stopped while the API server was away
            };
            let key = keys.own.clone();
            if shared {
                for reload in key_reload::reloads(&keys, gateway_only, s.leases.max_ttl) {
                    let (client, ns) = (self.client.clone(), s.operator_namespace.clone());
                    tasks.spawn(key_reload::keep_fresh(client, ns, reload, stop.clone()));
                }
            }
            let (store, replicas, served) = runnables::spawn_discovery(
                &mut tasks,
                addr,
                s,
                (&self.client, proxies.clone(), keys.clone()),
                (&self.metrics, self.replacer.clone()),
                (seen, fence.clone()),
                stop.clone().cancelled_owned(),
            );
            // A key of this process only seals nothing another could open;
            // a gateway never leads, so it hands nothing over.
            let handover = (shared && !gateway_only).then(|| {
                Arc::new(handover::HandOver {
                    store: store.clone(),
                    key: key.clone(),
                    namespace: s.operator_namespace.clone(),
                    client: self.client.clone(),
                    served,
                })
            });
            let _ = self.lease_store.set(store.clone());
            tasks.spawn(readiness::tell_copy_age(
                replicas.clone(),
                ready.clone(),
                stop.clone().cancelled_owned(),
            ));
            // Only a shared key seals an in-sync set another replica can read.
            let replicas = shared.then_some(replicas);
            leases = Some((store, handover, replicas, keys));
        }
        // Ready once the cache has synced (before that the discovery API
        // would list nothing) and the lease key is settled (before that it
        // does not listen).
        // A gateway also waits a while for the leader's credentials, so a
        // rollout does not send crawlers to a gateway that has none yet;
        // not for ever: with no leader it still serves what needs none.
        let (synced, ready_stop) = (proxies.clone(), stop.clone());
        let credentials = gateway_only.then(|| s.health.defaults.credentials.clone());
        tasks.spawn(async move {
            let synced = async {
                synced.synced().await;
                if let Some(c) = credentials {
                    runnables::credentials_copied(&c, CREDENTIALS_WAIT).await;
                }
            };
            tokio::select! {
                () = synced => {
                    ready.set_ready();
                    info!("Proxy cache synced; ready");
                },
                _ = ready_stop.cancelled() => {}
            }
        });

        let leading = async {
            let res = match s.leader {
                Some(timing) if gateway_only => {
                    let stopped = stop.clone().cancelled_owned();
                    let lease = LEADER_ELECTION_ID;
                    let namespace = &s.operator_namespace;
                    info!(lease, namespace = %namespace, "Following the leader without campaigning (gateway)");
                    leader::observe(
                        self.client.clone(),
                        namespace,
                        lease,
                        timing,
                        observed,
                        stopped,
                    )
                    .await;
                    Ok(())
                }
                None => {
                    self.metrics.leader.set_leading(true);
                    let grace = std::sync::Mutex::new(SHUTDOWN_GRACE);
                    self.lead_one_term(&stop, &grace, proxies, installation_id)
                        .await;
                    self.metrics.leader.set_leading(false);
                    Ok(())
                }
                Some(timing) => {
                    let (inner, keys): (Arc<dyn leader::Publisher>, _) = match leases {
                        Some((store, handover, replicas, keys)) => {
                            let h = horizon::Horizon::new(store, timing.retry_period * 2, handover);
                            let h = match replicas {
                                Some(r) => h.with_replicas(r, keys.own.clone()),
                                None => h,
                            };
                            (Arc::new(h), Some(keys))
                        }
                        None => (Arc::new(horizon::Nothing), None),
                    };
                    // Followers forward lease calls to the URL the leader
                    // publishes, and only when its seal checks.
                    let publisher = Arc::new(leader::WithFixed {
                        fixed: self.discovery_annotations(keys.as_ref()),
                        inner,
                    });
                    let candidate = (observed, fence);
                    self.lead_in_terms(
                        timing,
                        candidate,
                        &stop,
                        proxies,
                        installation_id,
                        publisher,
                    )
                    .await
                }
            };
            if res.is_err() {
                stop.cancel();
            }
            res
        };
        // Runnables finish their in-flight work on the stop signal; one
        // that is stuck (e.g. a watch retrying an unreachable API server)
        // is abandoned after a grace period so a stop always ends the run.
        // A gateway drains its connections first (`--gateway-drain-timeout`).
        let grace = match s.gateway_bind {
            Some(_) => SHUTDOWN_GRACE.max(s.gateway.drain_timeout + Duration::from_secs(1)),
            None => SHUTDOWN_GRACE,
        };
        let (res, ()) = tokio::join!(
            leading,
            runnables::drain(&mut tasks, stop.cancelled(), grace)
        );
        res
    }

    /// The probe and metrics servers (every replica).
    fn spawn_servers(
        &self,
        tasks: &mut JoinSet<()>,
        stop: &CancellationToken,
        ready: &http::Readiness,
    ) {
        if let Some(addr) = self.settings.probe_bind {
            let (ready, stop) = (ready.clone(), stop.clone().cancelled_owned());
            tasks.spawn(async move {
                if let Err(e) = http::serve_probes(addr, ready, stop).await {
                    error!(%addr, error = %e, "Probe server failed");
                }
            });
        }
        if let Some(addr) = self.settings.metrics_bind {
            let (m, stop) = (
                self.metrics.exposition().clone(),
                stop.clone().cancelled_owned(),
            );
            let auth = self
                .settings
                .metrics_tls
                .clone()
                .map(|tls| http::MetricsAuth {
                    tls,
                    reviewer: Arc::new(crate::metrics_auth::Reviewer::new(self.client.clone())),
                });
            tasks.spawn(async move {
                if let Err(e) = http::serve_metrics(addr, m, auth, stop).await {
                    error!(%addr, error = %e, "Metrics server failed");
                }
            });
        }
    }

    /// `--installation-id`, or derived from the kube-system namespace UID.
    async fn installation_id(&self) -> Result<String, StartError> {
        if let Some(id) = &self.settings.installation_id {
            return Ok(id.clone());
        }
        let ns = Api::<Namespace>::all(self.client.clone())
            .get("kube-system")
            .await
            .map_err(|e| StartError::InstallationId(plain_message(&e)))?;
        Ok(derive_installation_id(
            &ns.metadata.uid.unwrap_or_default(),
            &self.settings.operator_namespace,
        ))
    }
}

/// Cancels `stop` on SIGTERM or Ctrl-C. The handlers are installed when
/// this is called, not when the future is first polled, so a signal that
/// arrives as soon as the servers answer already stops the operator
/// gracefully.
pub fn stop_on_signal(stop: CancellationToken) -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            (Err(e), _) | (_, Err(e)) => {
                error!(error = %e, "Cannot listen for SIGTERM; stopping on Ctrl-C only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        info!("Shutting down");
        stop.cancel();
    }
}

/// The jitter of every periodic wait (up to 20% off), for the providers'
/// listings: the provider layer does not depend on the controller's plan.
fn spread(interval: std::time::Duration) -> std::time::Duration {
    use crate::controller::plan::Random;
    crate::controller::plan::jitter(interval, crate::controller::plan::SystemRandom.unit())
}
