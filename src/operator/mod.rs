//! The operator as one value: built from [`Settings`], then run until a
//! cancellation token fires. Two groups of runnables share one token and
//! one join set: every replica serves the probes, `/metrics`, the Proxy
//! cache and the discovery API; the leader (or the only replica) also runs
//! GC, the provider health monitor and writer, the health engine and the
//! Proxy controller. Leadership comes in terms: a replica that steps down
//! stops its leader-only work, keeps serving, and campaigns again.

pub mod client;
pub mod handover;
mod horizon;
pub mod lease_key;
pub mod metrics;
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
use tracing::{error, info, warn};

pub use self::metrics::Metrics;
pub use self::settings::Settings;
use crate::api::constants::{DISCOVERY_URL_ANNOTATION, LEADER_ELECTION_ID};
use crate::events::Events;
use crate::provider::error::plain_message;
use crate::provider::naming::derive_installation_id;
use crate::provider::registry::{self, Registry};
use crate::proxy_store::{self, ProxyStore};
use crate::{http, leader};
use reload::{ProviderSet, Reloader};

/// How long runnables get to finish after the stop signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How long handing the Lease over may take at shutdown.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

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
        runnables::watch_credentials(&mut tasks, s, &self.client, &stop);
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
        let mut leases = None;
        if let Some(addr) = s.discovery_bind {
            // Every replica signs with the one shared key, so any of them
            // can take in the leases another granted (docs/architecture.md).
            let key = lease_key::shared_or_own(
                &self.client,
                &s.operator_namespace,
                &stop,
                &self.metrics.discovery,
                &ready,
            )
            .await
            .map_err(|e| StartError::LeaseKey(e.to_string()))?;
            let Some((key, shared)) = key else {
                return Ok(()); // stopped while the API server was away
            };
            let (store, replicas, served) = runnables::spawn_discovery(
                &mut tasks,
                addr,
                s,
                (&self.client, proxies.clone(), key.clone()),
                (&self.metrics, self.replacer.clone()),
                seen,
                stop.clone().cancelled_owned(),
            );
            // A key of this process only seals nothing another could open.
            let handover = shared.then(|| {
                Arc::new(handover::HandOver {
                    store: store.clone(),
                    key: key.clone(),
                    namespace: s.operator_namespace.clone(),
                    client: self.client.clone(),
                    served,
                })
            });
            let _ = self.lease_store.set(store.clone());
            // Only a shared key seals an in-sync set another replica can read.
            let replicas = shared.then_some(replicas);
            leases = Some((store, handover, replicas, key));
        }
        // Ready once the cache has synced (before that the discovery API
        // would list nothing) and the lease key is settled (before that it
        // does not listen).
        let (synced, ready_stop) = (proxies.clone(), stop.clone());
        tasks.spawn(async move {
            tokio::select! {
                () = synced.synced() => {
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
                    let (inner, key): (Arc<dyn leader::Publisher>, _) = match leases {
                        Some((store, handover, replicas, key)) => {
                            let h = horizon::Horizon::new(store, timing.retry_period * 2, handover);
                            let h = match replicas {
                                Some(r) => h.with_replicas(r, key.clone()),
                                None => h,
                            };
                            (Arc::new(h), Some(key))
                        }
                        None => (Arc::new(horizon::Nothing), None),
                    };
                    // Followers forward lease calls to the URL the leader
                    // publishes, and only when its seal checks.
                    let publisher = Arc::new(leader::WithFixed {
                        fixed: self.discovery_annotations(key.as_ref()),
                        inner,
                    });
                    self.lead_in_terms(timing, observed, &stop, proxies, installation_id, publisher)
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
        let (res, ()) = tokio::join!(
            leading,
            runnables::drain(&mut tasks, stop.cancelled(), SHUTDOWN_GRACE)
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

    /// With `--leader-elect`: campaigns, and runs leader-only work for each
    /// term this replica leads. On a step-down the work is stopped (given
    /// half of the gap between the renew deadline and the lease duration,
    /// then abandoned) before the campaign resumes, so it never runs on two
    /// replicas at once. Returns when `stop` fires, after releasing the
    /// Lease if it leads.
    async fn lead_in_terms(
        &self,
        timing: leader::Timing,
        observed: tokio::sync::watch::Sender<leader::Observed>,
        stop: &CancellationToken,
        proxies: ProxyStore,
        installation_id: String,
        publisher: Arc<leader::WithFixed>,
    ) -> Result<(), StartError> {
        let namespace = &self.settings.operator_namespace;
        let identity = leader_identity();
        let candidate = leader::Candidate {
            identity: identity.clone(),
            observed,
        };
        let campaign = leader::campaign(
            self.client.clone(),
            namespace,
            LEADER_ELECTION_ID,
            candidate,
            timing,
            self.metrics.leader.clone(),
            publisher.clone(),
        );
        let mut leading = campaign.leading.clone();
        let step_down_grace = timing.lease_duration.saturating_sub(timing.renew_deadline) / 2;
        loop {
            info!(identity = %identity, lease = LEADER_ELECTION_ID, namespace = %namespace, "Waiting to become the leader");
            tokio::select! {
                won = leading.wait_for(|l| *l) => if won.is_err() {
                    campaign.stop().await;
                    return Err(StartError::LeaderElection);
                },
                _ = stop.cancelled() => {
                    campaign.stop().await;
                    return Ok(());
                }
            }
            let term = stop.child_token();
            let grace = std::sync::Mutex::new(SHUTDOWN_GRACE);
            let work = self.lead_one_term(&term, &grace, proxies.clone(), installation_id.clone());
            tokio::pin!(work);
            self.metrics.leader.set_leading(true);
            tokio::select! {
                // The term's work ends only once the term is cancelled,
                // which here only `stop` does.
                _ = &mut work => {
                    self.metrics.leader.set_leading(false);
                    self.release(campaign, &identity, &*publisher).await;
                    return Ok(());
                }
                lost = leading.wait_for(|l| !*l) => {
                    let campaign_ended = lost.is_err();
                    *grace.lock().unwrap_or_else(|p| p.into_inner()) = step_down_grace;
                    term.cancel();
                    work.await;
                    self.metrics.leader.set_leading(false);
                    // A replica that does not lead exports no provider or
                    // create-limit gauges.
                    self.metrics.provider_health.set_targets(Vec::new);
                    self.metrics.throttle.set_limiters(Vec::new);
                    warn!(identity = %identity, "Stopped leader-only work (controller, GC, health engine, provider checks); still serving the discovery API; campaigning again");
                    if campaign_ended {
                        return Err(StartError::LeaderElection);
                    }
                    campaign.rejoin();
                }
                _ = stop.cancelled() => {
                    work.await;
                    self.metrics.leader.set_leading(false);
                    self.release(campaign, &identity, &*publisher).await;
                    return Ok(());
                }
            }
        }
    }

    /// Where this replica's discovery API is reached, sealed with `key`
    /// (the lease key), for the Lease while it leads.
    fn discovery_annotations(
        &self,
        key: Option<&crate::lease::LeaseKey>,
    ) -> std::collections::BTreeMap<String, String> {
        let s = &self.settings;
        let (Some(url), Some(key)) = (&s.discovery_advertise, key) else {
            if s.discovery_bind.is_some() {
                warn!("No --discovery-advertise-url and no POD_IP: while this replica leads, the others cannot forward lease calls to it and answer 503");
            }
            return Default::default();
        };
        std::collections::BTreeMap::from([
            (DISCOVERY_URL_ANNOTATION.to_string(), url.clone()),
            (
                crate::discovery::internal::URL_SEAL_ANNOTATION.to_string(),
                crate::discovery::internal::seal_url(key, url),
            ),
        ])
    }

    /// Leader-only work has stopped: hand the Lease over now rather than
    /// make the next leader wait out its duration, with what `publisher`
    /// writes for the next leader (the lease table's hand-over).
    async fn release(
        &self,
        campaign: leader::Campaign,
        identity: &str,
        publisher: &dyn leader::Publisher,
    ) {
        campaign.stop().await;
        let annotations = publisher.releasing().await;
        let release = leader::release(
            self.client.clone(),
            (&self.settings.operator_namespace, LEADER_ELECTION_ID),
            identity,
            annotations,
        );
        match tokio::time::timeout(RELEASE_TIMEOUT, release).await {
            Ok(Ok(true)) => info!(lease = LEADER_ELECTION_ID, "Released the leader lease"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                warn!(error = %plain_message(&e), "Could not release the leader lease; it expires by itself")
            }
            Err(_) => warn!("Releasing the leader lease timed out; it expires by itself"),
        }
    }
}

/// A unique candidate name: the Pod name (HOSTNAME in a Pod) and the pid.
pub(super) fn leader_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "egress-proxies-operator".to_string());
    format!("{host}_{}", std::process::id())
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
