//! The provider call series, written by the metrics decorator
//! ([`super::decorators`]).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::{call_latency_histogram, HistogramFamily, Registrar};

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

/// Series written by the provider metrics decorator.
#[derive(Clone)]
pub struct ProviderMetrics {
    requests: Family<CallLabels, Counter>,
    duration: HistogramFamily<OpLabels>,
}

impl ProviderMetrics {
    /// The families, registered in `registry`.
    pub fn register(registry: &mut Registrar) -> Self {
        let m = ProviderMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(call_latency_histogram as fn() -> Histogram),
        };
        registry.register(
            "proxy_operator_provider_requests",
            "Provider calls by configured provider, operation and result class",
            m.requests.clone(),
        );
        registry.register(
            "proxy_operator_provider_request_duration_seconds",
            "Latency of provider calls by configured provider and operation",
            m.duration.clone(),
        );
        m
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
