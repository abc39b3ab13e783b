//! The Prometheus registry and the series the operator exports.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Metric, Registry};

/// Labels of a provider call counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// Configured provider name.
    pub provider: String,
    /// create, get, delete or list.
    pub op: String,
    /// ok, not_found, quota_exceeded, permanent, transient or unavailable.
    pub result: String,
}

/// Labels of a provider call latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// Configured provider name.
    pub provider: String,
    /// create, get, delete or list.
    pub op: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The registry being filled, and the name of every family registered in
/// it (so a test can check that each one is exported and documented).
struct Registrar {
    registry: Registry,
    names: Vec<&'static str>,
}

impl Registrar {
    fn register(&mut self, name: &'static str, help: &str, metric: impl Metric) {
        self.names.push(name);
        self.registry.register(name, help, metric);
    }
}

fn call_latency_histogram() -> Histogram {
    // 5ms .. ~80s: a Pod get is milliseconds, a kvm create with a first
    // image download is a minute.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

fn probe_histogram() -> Histogram {
    // The Prometheus client defaults: 5ms .. 10s.
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

/// Series written by the provider metrics decorator.
#[derive(Clone)]
pub struct ProviderMetrics {
    requests: Family<CallLabels, Counter>,
    duration: HistogramFamily<OpLabels>,
}

impl ProviderMetrics {
    fn new() -> Self {
        ProviderMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(call_latency_histogram as fn() -> Histogram),
        }
    }

    fn register(&self, registry: &mut Registrar) {
        registry.register(
            "proxy_operator_provider_requests",
            "Provider calls by configured provider, operation and result class",
            self.requests.clone(),
        );
        registry.register(
            "proxy_operator_provider_request_duration_seconds",
            "Latency of provider calls by configured provider and operation",
            self.duration.clone(),
        );
    }

    /// Records one call.
    pub fn observe(&self, provider: &str, op: &str, result: &str, took: Duration) {
        self.requests
            .get_or_create(&CallLabels {
                provider: provider.to_string(),
                op: op.to_string(),
                result: result.to_string(),
            })
            .inc();
        self.duration
            .get_or_create(&OpLabels {
                provider: provider.to_string(),
                op: op.to_string(),
            })
            .observe(took.as_secs_f64());
    }
}

/// Labels of the reconcile series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// `proxy` or `providerhealth`.
    pub controller: String,
    /// `success` or `error`.
    pub result: String,
}

/// Labels of the reconcile error counter and duration histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// `proxy` or `providerhealth`.
    pub controller: String,
}

/// Reconcile count, errors and duration per controller (the equivalent of
/// controller-runtime's built-in series).
#[derive(Clone)]
pub struct ReconcileMetrics {
    total: Family<ReconcileLabels, Counter>,
    errors: Family<ControllerLabels, Counter>,
    duration: HistogramFamily<ControllerLabels>,
}

impl ReconcileMetrics {
    fn new() -> Self {
        ReconcileMetrics {
            total: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(call_latency_histogram as fn() -> Histogram),
        }
    }

    fn register(&self, registry: &mut Registrar) {
        registry.register(
            "proxy_operator_reconcile",
            "Reconciles by controller and result (success or error)",
            self.total.clone(),
        );
        registry.register(
            "proxy_operator_reconcile_errors",
            "Reconciles that returned an error, by controller",
            self.errors.clone(),
        );
        registry.register(
            "proxy_operator_reconcile_duration_seconds",
            "Duration of reconciles by controller",
            self.duration.clone(),
        );
    }

    /// Records one reconcile.
    pub fn observe(&self, controller: &str, ok: bool, took: Duration) {
        self.total
            .get_or_create(&ReconcileLabels {
                controller: controller.to_string(),
                result: if ok { "success" } else { "error" }.to_string(),
            })
            .inc();
        if !ok {
            self.errors
                .get_or_create(&ControllerLabels {
                    controller: controller.to_string(),
                })
                .inc();
        }
        self.duration
            .get_or_create(&ControllerLabels {
                controller: controller.to_string(),
            })
            .observe(took.as_secs_f64());
    }
}

/// Labels of the per-proxy health series: `proxy` is `<namespace>/<name>`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProxyLabel {
    /// `<namespace>/<name>`.
    pub proxy: String,
}

/// Labels of the probe failure counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProxyFailureLabels {
    /// `<namespace>/<name>`.
    pub proxy: String,
    /// The failure's class (`ProbeError::reason`: `refused`, `timeout`, ...).
    pub reason: String,
}

/// Labels of a lease event counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabel {
    /// granted, refused, renewed, released, expired, or a report result.
    pub event: String,
}

