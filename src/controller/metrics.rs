//! The reconcile series of the two controllers, Proxy and ProviderHealth
//! (the equivalent of controller-runtime's built-in series).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::{call_latency_histogram, HistogramFamily, Registrar};

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

/// Reconcile count, errors and duration per controller.
#[derive(Clone)]
pub struct ReconcileMetrics {
    total: Family<ReconcileLabels, Counter>,
    errors: Family<ControllerLabels, Counter>,
    duration: HistogramFamily<ControllerLabels>,
}

impl ReconcileMetrics {
    /// The families, registered in `registry`.
    pub fn register(registry: &mut Registrar) -> Self {
        let m = ReconcileMetrics {
            total: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(call_latency_histogram as fn() -> Histogram),
        };
        registry.register(
            "proxy_operator_reconcile",
            "Reconciles by controller and result (success or error)",
            m.total.clone(),
        );
        registry.register(
            "proxy_operator_reconcile_errors",
            "Reconciles that returned an error, by controller",
            m.errors.clone(),
        );
        registry.register(
            "proxy_operator_reconcile_duration_seconds",
            "Duration of reconciles by controller",
            m.duration.clone(),
        );
        m
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_counts_a_reconcile_and_an_error() {
        let mut r = Registrar::new();
        let m = ReconcileMetrics::register(&mut r);
        m.observe("proxy", false, Duration::from_millis(3));
        let text = r.finish().encode().unwrap();
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
