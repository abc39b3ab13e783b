//! The pool series: each pool's desired, Ready and leased Proxies (and an
//! autoscaled pool's floor), read at scrape time from what the controller
//! last saw, and the autoscaler's decisions by reason.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::metrics::Registrar;

const REPLICAS: &str = "proxy_operator_pool_replicas";

/// A pool not seen this long is gone (deleted, or another replica
/// leads): its gauges stop printing.
const STALE_AFTER: Duration = Duration::from_secs(60);

/// What a pass saw of one pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolGauges {
    /// `spec.replicas` as planned.
    pub desired: i32,
    /// Kept Proxies that are Ready.
    pub ready: i32,
    /// Kept Proxies holding a lease.
    pub leased: i32,
    /// An autoscaled pool's floor now: `minReplicas`, or 0 while it is
    /// scaled to zero; `None` for a pool sized by hand.
    pub min: Option<i32>,
}

// The pool's namespace is not called `namespace`: Prometheus sets that one
// to the scraped Pod's and would rename ours to `exported_namespace`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    pool_namespace: String,
    pool: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReplicaLabels {
    pool_namespace: String,
    pool: String,
    kind: &'static str,
}

type Rows = Arc<Mutex<BTreeMap<(String, String), (PoolGauges, Instant)>>>;

/// The pool series.
#[derive(Clone, Debug)]
pub struct PoolMetrics {
    decisions: Family<DecisionLabels, Counter>,
    rows: Rows,
}

impl PoolMetrics {
    /// The counter registered in `registry`, and the gauges as a
    /// collector.
    pub fn register(registry: &mut Registrar) -> Self {
        let m = PoolMetrics {
            decisions: Family::default(),
            rows: Rows::default(),
        };
        registry.register(
            "proxy_operator_pool_scaling_decisions",
            "Changes of a ProxyPool's size by its autoscaler, by reason (Demand, Refusals, LowDemand, Idle, Wake, Bounds)",
            m.decisions.clone(),
        );
        registry.register_collector(&[REPLICAS], ReplicaGauges(m.rows.clone()));
        m
    }

    /// One decision of the autoscaler of `namespace/pool`.
    pub fn decided(&self, namespace: &str, pool: &str, reason: &str) {
        self.decisions
            .get_or_create(&DecisionLabels {
                pool_namespace: namespace.to_string(),
                pool: pool.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// What a pass saw of `namespace/pool`.
    pub fn saw(&self, namespace: &str, pool: &str, g: PoolGauges) {
        let mut m = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        m.insert(
            (namespace.to_string(), pool.to_string()),
            (g, Instant::now()),
        );
    }
}

/// The rows seen within [`STALE_AFTER`]; older ones are dropped.
fn fresh(rows: &Rows, now: Instant) -> Vec<(String, String, PoolGauges)> {
    let mut m = rows.lock().unwrap_or_else(|p| p.into_inner());
    m.retain(|_, (_, seen)| now.saturating_duration_since(*seen) < STALE_AFTER);
    m.iter()
        .map(|((ns, pool), (g, _))| (ns.clone(), pool.clone(), *g))
        .collect()
}

/// The gauges, read from the rows the controller writes.
#[derive(Debug)]
struct ReplicaGauges(Rows);

impl Collector for ReplicaGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = fresh(&self.0, Instant::now());
        if rows.is_empty() {
            return Ok(());
        }
        let mut m = encoder.encode_descriptor(
            REPLICAS,
            "Proxies of a ProxyPool: desired (spec.replicas), ready, leased, and an autoscaled pool's min (minReplicas, 0 while scaled to zero)",
            None,
            MetricType::Gauge,
        )?;
        for (namespace, pool, g) in rows {
            let kinds = [
                ("desired", Some(g.desired)),
                ("ready", Some(g.ready)),
                ("leased", Some(g.leased)),
                ("min", g.min),
            ];
            for (kind, v) in kinds {
                let Some(v) = v else { continue };
                let labels = ReplicaLabels {
                    pool_namespace: namespace.clone(),
                    pool: pool.clone(),
                    kind,
                };
                ConstGauge::new(i64::from(v)).encode(m.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_prints_its_counts_and_decisions() {
        let mut r = Registrar::new();
        let m = PoolMetrics::register(&mut r);
        m.saw(
            "crawl",
            "eu",
            PoolGauges {
                desired: 6,
                ready: 5,
                leased: 4,
                min: Some(1),
            },
        );
        m.saw("crawl", "manual", PoolGauges::default());
        m.decided("crawl", "eu", "Refusals");
        let text = r.finish().encode().unwrap();
        for want in [
            "proxy_operator_pool_replicas{pool_namespace=\"crawl\",pool=\"eu\",kind=\"desired\"} 6",
            "proxy_operator_pool_replicas{pool_namespace=\"crawl\",pool=\"eu\",kind=\"ready\"} 5",
            "proxy_operator_pool_replicas{pool_namespace=\"crawl\",pool=\"eu\",kind=\"leased\"} 4",
            "proxy_operator_pool_replicas{pool_namespace=\"crawl\",pool=\"eu\",kind=\"min\"} 1",
            "proxy_operator_pool_replicas{pool_namespace=\"crawl\",pool=\"manual\",kind=\"desired\"} 0",
            "proxy_operator_pool_scaling_decisions_total{pool_namespace=\"crawl\",pool=\"eu\",reason=\"Refusals\"} 1",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        assert!(!text.contains("pool=\"manual\",kind=\"min\""), "{text}");
    }

    #[test]
    fn a_pool_not_seen_for_a_minute_stops_printing() {
        let rows = Rows::default();
        let t = Instant::now();
        rows.lock()
            .unwrap()
            .insert(("a".into(), "old".into()), (PoolGauges::default(), t));
        assert_eq!(fresh(&rows, t + STALE_AFTER / 2).len(), 1);
        assert!(fresh(&rows, t + STALE_AFTER).is_empty());
    }
}
