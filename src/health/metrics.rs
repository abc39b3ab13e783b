//! The probe series, written by the health engine. By default they are
//! fleet-wide, labelled by provider and the Proxy's namespace, so their
//! number does not grow with the fleet; `--per-proxy-metrics` adds series
//! per proxy, removed when the Proxy goes away
//! ([`HealthMetrics::forget_proxy`]).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::{HistogramFamily, Registrar};

/// Labels of the fleet-wide probe series. The namespace label is not
/// called `namespace`: Prometheus sets that one to the scraped Pod's
/// namespace and would rename ours to `exported_namespace`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FleetLabels {
    /// `spec.provider`; empty (no label, to Prometheus) for External Proxies.
    pub provider: String,
    /// The Proxy's namespace.
    pub proxy_namespace: String,
}

/// Labels of the fleet-wide probe failure counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FleetFailureLabels {
    /// `spec.provider`.
    pub provider: String,
    /// The Proxy's namespace.
    pub proxy_namespace: String,
    /// The failure's class (`ProbeError::reason`: `refused`, `timeout`, ...).
    pub reason: String,
}

/// Labels of the per-proxy health series: `proxy` is `<namespace>/<name>`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProxyLabel {
    /// `<namespace>/<name>`.
    pub proxy: String,
}

/// Labels of the per-proxy probe failure counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProxyFailureLabels {
    /// `<namespace>/<name>`.
    pub proxy: String,
    /// The failure's class.
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
    duration: HistogramFamily<FleetLabels>,
    failures: Family<FleetFailureLabels, Counter>,
    /// With `--per-proxy-metrics` only.
    per_proxy: Option<PerProxy>,
}

#[derive(Clone)]
struct PerProxy {
    duration: HistogramFamily<ProxyLabel>,
    failures: Family<ProxyFailureLabels, Counter>,
}

impl HealthMetrics {
    /// The families, registered in `registry`; the per-proxy ones only
    /// with `per_proxy`.
    pub fn register(registry: &mut Registrar, per_proxy: bool) -> Self {
        let m = HealthMetrics {
            duration: Family::new_with_constructor(probe_histogram as fn() -> Histogram),
            failures: Family::default(),
            per_proxy: per_proxy.then(|| PerProxy {
                duration: Family::new_with_constructor(probe_histogram as fn() -> Histogram),
                failures: Family::default(),
            }),
        };
        registry.register(
            "proxy_operator_healthcheck_duration_seconds",
            "Duration of every health probe through a proxy, by provider and the Proxy's namespace",
            m.duration.clone(),
        );
        registry.register(
            "proxy_operator_healthcheck_failures",
            "Failed health probes through a proxy, by provider, the Proxy's namespace and reason",
            m.failures.clone(),
        );
        if let Some(p) = &m.per_proxy {
            registry.register(
                "proxy_operator_proxy_healthcheck_duration_seconds",
                "Duration of every health probe through one proxy (--per-proxy-metrics)",
                p.duration.clone(),
            );
            registry.register(
                "proxy_operator_proxy_healthcheck_failures",
                "Failed health probes through one proxy (--per-proxy-metrics)",
                p.failures.clone(),
            );
        }
        m
    }

    /// Records one probe of `proxy` (`<namespace>/<name>`) of `provider`;
    /// `failure` is the reason of a failed one.
    pub fn observe(&self, proxy: &str, provider: &str, failure: Option<&str>, took: Duration) {
        let proxy_namespace = proxy.split_once('/').map_or("", |(ns, _)| ns);
        let fleet = FleetLabels {
            provider: provider.to_string(),
            proxy_namespace: proxy_namespace.to_string(),
        };
        self.duration
            .get_or_create(&fleet)
            .observe(took.as_secs_f64());
        if let Some(reason) = failure {
            self.failures
                .get_or_create(&FleetFailureLabels {
                    provider: fleet.provider,
                    proxy_namespace: fleet.proxy_namespace,
                    reason: reason.to_string(),
                })
                .inc();
        }
        let Some(p) = &self.per_proxy else { return };
        let l = ProxyLabel {
            proxy: proxy.to_string(),
        };
        p.duration.get_or_create(&l).observe(took.as_secs_f64());
        if let Some(reason) = failure {
            p.failures
                .get_or_create(&ProxyFailureLabels {
                    proxy: l.proxy,
                    reason: reason.to_string(),
                })
                .inc();
        }
    }

    /// Removes every per-proxy series of `proxy` (the Proxy went away);
    /// `reasons` are the failure reasons it may have been counted under.
    /// The fleet-wide series stay: they are counters of the fleet.
    pub fn forget_proxy(&self, proxy: &str, reasons: &[&str]) {
        let Some(p) = &self.per_proxy else { return };
        p.duration.remove(&ProxyLabel {
            proxy: proxy.to_string(),
        });
        for reason in reasons {
            p.failures.remove(&ProxyFailureLabels {
                proxy: proxy.to_string(),
                reason: reason.to_string(),
            });
        }
    }
}