/// Labels of a discovery API request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The matched route pattern, e.g. `POST /v1/leases`.
    pub route: String,
    /// HTTP status code.
    pub status: String,
}

/// Labels of a discovery API latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    /// The matched route pattern, e.g. `POST /v1/leases`.
    pub route: String,
}

fn request_histogram() -> Histogram {
    // 50us .. ~1.6s: the API answers from memory.
    Histogram::new(exponential_buckets(0.00005, 2.0, 16))
}

/// Series written by the health engine. Per-proxy series are removed when
/// the Proxy goes away ([`HealthMetrics::forget_proxy`]).
#[derive(Clone)]
pub struct HealthMetrics {
    duration: HistogramFamily<ProxyLabel>,
    failures: Family<ProxyFailureLabels, Counter>,
}

impl HealthMetrics {
    fn new() -> Self {
        HealthMetrics {
            duration: Family::new_with_constructor(probe_histogram as fn() -> Histogram),
            failures: Family::default(),
        }
    }

    fn register(&self, registry: &mut Registrar) {
        registry.register(
            "proxy_operator_healthcheck_duration_seconds",
            "Duration of every health probe through a proxy",
            self.duration.clone(),
        );
        registry.register(
            "proxy_operator_healthcheck_failures",
            "Failed health probes through a proxy",
            self.failures.clone(),
        );
    }

    /// Records one probe of `proxy` (`<namespace>/<name>`); `failure` is
    /// the reason of a failed one.
    pub fn observe(&self, proxy: &str, failure: Option<&str>, took: Duration) {
        let l = ProxyLabel {
            proxy: proxy.to_string(),
        };
        self.duration.get_or_create(&l).observe(took.as_secs_f64());
        if let Some(reason) = failure {
            self.failures
                .get_or_create(&ProxyFailureLabels {
                    proxy: l.proxy,
                    reason: reason.to_string(),
                })
                .inc();
        }
    }

    /// Removes every series of `proxy` (the Proxy went away); `reasons`
    /// are the failure reasons it may have been counted under.
    pub fn forget_proxy(&self, proxy: &str, reasons: &[&str]) {
        self.duration.remove(&ProxyLabel {
            proxy: proxy.to_string(),
        });
        for reason in reasons {
            self.failures.remove(&ProxyFailureLabels {
                proxy: proxy.to_string(),
                reason: reason.to_string(),
            });
        }
    }
}

/// One provider check target as the gauges see it.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetSample {
    /// Configured provider name.
    pub provider: String,
    /// Target name.
    pub target: String,
    /// Passed its latest check.
    pub up: bool,
    /// Latency of the latest check, seconds.
    pub duration_seconds: f64,
    /// When the provider's latest check finished, Unix seconds.
    pub timestamp_seconds: f64,
}

type Source<T> = Arc<RwLock<Option<Arc<dyn Fn() -> T + Send + Sync>>>>;

/// Values read at every scrape, from sources set once the operator runs.
#[derive(Clone, Default)]
pub struct ScrapeSources {
    phases: Source<Vec<(String, i64)>>,
    leases: Source<i64>,
    targets: Source<Vec<TargetSample>>,
}

impl std::fmt::Debug for ScrapeSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScrapeSources")
    }
}

fn read<T>(src: &Source<T>) -> Option<T> {
    let f = src.read().unwrap_or_else(|p| p.into_inner()).clone()?;
    Some(f())
}

fn set<T>(src: &Source<T>, f: impl Fn() -> T + Send + Sync + 'static) {
    *src.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(f));
}

