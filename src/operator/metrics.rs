//! The operator's one registry: every subsystem's families registered in
//! one order, the handles that write into them, and the Proxy phase gauge
//! (counted from the shared cache, which this composition root owns).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::controller::metrics::ReconcileMetrics;
use crate::controller::throttle::ThrottleMetrics;
use crate::discovery::metrics::DiscoveryMetrics;
use crate::gc::metrics::GcMetrics;
use crate::health::metrics::HealthMetrics;
use crate::leader::LeaderMetrics;
use crate::metrics::{Exposition, Registrar, Scraped};
use crate::provider::metrics::ProviderMetrics;
use crate::providerhealth::metrics::ProviderHealthMetrics;

/// The operator's registry and the handles that write into it.
#[derive(Clone)]
pub struct Metrics {
    exposition: Exposition,
    /// Provider call series.
    pub provider: ProviderMetrics,
    /// Reconcile series.
    pub reconcile: ReconcileMetrics,
    /// Create-limit series.
    pub throttle: ThrottleMetrics,
    /// Health probe series.
    pub health: HealthMetrics,
    /// Discovery and lease API series, and the active leases.
    pub discovery: DiscoveryMetrics,
    /// Orphan GC series.
    pub gc: GcMetrics,
    /// Provider check gauges.
    pub provider_health: ProviderHealthMetrics,
    /// Leadership: leading, step-downs.
    pub leader: LeaderMetrics,
    /// Proxies by phase.
    pub phases: PhaseGauge,
    /// Circuit breaker state per provider.
    pub circuit: CircuitGauge,
    /// Providers config reloads.
    pub reload: super::reload::ReloadMetrics,
    /// ProxyPool sizes and autoscaling decisions.
    pub pool: crate::pool::metrics::PoolMetrics,
    /// The gateway's connections, upstream choices and errors.
    pub gateway: crate::gateway::metrics::GatewayMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every series registered, per-proxy series
    /// off.
    pub fn new() -> Self {
        Self::with_per_proxy(false)
    }

    /// A fresh registry with every series registered; `per_proxy`
    /// (`--per-proxy-metrics`) adds the probe series per proxy. The order
    /// is the exposition's: registered families first, then the
    /// scrape-time collectors (phases, active leases, provider checks).
    pub fn with_per_proxy(per_proxy: bool) -> Self {
        let mut registry = Registrar::new();
        // A collector: it prints after every family, first among collectors.
        let phases = PhaseGauge::register(&mut registry);
        let provider = ProviderMetrics::register(&mut registry);
        let reconcile = ReconcileMetrics::register(&mut registry);
        let throttle = ThrottleMetrics::register(&mut registry);
        let health = HealthMetrics::register(&mut registry, per_proxy);
        let discovery = DiscoveryMetrics::register(&mut registry);
        let gc = GcMetrics::register(&mut registry);
        let provider_health = ProviderHealthMetrics::register(&mut registry);
        let leader = LeaderMetrics::register(&mut registry);
        let circuit = CircuitGauge::register(&mut registry);
        let reload = super::reload::ReloadMetrics::register(&mut registry);
        let pool = crate::pool::metrics::PoolMetrics::register(&mut registry);
        let gateway = crate::gateway::metrics::GatewayMetrics::register(&mut registry);
        // Last: build info and the process series, read at every scrape.
        crate::metrics::process::register(&mut registry);
        Metrics {
            exposition: registry.finish(),
            provider,
            reconcile,
            throttle,
            health,
            discovery,
            gc,
            provider_health,
            leader,
            phases,
            circuit,
            reload,
            pool,
            gateway,
        }
    }

    /// The registry, for the `/metrics` server.
    pub fn exposition(&self) -> &Exposition {
        &self.exposition
    }

    /// See [`Exposition::family_names`].
    pub fn family_names(&self) -> &[&'static str] {
        self.exposition.family_names()
    }

