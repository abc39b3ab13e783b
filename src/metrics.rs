//! The Prometheus registry and the series the operator exports.

use std::sync::{Arc, OnceLock};
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

fn probe_histogram() -> Histogram {
    // The Prometheus client default buckets.
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
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

/// A scrape-time count (e.g. active leases), read from its owner at every
/// scrape; absent until the owner registers itself.
#[derive(Clone, Default)]
pub struct ScrapeGauge {
    source: Arc<OnceLock<Box<dyn Fn() -> i64 + Send + Sync>>>,
}

impl std::fmt::Debug for ScrapeGauge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScrapeGauge")
    }
}

impl ScrapeGauge {
    /// Sets the source once; later calls are ignored (one owner per process).
    pub fn set_source(&self, f: impl Fn() -> i64 + Send + Sync + 'static) {
        let _ = self.source.set(Box::new(f));
    }
}

#[derive(Debug)]
struct LeasesActiveCollector(ScrapeGauge);

impl Collector for LeasesActiveCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(f) = self.0.source.get() else {
            return Ok(());
        };
        let gauge = ConstGauge::new(f());
        let metric = encoder.encode_descriptor(
            "proxy_operator_leases_active",
            "Leases currently held in this replica's lease store",
            None,
            MetricType::Gauge,
        )?;
        gauge.encode(metric)
    }
}

/// Series written by the discovery and lease API.
#[derive(Clone)]
pub struct DiscoveryMetrics {
    requests: Family<RouteLabels, Counter>,
    duration: HistogramFamily<RouteLabel>,
    lease_events: Family<EventLabel, Counter>,
    /// The active lease count, read at scrape time.
    pub leases_active: ScrapeGauge,
}

impl DiscoveryMetrics {
    fn new() -> Self {
        DiscoveryMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(request_histogram as fn() -> Histogram),
            lease_events: Family::default(),
            leases_active: ScrapeGauge::default(),
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
        registry.register_collector(Box::new(LeasesActiveCollector(self.leases_active.clone())));
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
    /// Health probe series.
    pub health: HealthMetrics,
    /// Discovery and lease API series.
    pub discovery: DiscoveryMetrics,
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
        let health = HealthMetrics::new();
        health.register(&mut registry);
        let discovery = DiscoveryMetrics::new();
        discovery.register(&mut registry);
        Metrics {
            registry: Arc::new(registry),
            provider,
            health,
            discovery,
        }
    }

    /// The exposition text (OpenMetrics format, which Prometheus scrapes).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}
