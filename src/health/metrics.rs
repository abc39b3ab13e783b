//! The probe series, written by the health engine. Per-proxy series are
//! removed when the Proxy goes away ([`HealthMetrics::forget_proxy`]).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::{HistogramFamily, Registrar};

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

fn probe_histogram() -> Histogram {
    // The Prometheus client defaults: 5ms .. 10s.
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

/// Series written by the health engine.
#[derive(Clone)]
pub struct HealthMetrics {
    duration: HistogramFamily<ProxyLabel>,
    failures: Family<ProxyFailureLabels, Counter>,
}

impl HealthMetrics {
    /// The families, registered in `registry`.
    pub fn register(registry: &mut Registrar) -> Self {
        let m = HealthMetrics {
            duration: Family::new_with_constructor(probe_histogram as fn() -> Histogram),
            failures: Family::default(),
        };
        registry.register(
            "proxy_operator_healthcheck_duration_seconds",
            "Duration of every health probe through a proxy",
            m.duration.clone(),
        );
        registry.register(
            "proxy_operator_healthcheck_failures",
            "Failed health probes through a proxy",
            m.failures.clone(),
        );
        m
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