impl ScrapeSources {
    /// Proxy counts by `status.phase`, from the Proxy cache.
    pub fn set_phases(&self, f: impl Fn() -> Vec<(String, i64)> + Send + Sync + 'static) {
        set(&self.phases, f);
    }
    /// Active leases, from the lease store.
    pub fn set_leases(&self, f: impl Fn() -> i64 + Send + Sync + 'static) {
        set(&self.leases, f);
    }
    /// Provider check targets, from the monitor's snapshot.
    pub fn set_targets(&self, f: impl Fn() -> Vec<TargetSample> + Send + Sync + 'static) {
        set(&self.targets, f);
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    provider: String,
    target: String,
}

const PROXIES: &str = "proxy_operator_proxies";
const LEASES_ACTIVE: &str = "proxy_operator_leases_active";
const TARGET_UP: &str = "proxy_operator_provider_target_up";
const CHECK_DURATION: &str = "proxy_operator_provider_check_duration_seconds";
const CHECK_TIMESTAMP: &str = "proxy_operator_provider_check_timestamp_seconds";

/// The families [`ScrapeSources`] writes at scrape time.
const SCRAPE_FAMILIES: [&str; 5] = [
    PROXIES,
    LEASES_ACTIVE,
    TARGET_UP,
    CHECK_DURATION,
    CHECK_TIMESTAMP,
];

/// Help texts of the provider check gauges (provider-health.md §8).
pub const HELP_TARGET_UP: &str =
    "Whether the target passed its latest provider health check (1) or not (0).";
/// See [`HELP_TARGET_UP`].
pub const HELP_CHECK_DURATION: &str = "Duration of the target's latest provider health check.";
/// See [`HELP_TARGET_UP`].
pub const HELP_CHECK_TIMESTAMP: &str = "Unix time of the target's latest provider health check.";

impl Collector for ScrapeSources {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if let Some(phases) = read(&self.phases) {
            let mut m = encoder.encode_descriptor(
                PROXIES,
                "Proxies by status.phase",
                None,
                MetricType::Gauge,
            )?;
            for (phase, n) in phases {
                ConstGauge::new(n).encode(m.encode_family(&PhaseLabels { phase })?)?;
            }
        }
        let leases = read(&self.leases).unwrap_or(0);
        ConstGauge::new(leases).encode(encoder.encode_descriptor(
            LEASES_ACTIVE,
            "Leases currently held by clients",
            None,
            MetricType::Gauge,
        )?)?;
        let targets = read(&self.targets).unwrap_or_default();
        if targets.is_empty() {
            return Ok(());
        }
        let labels = |t: &TargetSample| TargetLabels {
            provider: t.provider.clone(),
            target: t.target.clone(),
        };
        let mut m =
            encoder.encode_descriptor(TARGET_UP, HELP_TARGET_UP, None, MetricType::Gauge)?;
        for t in &targets {
            ConstGauge::new(i64::from(t.up)).encode(m.encode_family(&labels(t))?)?;
        }
        let mut m = encoder.encode_descriptor(
            CHECK_DURATION,
            HELP_CHECK_DURATION,
            None,
            MetricType::Gauge,
        )?;
        for t in &targets {
            ConstGauge::new(t.duration_seconds).encode(m.encode_family(&labels(t))?)?;
        }
        let mut m = encoder.encode_descriptor(
            CHECK_TIMESTAMP,
            HELP_CHECK_TIMESTAMP,
            None,
            MetricType::Gauge,
        )?;
        for t in &targets {
            ConstGauge::new(t.timestamp_seconds).encode(m.encode_family(&labels(t))?)?;
        }
        Ok(())
    }
}

/// Series written by the discovery and lease API.
#[derive(Clone)]
pub struct DiscoveryMetrics {
    requests: Family<RouteLabels, Counter>,
    duration: HistogramFamily<RouteLabel>,
    lease_events: Family<EventLabel, Counter>,
}

impl DiscoveryMetrics {
    fn new() -> Self {
        DiscoveryMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(request_histogram as fn() -> Histogram),
            lease_events: Family::default(),
        }
    }

    fn register(&self, registry: &mut Registrar) {
        registry.register(
            "proxy_operator_discovery_requests",
            "Discovery API requests by route pattern and status",
            self.requests.clone(),
        );
        registry.register(
            "proxy_operator_discovery_request_duration_seconds",
            "Discovery API request latency by route pattern",
            self.duration.clone(),
        );
        registry.register(
            "proxy_operator_lease_events",
            "Lease outcomes: granted, refused, renewed, released, expired, and reported ok, blocked or failed",
            self.lease_events.clone(),
        );
    }

    /// Records one request.
    pub fn observe_request(&self, route: &str, status: u16, took: Duration) {
        self.requests
            .get_or_create(&RouteLabels {
                route: route.to_string(),
                status: status.to_string(),
            })
            .inc();
        self.duration
            .get_or_create(&RouteLabel {
                route: route.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// Counts one lease event.
    pub fn lease_event(&self, event: &str, n: u64) {
        if n > 0 {
            self.lease_events
                .get_or_create(&EventLabel {
                    event: event.to_string(),
                })
                .inc_by(n);
        }
    }
}

/// Labels of the GC series that are per provider.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabel {
    /// Configured provider name.
    pub provider: String,
}

/// Labels of the GC sweep counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SweepLabels {
    /// Configured provider name.
    pub provider: String,
    /// `ok` or `error` ([`SweepResult`]).
    pub result: String,
}

/// How the sweep of one provider ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SweepResult {
    /// The provider's instances were listed and every verdict carried out
    /// (a failed delete is counted on its own and still makes `ok`).
    Ok,
    /// Nothing of this provider was swept: listing its instances failed,
    /// or the Proxy list failed (then every provider counts `error`).
    Error,
}

