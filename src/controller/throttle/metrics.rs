//! The create-limit series: creates held back, by provider and why, and
//! each provider's tokens, creates in flight and waiting Proxies, read
//! from the limiters at scrape time.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::controller::throttle::limiter::Gauges;
use crate::metrics::{Registrar, Scraped};

const TOKENS: &str = "proxy_operator_create_tokens";
const IN_FLIGHT: &str = "proxy_operator_creates_in_flight";
const WAITING: &str = "proxy_operator_creates_waiting";

/// Labels of the held-create counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HeldLabels {
    /// Configured provider name.
    pub provider: String,
    /// `rate`, `in_flight`, `replace_backoff` or `instance_limit`.
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabel {
    provider: String,
}

/// The create-limit series.
#[derive(Clone, Debug)]
pub struct ThrottleMetrics {
    held: Family<HeldLabels, Counter>,
    gauges: Scraped<Vec<(String, Gauges)>>,
}

impl ThrottleMetrics {
    /// The counter, registered in `registry`, and the gauges as a
    /// collector (they print after every registered family).
    pub fn register(registry: &mut Registrar) -> Self {
        let m = ThrottleMetrics {
            held: Family::default(),
            gauges: Scraped::default(),
        };
        registry.register(
            "proxy_operator_creates_throttled",
            "Reconcile passes that held a create back, by provider and reason (rate, in_flight, replace_backoff, instance_limit)",
            m.held.clone(),
        );
        registry.register_collector(
            &[TOKENS, IN_FLIGHT, WAITING],
            LimiterGauges(m.gauges.clone()),
        );
        m
    }

    /// One create of `provider` held back for `reason`.
    pub fn held(&self, provider: &str, reason: &str) {
        self.held
            .get_or_create(&HeldLabels {
                provider: provider.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Where the gauges are read from (the Proxy controller's limiters).
    pub fn set_limiters(&self, f: impl Fn() -> Vec<(String, Gauges)> + Send + Sync + 'static) {
        self.gauges.set(f);
    }
}

/// A gauge family: its name, help, and the value it takes from a limiter.
type GaugeFamily = (&'static str, &'static str, fn(&Gauges) -> u32);

#[derive(Debug)]
struct LimiterGauges(Scraped<Vec<(String, Gauges)>>);

impl Collector for LimiterGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(rows) = self.0.read() else {
            return Ok(());
        };
        let families: [GaugeFamily; 3] = [
            (
                TOKENS,
                "Creates the provider's bucket would let go at once (createsPerMinute)",
                |g| g.tokens,
            ),
            (
                IN_FLIGHT,
                "Creates submitted whose instance has not been seen running yet (maxCreatesInFlight)",
                |g| g.in_flight,
            ),
            (
                WAITING,
                "Proxies holding a slot for a later create",
                |g| g.waiting,
            ),
        ];
        for (name, help, value) in families {
            let mut m = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (provider, g) in &rows {
                let labels = ProviderLabel {
                    provider: provider.clone(),
                };
                ConstGauge::new(i64::from(value(g))).encode(m.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_series_carry_provider_and_reason() {
        let mut r = Registrar::new();
        let m = ThrottleMetrics::register(&mut r);
        m.held("gcp-eu", "rate");
        m.set_limiters(|| {
            vec![(
                "gcp-eu".into(),
                Gauges {
                    tokens: 3,
                    in_flight: 2,
                    waiting: 7,
                },
            )]
        });
        let text = r.finish().encode().unwrap();
        for want in [
            "proxy_operator_creates_throttled_total{provider=\"gcp-eu\",reason=\"rate\"} 1",
            "proxy_operator_create_tokens{provider=\"gcp-eu\"} 3",
            "proxy_operator_creates_in_flight{provider=\"gcp-eu\"} 2",
            "proxy_operator_creates_waiting{provider=\"gcp-eu\"} 7",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
    }
}
