//! The Prometheus registry and the series the operator exports.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
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

/// The operator's one registry and the handles that write into it.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// Provider call series.
    pub provider: ProviderMetrics,
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
        Metrics {
            registry: Arc::new(registry),
            provider,
        }
    }

    /// The exposition text (OpenMetrics format, which Prometheus scrapes).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}