impl SweepResult {
    /// The `result` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SweepResult::Ok => "ok",
            SweepResult::Error => "error",
        }
    }
}

/// Series written by the orphan GC, per configured provider.
#[derive(Clone)]
pub struct GcMetrics {
    sweeps: Family<SweepLabels, Counter>,
    deleted: Family<ProviderLabel, Counter>,
    delete_failures: Family<ProviderLabel, Counter>,
    last_success: Family<ProviderLabel, Gauge<f64, AtomicU64>>,
}

impl GcMetrics {
    fn new() -> Self {
        GcMetrics {
            sweeps: Family::default(),
            deleted: Family::default(),
            delete_failures: Family::default(),
            last_success: Family::default(),
        }
    }

    fn register(&self, registry: &mut Registrar) {
        registry.register(
            "proxy_operator_gc_sweeps",
            "Orphan GC sweeps by configured provider and result (ok, or error when the provider's instances or the Proxies could not be listed)",
            self.sweeps.clone(),
        );
        registry.register(
            "proxy_operator_gc_deleted",
            "Orphaned instances the GC deleted, by configured provider",
            self.deleted.clone(),
        );
        registry.register(
            "proxy_operator_gc_delete_failures",
            "Deletes of orphaned instances that failed, by configured provider",
            self.delete_failures.clone(),
        );
        registry.register(
            "proxy_operator_gc_last_success_timestamp_seconds",
            "Unix time of the latest GC sweep of the provider that ended ok",
            self.last_success.clone(),
        );
    }

    fn provider(provider: &str) -> ProviderLabel {
        ProviderLabel {
            provider: provider.to_string(),
        }
    }

    /// Creates the counters of `providers` at zero, so that their first
    /// increment is visible to `increase()` and the series exist from the
    /// start.
    pub fn start(&self, providers: &[&str]) {
        for p in providers {
            for result in [SweepResult::Ok, SweepResult::Error] {
                let _ = self.sweeps.get_or_create(&SweepLabels {
                    provider: p.to_string(),
                    result: result.as_str().to_string(),
                });
            }
            let _ = self.deleted.get_or_create(&Self::provider(p));
            let _ = self.delete_failures.get_or_create(&Self::provider(p));
        }
    }

    /// Counts one sweep of `provider`; an `ok` one also sets its
    /// last-success time to now.
    pub fn sweep(&self, provider: &str, result: SweepResult) {
        self.sweeps
            .get_or_create(&SweepLabels {
                provider: provider.to_string(),
                result: result.as_str().to_string(),
            })
            .inc();
        if result == SweepResult::Ok {
            // A clock before 1970 would be a broken host; 0 then reads as
            // "never", which is what an alert should see.
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            self.last_success
                .get_or_create(&Self::provider(provider))
                .set(now);
        }
    }

    /// Counts one orphan deleted.
    pub fn deleted(&self, provider: &str) {
        self.deleted.get_or_create(&Self::provider(provider)).inc();
    }

    /// Counts one failed delete of an orphan.
    pub fn delete_failed(&self, provider: &str) {
        self.delete_failures
            .get_or_create(&Self::provider(provider))
            .inc();
    }
}

/// The operator's one registry and the handles that write into it.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    families: Arc<[&'static str]>,
    /// Provider call series.
    pub provider: ProviderMetrics,
    /// Reconcile series.
    pub reconcile: ReconcileMetrics,
    /// Health probe series.
    pub health: HealthMetrics,
    /// Discovery and lease API series.
    pub discovery: DiscoveryMetrics,
    /// Orphan GC series.
    pub gc: GcMetrics,
    /// Scrape-time sources (Proxy phases, leases, provider targets).
    pub sources: ScrapeSources,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every series registered.
    pub fn new() -> Self {
        let mut registrar = Registrar {
            registry: Registry::default(),
            names: Vec::new(),
        };
        let provider = ProviderMetrics::new();
        provider.register(&mut registrar);
        let reconcile = ReconcileMetrics::new();
        reconcile.register(&mut registrar);
        let health = HealthMetrics::new();
        health.register(&mut registrar);
        let discovery = DiscoveryMetrics::new();
        discovery.register(&mut registrar);
        let gc = GcMetrics::new();
        gc.register(&mut registrar);
        let Registrar {
            mut registry,
            mut names,
        } = registrar;
        let sources = ScrapeSources::default();
        registry.register_collector(Box::new(sources.clone()));
        names.extend(SCRAPE_FAMILIES);
        Metrics {
            registry: Arc::new(registry),
            families: names.into(),
            provider,
            reconcile,
            health,
            discovery,
            gc,
            sources,
        }
    }

    /// The name of every family this registry can export, as registered
    /// (counters without their `_total` suffix). A family is printed only
    /// once it has a sample.
    pub fn family_names(&self) -> &[&'static str] {
        &self.families
    }

    /// The exposition text (OpenMetrics format, which Prometheus scrapes).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }

    /// The exposition in the Prometheus text format 0.0.4, for scrapers
    /// (and `promtool check metrics`) that do not ask for OpenMetrics.
    pub fn encode_prometheus_text(&self) -> Result<String, std::fmt::Error> {
        Ok(openmetrics_to_text(&self.encode()?))
    }
}