    /// See [`Exposition::encode`].
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        self.exposition.encode()
    }

    /// See [`Exposition::encode_prometheus_text`].
    pub fn encode_prometheus_text(&self) -> Result<String, std::fmt::Error> {
        self.exposition.encode_prometheus_text()
    }
}

const PROXIES: &str = "proxy_operator_proxies";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
    provider: String,
}

/// `proxy_operator_proxies{phase,provider}`, counted at each scrape; it
/// prints nothing until its source is set.
#[derive(Clone, Debug)]
pub struct PhaseGauge(Scraped<Vec<(String, String, i64)>>);

impl PhaseGauge {
    fn register(registry: &mut Registrar) -> Self {
        let gauge = PhaseGauge(Scraped::default());
        registry.register_collector(&[PROXIES], gauge.clone());
        gauge
    }

    /// Where the counts by `status.phase` and `spec.provider` are read
    /// from (the Proxy cache), as (phase, provider, count).
    pub fn set_phases(&self, f: impl Fn() -> Vec<(String, String, i64)> + Send + Sync + 'static) {
        self.0.set(f);
    }
}

impl Collector for PhaseGauge {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(phases) = self.0.read() else {
            return Ok(());
        };
        let mut m = encoder.encode_descriptor(
            PROXIES,
            "Proxies by status.phase and spec.provider",
            None,
            MetricType::Gauge,
        )?;
        for (phase, provider, n) in phases {
            ConstGauge::new(n).encode(m.encode_family(&PhaseLabels { phase, provider })?)?;
        }
        Ok(())
    }
}

const CIRCUIT_OPEN: &str = "proxy_operator_provider_circuit_open";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabel {
    provider: String,
}

/// `proxy_operator_provider_circuit_open{provider}`: 1 while the
/// provider's circuit breaker is open, else 0, for every configured
/// provider (leader only; nothing prints until its source is set).
#[derive(Clone, Debug)]
pub struct CircuitGauge(Scraped<Vec<(String, bool)>>);

impl CircuitGauge {
    fn register(registry: &mut Registrar) -> Self {
        let gauge = CircuitGauge(Scraped::default());
        registry.register_collector(&[CIRCUIT_OPEN], gauge.clone());
        gauge
    }

    /// Where the breaker states are read from (the controller's fleet view).
    pub fn set_states(&self, f: impl Fn() -> Vec<(String, bool)> + Send + Sync + 'static) {
        self.0.set(f);
    }
}

impl Collector for CircuitGauge {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(states) = self.0.read() else {
            return Ok(());
        };
        let mut m = encoder.encode_descriptor(
            CIRCUIT_OPEN,
            "Whether the provider's circuit breaker is open (1): replacing and recycling on it are held.",
            None,
            MetricType::Gauge,
        )?;
        for (provider, open) in states {
            ConstGauge::new(i64::from(open))
                .encode(m.encode_family(&ProviderLabel { provider })?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scrape_time_gauges_follow_their_sources() {
        let m = Metrics::new();
        let empty = m.encode().unwrap();
        assert!(empty.contains("proxy_operator_leases_active 0"), "{empty}");
        assert!(!empty.contains("proxy_operator_proxies"), "{empty}");
        m.phases.set_phases(|| {
            vec![
                ("Ready".into(), "k8s".into(), 2),
                ("Running".into(), "".into(), 1),
            ]
        });
        m.discovery.set_leases(|| 3);
        assert!(
            !empty.contains("proxy_operator_provider_circuit_open"),
            "{empty}"
        );
        m.circuit
            .set_states(|| vec![("gcp-eu".into(), true), ("k8s".into(), false)]);
        let text = m.encode().unwrap();
        for want in [
            "proxy_operator_provider_circuit_open{provider=\"gcp-eu\"} 1",
            "proxy_operator_provider_circuit_open{provider=\"k8s\"} 0",
            "proxy_operator_proxies{phase=\"Ready\",provider=\"k8s\"} 2",
            "proxy_operator_proxies{phase=\"Running\",provider=\"\"} 1",
            "proxy_operator_leases_active 3",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
    }
}
