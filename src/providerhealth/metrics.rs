//! The provider check gauges (provider-health.md §8), read from the
//! monitor's snapshot at scrape time. Only the leader runs the monitor, so
//! a non-leader prints none of them.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::metrics::{Registrar, Scraped};

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    provider: String,
    target: String,
}

const TARGET_UP: &str = "proxy_operator_provider_target_up";
const CHECK_DURATION: &str = "proxy_operator_provider_check_duration_seconds";
const CHECK_TIMESTAMP: &str = "proxy_operator_provider_check_timestamp_seconds";

/// Help texts of the provider check gauges (provider-health.md §8).
pub const HELP_TARGET_UP: &str =
    "Whether the target passed its latest provider health check (1) or not (0).";
/// See [`HELP_TARGET_UP`].
pub const HELP_CHECK_DURATION: &str = "Duration of the target's latest provider health check.";
/// See [`HELP_TARGET_UP`].
pub const HELP_CHECK_TIMESTAMP: &str = "Unix time of the target's latest provider health check.";

/// The provider check gauges.
#[derive(Clone, Debug)]
pub struct ProviderHealthMetrics {
    targets: Scraped<Vec<TargetSample>>,
}

impl ProviderHealthMetrics {
    /// The gauges, registered in `registry` as a collector.
    pub fn register(registry: &mut Registrar) -> Self {
        let m = ProviderHealthMetrics {
            targets: Scraped::default(),
        };
        registry.register_collector(
            &[TARGET_UP, CHECK_DURATION, CHECK_TIMESTAMP],
            TargetGauges(m.targets.clone()),
        );
        m
    }

    /// Where the targets are read from (the monitor's snapshot); no gauge
    /// prints until set, nor while it is empty.
    pub fn set_targets(&self, f: impl Fn() -> Vec<TargetSample> + Send + Sync + 'static) {
        self.targets.set(f);
    }
}

#[derive(Debug)]
struct TargetGauges(Scraped<Vec<TargetSample>>);

impl Collector for TargetGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let targets = self.0.read().unwrap_or_default();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gauges_follow_the_snapshot() {
        let mut r = Registrar::new();
        let m = ProviderHealthMetrics::register(&mut r);
        let exposition = r.finish();
        let empty = exposition.encode().unwrap();
        assert!(
            !empty.contains("proxy_operator_provider_target_up"),
            "{empty}"
        );
        m.set_targets(|| {
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
        let text = exposition.encode().unwrap();
        for want in [
            "proxy_operator_provider_target_up{provider=\"kvm-home\",target=\"nas1\"} 1",
            "proxy_operator_provider_target_up{provider=\"kvm-home\",target=\"nas2\"} 0",
            "proxy_operator_provider_check_duration_seconds{provider=\"kvm-home\",target=\"nas1\"} 0.084",
            "proxy_operator_provider_check_duration_seconds{provider=\"kvm-home\",target=\"nas2\"} 15.0",
            "proxy_operator_provider_check_timestamp_seconds{provider=\"kvm-home\",target=\"nas1\"} 1700000000.5",
            "# HELP proxy_operator_provider_target_up Whether the target passed its latest provider health check (1) or not (0).",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
    }
}