/// Converts OpenMetrics text to the Prometheus text format: counter
/// families are named with their `_total` suffix and `# EOF` is dropped.
pub fn openmetrics_to_text(om: &str) -> String {
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .filter(|n| !n.ends_with("_total"))
        .collect();
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line == "# EOF" {
            continue;
        }
        let rewritten = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(rewritten.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_names_counters_with_total() {
        let om = "# HELP a_requests Calls.\n# TYPE a_requests counter\na_requests_total{x=\"1\"} 2\n# HELP g G.\n# TYPE g gauge\ng 1\n# EOF\n";
        assert_eq!(
            openmetrics_to_text(om),
            "# HELP a_requests_total Calls.\n# TYPE a_requests_total counter\na_requests_total{x=\"1\"} 2\n# HELP g G.\n# TYPE g gauge\ng 1\n"
        );
    }

    #[test]
    fn gc_start_creates_the_provider_counters_at_zero() {
        let m = Metrics::new();
        assert!(!m.encode().unwrap().contains("proxy_operator_gc_"));
        m.gc.start(&["gcp-eu"]);
        let text = m.encode_prometheus_text().unwrap();
        for want in [
            "proxy_operator_gc_sweeps_total{provider=\"gcp-eu\",result=\"ok\"} 0",
            "proxy_operator_gc_sweeps_total{provider=\"gcp-eu\",result=\"error\"} 0",
            "proxy_operator_gc_deleted_total{provider=\"gcp-eu\"} 0",
            "proxy_operator_gc_delete_failures_total{provider=\"gcp-eu\"} 0",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        // No sweep has succeeded yet: no last-success time.
        assert!(
            !text.contains("proxy_operator_gc_last_success_timestamp_seconds{"),
            "{text}"
        );
    }

    #[test]
    fn provider_gauges_follow_the_snapshot() {
        let m = Metrics::new();
        let empty = m.encode().unwrap();
        assert!(
            !empty.contains("proxy_operator_provider_target_up"),
            "{empty}"
        );
        assert!(empty.contains("proxy_operator_leases_active 0"), "{empty}");
        m.sources.set_targets(|| {
            vec![
                TargetSample {
                    provider: "kvm-home".into(),
                    target: "nas1".into(),
                    up: true,
                    duration_seconds: 0.084,
                    timestamp_seconds: 1_700_000_000.5,
                },
                TargetSample {
                    provider: "kvm-home".into(),
                    target: "nas2".into(),
                    up: false,
                    duration_seconds: 15.0,
                    timestamp_seconds: 1_700_000_000.5,
                },
            ]
        });
        m.sources
            .set_phases(|| vec![("Ready".into(), 2), ("Pending".into(), 1)]);
        let text = m.encode().unwrap();
        for want in [
            "proxy_operator_provider_target_up{provider=\"kvm-home\",target=\"nas1\"} 1",
            "proxy_operator_provider_target_up{provider=\"kvm-home\",target=\"nas2\"} 0",
            "proxy_operator_provider_check_duration_seconds{provider=\"kvm-home\",target=\"nas1\"} 0.084",
            "proxy_operator_provider_check_duration_seconds{provider=\"kvm-home\",target=\"nas2\"} 15.0",
            "proxy_operator_provider_check_timestamp_seconds{provider=\"kvm-home\",target=\"nas1\"} 1700000000.5",
            "# HELP proxy_operator_provider_target_up Whether the target passed its latest provider health check (1) or not (0).",
            "proxy_operator_proxies{phase=\"Ready\"} 2",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        m.reconcile
            .observe("proxy", false, Duration::from_millis(3));
        let text = m.encode().unwrap();
        assert!(
            text.contains(
                "proxy_operator_reconcile_total{controller=\"proxy\",result=\"error\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("proxy_operator_reconcile_errors_total{controller=\"proxy\"} 1"),
            "{text}"
        );
    }
}
