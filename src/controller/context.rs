//! What every reconcile shares: the client, the providers, the health
//! verdicts, the cloud-init cache, and each Proxy's failure count.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;

use super::{cloud_init, plan};
use crate::api::health::HealthSource;
use crate::events::Events;
use crate::lease::{Clock, SystemClock};
use crate::provider::registry::Registry;
use crate::tenancy::ExternalNamespaces;

/// What every reconcile shares.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// Configured providers, decorated.
    pub registry: Registry,
    /// This installation's identity.
    pub installation_id: String,
    /// Health verdicts, when the health engine runs.
    pub health: Option<Arc<dyn HealthSource>>,
    /// The labelled cloud-init Secrets, filled by the controller's Secret
    /// watch; cloud-init is read from here, never with `get`.
    pub secrets: cloud_init::SecretCache,
    /// The credentials Secrets (generated and External), shared with the
    /// health engine and the discovery API.
    pub credentials: Arc<crate::credentials::CredentialsCache>,
    failures: Mutex<HashMap<String, u32>>,
    /// Failed cleanup attempts in a row, per deleted Proxy.
    cleanup_failures: Mutex<HashMap<String, u32>>,
    /// Creates held after a quota or unavailable refusal, by Proxy UID.
    create_holds: Mutex<HashMap<String, plan::hold::CreateHold>>,
    /// Reconcile count, error and duration series, when exported.
    pub metrics: Option<super::metrics::ReconcileMetrics>,
    /// Where the jitter of every requeue comes from.
    pub random: Arc<dyn plan::Random>,
    /// Every provider's create limiter, shared by all reconciles.
    pub throttle: Arc<super::throttle::Throttle>,
    /// The statuses passes wrote that the cache may not show yet.
    pub written: super::written::Written,
    /// The per-provider fleet view: breaker, budget, recycles.
    pub fleet: Arc<crate::fleet::Fleet>,
    /// `--external-proxy-namespaces`: where External Proxies are served.
    pub external: Arc<ExternalNamespaces>,
    /// The process's Event recorder; none records no Events.
    pub events: Option<Events>,
    /// Every decision's "now": the system's, or one a test steps.
    pub clock: Arc<dyn Clock>,
    /// Probes a surge replacement before it takes over; none: it takes
    /// over once it runs with an address.
    pub checker: Option<Arc<crate::health::check::Checker>>,
}

impl Context {
    /// A context.
    pub fn new(
        client: Client,
        registry: Registry,
        installation_id: String,
        health: Option<Arc<dyn HealthSource>>,
    ) -> Self {
        Context {
            client,
            registry,
            installation_id,
            health,
            secrets: cloud_init::SecretCache::default(),
            credentials: Arc::default(),
            failures: Mutex::new(HashMap::new()),
            cleanup_failures: Mutex::new(HashMap::new()),
            create_holds: Mutex::new(HashMap::new()),
            metrics: None,
            random: Arc::new(plan::SystemRandom),
            throttle: Arc::default(),
            written: super::written::Written::default(),
            fleet: Arc::new(crate::fleet::Fleet::new(
                None,
                Default::default(),
                Duration::ZERO,
            )),
            // None until the operator says which: an External Proxy is
            // only ever served where an administrator allowed it.
            external: Arc::new(ExternalNamespaces::only([])),
            events: None,
            clock: Arc::new(SystemClock),
            checker: None,
        }
    }

    /// Probes surge replacements with `checker` before they take over.
    pub fn with_checker(mut self, checker: Arc<crate::health::check::Checker>) -> Self {
        self.checker = Some(checker);
        self
    }

    /// Reads and stores credentials through `cache` (the process's one).
    pub fn with_credentials(mut self, cache: Arc<crate::credentials::CredentialsCache>) -> Self {
        self.credentials = cache;
        self
    }

    /// Decides by `clock` instead of the system's (a test steps it).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Serves External Proxies in the namespaces `external` allows.
    pub fn with_external_namespaces(mut self, external: Arc<ExternalNamespaces>) -> Self {
        self.external = external;
        self
    }

    /// Records the Proxies' transitions as Events through `events` (the
    /// one recorder of the process).
    pub fn with_events(mut self, events: Events) -> Self {
        self.events = Some(events);
        self
    }

    /// Limits creates with `throttle` (built from the providers config).
    pub fn with_throttle(mut self, throttle: Arc<super::throttle::Throttle>) -> Self {
        self.throttle = throttle;
        self
    }

    /// Consults `fleet` for the breaker and recycling.
    pub fn with_fleet(mut self, fleet: Arc<crate::fleet::Fleet>) -> Self {
        self.fleet = fleet;
        self
    }

    /// Takes requeue jitter from `random` (a fixed one makes tests exact).
    pub fn with_random(mut self, random: Arc<dyn plan::Random>) -> Self {
        self.random = random;
        self
    }

    /// Records reconciles into `metrics`.
    pub fn with_metrics(mut self, metrics: super::metrics::ReconcileMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Counts a failure of `key` and says how long to wait before the
    /// next try ([`plan::backoff`]); the count resets on success.
    pub fn backoff(&self, key: &str) -> Duration {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = f.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        plan::backoff(*n)
    }

    /// `key` reconciled cleanly: its next failure starts the backoff over.
    pub(super) fn succeeded(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// Counts a failed cleanup of `key`; how many in a row, this one too.
    pub(super) fn cleanup_failed(&self, key: &str) -> u32 {
        let mut f = self
            .cleanup_failures
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let n = f.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    /// `key`'s cleanup went through (or the Proxy is gone).
    pub(super) fn cleanup_done(&self, key: &str) {
        self.cleanup_failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// Holds the creates of the Proxy `uid` as `hold` says.
    pub(super) fn hold_creates(&self, uid: &str, hold: plan::hold::CreateHold) {
        self.create_holds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid.to_string(), hold);
    }

    /// How much longer the create of the Proxy `uid` at `generation` is
    /// held ([`plan::hold::waiting`]); a hold that no longer holds goes.
    pub(super) fn create_wait(
        &self,
        uid: &str,
        generation: Option<i64>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Option<Duration> {
        let mut holds = self.create_holds.lock().unwrap_or_else(|p| p.into_inner());
        let wait = plan::hold::waiting(holds.get(uid).copied(), generation, now);
        if wait.is_none() {
            holds.remove(uid);
        }
        wait
    }
}
