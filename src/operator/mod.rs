//! The operator as one value: built from [`Settings`], then run until a
//! cancellation token fires. Two groups of runnables share one token and
//! one join set: every replica serves the probes, `/metrics`, the Proxy
//! cache and the discovery API; the leader (or the only replica) also runs
//! GC, the provider health monitor and writer, the health engine and the
//! Proxy controller.

pub mod metrics;
pub mod runnables;
pub mod settings;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

pub use self::metrics::Metrics;
pub use self::settings::Settings;
use crate::api::constants::LEADER_ELECTION_ID;
use crate::config::ProviderType;
use crate::controller::{self, Context, HealthSource};
use crate::gc::{self, Gc};
use crate::provider::error::plain_message;
use crate::provider::naming::derive_installation_id;
use crate::provider::registry::{self, Registry};
use crate::{health, http, leader};

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
    #[error("leader election stopped before this replica won")]
    LeaderElection,
}

/// The operator, built and ready to run.
pub struct Operator {
    settings: Settings,
    client: Client,
    providers: Registry,
    metrics: Metrics,
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
            Client::try_from(kube_config).map_err(|e| StartError::Client(plain_message(&e)))?;
        let metrics = Metrics::new();
        let deps = registry::Deps {
            client: client.clone(),
            api_url,
            gcp_wire_log_full_payloads: settings.gcp_wire_log_full_payloads,
        };
        let providers = Registry::build(&settings.providers, &metrics.provider, |e| {
            registry::construct(e, &deps)
        })
        .map_err(|e| StartError::Providers(e.to_string()))?;
        Ok(Operator {
            settings,
            client,
            providers,
            metrics,
        })
    }

    /// Runs until `stop` is cancelled, then gives the runnables
    /// [`SHUTDOWN_GRACE`] to finish and hands the leader Lease over.
    pub async fn run(self, stop: CancellationToken) -> Result<(), StartError> {
        let s = &self.settings;
        let mut tasks = JoinSet::new();
        self.spawn_servers(&mut tasks, &stop);
        let installation_id = self.installation_id().await?;
        info!(installationID = %installation_id, "Installation identity");

        // One Proxy cache on every replica feeds the phase gauge, the
        // discovery API and (on the leader) the health engine.
        let (proxy_cache, fill_cache) =
            health::proxy_cache(self.client.clone(), s.proxy_namespace.as_deref());
        let cache_stop = stop.clone();
        tasks.spawn(async move {
            tokio::select! {
                _ = fill_cache => {}
                _ = cache_stop.cancelled() => {}
            }
        });
        runnables::count_phases(&self.metrics, proxy_cache.clone());
        if let Some(addr) = s.discovery_bind {
            runnables::spawn_discovery(
                &mut tasks,
                addr,
                s,
                proxy_cache.clone(),
                &self.metrics,
                stop.clone().cancelled_owned(),
            );
        }

        let Some(lease) = self.lead(&stop).await? else {
            return Ok(());
        };
        self.spawn_leader_work(&mut tasks, &stop, proxy_cache, installation_id)
            .await;

        // Runnables finish their in-flight work on the stop signal; one
        // that is stuck (e.g. a watch retrying an unreachable API server)
        // is abandoned after a grace period so a stop always ends the run.
        tokio::select! {
            _ = async { while tasks.join_next().await.is_some() {} } => {}
            _ = async { stop.cancelled().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
                warn!(grace = ?SHUTDOWN_GRACE, "Runnables did not stop in time; abandoning them");
                tasks.abort_all();
            }
        }
        if let Lead::Elected(campaign, identity) = lease {
            self.release(campaign, &identity).await;
        }
        Ok(())
    }

    /// The probe and metrics servers (every replica).
    fn spawn_servers(&self, tasks: &mut JoinSet<()>, stop: &CancellationToken) {
        if let Some(addr) = self.settings.probe_bind {
            let stop = stop.clone().cancelled_owned();
            tasks.spawn(async move {
                if let Err(e) = http::serve_probes(addr, stop).await {
                    error!(%addr, error = %e, "Probe server failed");
                }
            });
        }
        if let Some(addr) = self.settings.metrics_bind {
            let (m, stop) = (
                self.metrics.exposition().clone(),
                stop.clone().cancelled_owned(),
            );
            tasks.spawn(async move {
                if let Err(e) = http::serve_metrics(addr, m, stop).await {
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

    /// Without `--leader-elect`: leads at once. With it: waits for the
    /// Lease; `None` when stopped first. A replica that loses the Lease
    /// exits, so leader-only work never runs on two replicas at once.
    async fn lead(&self, stop: &CancellationToken) -> Result<Option<Lead>, StartError> {
        let Some(timing) = self.settings.leader else {
            return Ok(Some(Lead::Alone));
        };
        let namespace = &self.settings.operator_namespace;
        let identity = leader_identity();
        let campaign = leader::campaign(
            self.client.clone(),
            namespace,
            LEADER_ELECTION_ID,
            identity.clone(),
            timing,
        );
        let mut leading = campaign.leading.clone();
        info!(identity = %identity, lease = LEADER_ELECTION_ID, namespace = %namespace, "Waiting to become the leader");
        tokio::select! {
            won = leading.wait_for(|l| *l) => {
                if won.is_err() {
                    return Err(StartError::LeaderElection);
                }
            }
            _ = stop.cancelled() => return Ok(None),
        }
        tokio::spawn(async move {
            // An error means the campaign was stopped for shutdown.
            if leading.wait_for(|l| !*l).await.is_ok() {
                error!("Lost leadership; exiting so that leader-only work never runs twice");
                std::process::exit(1);
            }
        });
        Ok(Some(Lead::Elected(campaign, identity)))
    }

    /// GC, provider health, the health engine and the Proxy controller.
    async fn spawn_leader_work(
        &self,
        tasks: &mut JoinSet<()>,
        stop: &CancellationToken,
        proxy_cache: kube::runtime::reflector::Store<crate::api::Proxy>,
        installation_id: String,
    ) {
        let s = &self.settings;
        let watch_pods = s
            .providers
            .providers
            .iter()
            .any(|p| p.provider_type == ProviderType::Kubernetes);
        let gc = Gc::new(
            self.client.clone(),
            self.providers.clone(),
            gc::Settings {
                interval: s.gc.interval,
                min_age: s.gc.min_age,
                max_deletes: s.gc.max_deletes,
                installation_id: installation_id.clone(),
            },
            self.metrics.gc.clone(),
        );
        let gc_stop = stop.clone().cancelled_owned();
        tasks.spawn(async move { gc.run(gc_stop).await });
        let fleet = Arc::new(controller::fleet::Fleet::new(
            Some(proxy_cache.clone()),
            s.providers
                .providers
                .iter()
                .map(|p| (p.name.clone(), p.max_unavailable))
                .collect(),
            s.leases.max_ttl,
        ));
        let states = fleet.clone();
        self.metrics.circuit.set_states(move || states.states());
        runnables::spawn_provider_health(
            tasks,
            s.provider_checks,
            &self.client,
            &self.providers,
            &self.metrics,
            &installation_id,
            stop,
        )
        .await;
        let (engine, health_events) = runnables::spawn_health_engine(
            tasks,
            &s.health,
            proxy_cache,
            &self.metrics,
            stop.clone().cancelled_owned(),
        );
        let health_source: Arc<dyn HealthSource> = engine;
        let ctx = Arc::new(
            Context::new(
                self.client.clone(),
                self.providers.clone(),
                installation_id,
                Some(health_source),
            )
            .with_metrics(self.metrics.reconcile.clone())
            .with_fleet(fleet),
        );
        let ns = s.proxy_namespace.clone();
        let concurrency = s.max_concurrent_reconciles;
        let ctl_stop = stop.clone().cancelled_owned();
        tasks.spawn(async move {
            let events = health::trigger_stream(health_events);
            controller::run(
                ctx,
                ns.as_deref(),
                concurrency,
                watch_pods,
                Some(events),
                ctl_stop,
            )
            .await;
        });
    }

    /// Leader-only work has stopped: hand the Lease over now rather than
    /// make the next leader wait out its duration.
    async fn release(&self, campaign: leader::Campaign, identity: &str) {
        campaign.stop().await;
        let release = leader::release(
            self.client.clone(),
            &self.settings.operator_namespace,
            LEADER_ELECTION_ID,
            identity,
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

/// How this replica came to lead.
enum Lead {
    /// No leader election: the only replica.
    Alone,
    /// Won the Lease, held by this campaign under this identity.
    Elected(leader::Campaign, String),
}

/// A unique candidate name: the Pod name (HOSTNAME in a Pod) and the pid.
fn leader_identity() -> String {
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
