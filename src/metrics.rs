//! The Prometheus registry and the series the operator exports.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Labels of a provider call counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// Configured provider name.
    pub provider: String,
    /// create, get, delete or list.
    pub op: String,
    /// ok, not_found, quota_exceeded, permanent or transient.
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

    fn register(&self, registry: &mut Registry) {
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

    fn register(&self, registry: &mut Registry) {
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
    failures: Family<ProxyLabel, Counter>,
}

impl HealthMetrics {
    fn new() -> Self {
        HealthMetrics {
            duration: Family::new_with_constructor(probe_histogram as fn() -> Histogram),
            failures: Family::default(),
        }
    }

    fn register(&self, registry: &mut Registry) {
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

    /// Records one probe of `proxy` (`<namespace>/<name>`).
    pub fn observe(&self, proxy: &str, ok: bool, took: Duration) {
        let l = ProxyLabel {
            proxy: proxy.to_string(),
        };
        self.duration.get_or_create(&l).observe(took.as_secs_f64());
        if !ok {
            self.failures.get_or_create(&l).inc();
        }
    }

    /// Removes every series of `proxy` (the Proxy went away).
    pub fn forget_proxy(&self, proxy: &str) {
        let l = ProxyLabel {
            proxy: proxy.to_string(),
        };
        self.duration.remove(&l);
        self.failures.remove(&l);
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
                "proxy_operator_proxies",
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
            "proxy_operator_leases_active",
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
        let mut m = encoder.encode_descriptor(
            "proxy_operator_provider_target_up",
            HELP_TARGET_UP,
            None,
            MetricType::Gauge,
        )?;
        for t in &targets {
            ConstGauge::new(i64::from(t.up)).encode(m.encode_family(&labels(t))?)?;
        }
        let mut m = encoder.encode_descriptor(
            "proxy_operator_provider_check_duration_seconds",
            HELP_CHECK_DURATION,
            None,
            MetricType::Gauge,
        )?;
        for t in &targets {
            ConstGauge::new(t.duration_seconds).encode(m.encode_family(&labels(t))?)?;
        }
        let mut m = encoder.encode_descriptor(
            "proxy_operator_provider_check_timestamp_seconds",
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

    fn register(&self, registry: &mut Registry) {
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

/// The operator's one registry and the handles that write into it.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// Provider call series.
    pub provider: ProviderMetrics,
    /// Reconcile series.
    pub reconcile: ReconcileMetrics,
    /// Health probe series.
    pub health: HealthMetrics,
    /// Discovery and lease API series.
    pub discovery: DiscoveryMetrics,
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
        let mut registry = Registry::default();
        let provider = ProviderMetrics::new();
        provider.register(&mut registry);
        let reconcile = ReconcileMetrics::new();
        reconcile.register(&mut registry);
        let health = HealthMetrics::new();
        health.register(&mut registry);
        let discovery = DiscoveryMetrics::new();
        discovery.register(&mut registry);
        let sources = ScrapeSources::default();
        registry.register_collector(Box::new(sources.clone()));
        Metrics {
            registry: Arc::new(registry),
            provider,
            reconcile,
            health,
            discovery,
            sources,
        }
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
