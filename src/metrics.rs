//! The Prometheus registry and its encoding. Each subsystem owns its
//! metric families (`provider::metrics`, `controller::metrics`,
//! `health::metrics`, `discovery::metrics`, `gc::metrics`,
//! `providerhealth::metrics`, `operator::metrics`) and registers them
//! through a [`Registrar`]; the composition root (`operator::Metrics`)
//! decides the order and serves the [`Exposition`].
//!
//! This module names no subsystem: they all depend on it, never the other
//! way round.

pub mod process;

use std::sync::{Arc, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Metric, Registry};

/// A family of histograms built by a plain constructor (its buckets).
pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Buckets of calls that reach a backend or the API server: 5ms .. ~80s
/// (a Pod get is milliseconds, a kvm create with a first image download is
/// a minute). Shared by provider calls and reconciles.
pub fn call_latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

/// The registry being filled, and the name of every family registered in
/// it (so a test can check that each one is exported and documented).
pub struct Registrar {
    registry: Registry,
    names: Vec<&'static str>,
}

impl Default for Registrar {
    fn default() -> Self {
        Self::new()
    }
}

impl Registrar {
    /// An empty registry.
    pub fn new() -> Self {
        Registrar {
            registry: Registry::default(),
            names: Vec::new(),
        }
    }

    /// Registers one family (a counter without its `_total` suffix).
    pub fn register(&mut self, name: &'static str, help: &str, metric: impl Metric) {
        self.names.push(name);
        self.registry.register(name, help, metric);
    }

    /// Registers a collector that writes the families `names` at scrape
    /// time. Collectors print after every registered family, in the order
    /// they were registered.
    pub fn register_collector(
        &mut self,
        names: &[&'static str],
        collector: impl Collector + 'static,
    ) {
        self.names.extend_from_slice(names);
        self.registry.register_collector(Box::new(collector));
    }

    /// The filled registry, ready to be scraped.
    pub fn finish(self) -> Exposition {
        Exposition {
            registry: Arc::new(self.registry),
            families: self.names.into(),
        }
    }
}

/// A filled registry, shared by the `/metrics` server and tests.
#[derive(Clone)]
pub struct Exposition {
    registry: Arc<Registry>,
    families: Arc<[&'static str]>,
}

impl std::fmt::Debug for Exposition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exposition")
            .field("families", &self.families)
            .finish()
    }
}

impl Exposition {
    /// The name of every family this registry can export, as registered
    /// (counters without their `_total` suffix). A family is printed only
    /// once it has a sample.
    pub fn family_names(&self) -> &[&'static str] {
        &self.families
    }

    /// The exposition text (OpenMetrics format, which Prometheus scrapes).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }

    /// The exposition in the Prometheus text format 0.0.4, for scrapers
    /// (and `promtool check metrics`) that do not ask for OpenMetrics.
    pub fn encode_prometheus_text(&self) -> Result<String, std::fmt::Error> {
        Ok(openmetrics_to_text(&self.encode()?))
    }
}

/// A value read at every scrape, from a source set once the part that
/// knows it runs (the Proxy cache, the lease store, the provider monitor).
/// Until then it reads as `None`.
pub struct Scraped<T> {
    source: Arc<RwLock<Option<ScrapeFn<T>>>>,
}

type ScrapeFn<T> = Arc<dyn Fn() -> T + Send + Sync>;

impl<T> Clone for Scraped<T> {
    fn clone(&self) -> Self {
        Scraped {
            source: self.source.clone(),
        }
    }
}

impl<T> Default for Scraped<T> {
    fn default() -> Self {
        Scraped {
            source: Arc::default(),
        }
    }
}

impl<T> std::fmt::Debug for Scraped<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scraped")
    }
}

impl<T> Scraped<T> {
    /// Sets (or replaces) the source.
    pub fn set(&self, f: impl Fn() -> T + Send + Sync + 'static) {
        *self.source.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(f));
    }

    /// The current value; `None` while no source is set.
    pub fn read(&self) -> Option<T> {
        // Called outside the lock: a source may take its own locks.
        let f = self
            .source
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()?;
        Some(f())
    }
}

/// Converts OpenMetrics text to the Prometheus text format: counter
/// families are named with their `_total` suffix and `# EOF` is dropped.
pub fn openmetrics_to_text(om: &str) -> String {
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .filter(|n| !n.ends_with("_total"))
        .collect();
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line == "# EOF" {
            continue;
        }
        let rewritten = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(rewritten.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_names_counters_with_total() {
        let om = "# HELP a_requests Calls.\n# TYPE a_requests counter\na_requests_total{x=\"1\"} 2\n# HELP g G.\n# TYPE g gauge\ng 1\n# EOF\n";
        assert_eq!(
            openmetrics_to_text(om),
            "# HELP a_requests_total Calls.\n# TYPE a_requests_total counter\na_requests_total{x=\"1\"} 2\n# HELP g G.\n# TYPE g gauge\ng 1\n"
        );
    }

    #[test]
    fn a_scraped_value_reads_its_latest_source() {
        let v: Scraped<i64> = Scraped::default();
        assert_eq!(v.read(), None);
        v.clone().set(|| 1);
        assert_eq!(v.read(), Some(1));
        v.set(|| 2);
        assert_eq!(v.read(), Some(2));
    }
}
