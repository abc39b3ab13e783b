//! The orphan GC's series, per configured provider.

use std::sync::atomic::AtomicU64;
use std::time::SystemTime;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::metrics::Registrar;

/// Labels of the GC series that are per provider.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabel {
    /// Configured provider name.
    pub provider: String,
}

/// Labels of the GC sweep counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SweepLabels {
    /// Configured provider name.
    pub provider: String,
    /// `ok`, `error` or `aborted` ([`SweepResult`]).
    pub result: String,
}

/// How the sweep of one provider ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SweepResult {
    /// The provider's instances were listed and every verdict carried out
    /// (a failed delete is counted on its own and still makes `ok`).
    Ok,
    /// Nothing of this provider was swept: listing its instances failed,
    /// or the Proxy list failed (then every provider counts `error`).
    Error,
    /// The sweep ran past half of `--gc-min-age` before this provider's
    /// deletes were done; what was left waits for the next sweep.
    Aborted,
}

impl SweepResult {
    /// The `result` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SweepResult::Ok => "ok",
            SweepResult::Error => "error",
            SweepResult::Aborted => "aborted",
        }
    }
}

/// Series written by the orphan GC, per configured provider.
#[derive(Clone)]
pub struct GcMetrics {
    sweeps: Family<SweepLabels, Counter>,
    deleted: Family<ProviderLabel, Counter>,
    delete_failures: Family<ProviderLabel, Counter>,
    last_success: Family<ProviderLabel, Gauge<f64, AtomicU64>>,
}

impl GcMetrics {
    /// The families, registered in `registry`.
    pub fn register(registry: &mut Registrar) -> Self {
        let m = GcMetrics {
            sweeps: Family::default(),
            deleted: Family::default(),
            delete_failures: Family::default(),
            last_success: Family::default(),
        };
        registry.register(
            "proxy_operator_gc_sweeps",
            "Orphan GC sweeps by configured provider and result (ok; error when the provider's instances or the Proxies could not be listed; aborted when the sweep ran past half of --gc-min-age)",
            m.sweeps.clone(),
        );
        registry.register(
            "proxy_operator_gc_deleted",
            "Orphaned instances the GC deleted, by configured provider",
            m.deleted.clone(),
        );
        registry.register(
            "proxy_operator_gc_delete_failures",
            "Deletes of orphaned instances that failed, by configured provider",
            m.delete_failures.clone(),
        );
        registry.register(
            "proxy_operator_gc_last_success_timestamp_seconds",
            "Unix time of the latest GC sweep of the provider that ended ok",
            m.last_success.clone(),
        );
        m
    }

    fn provider(provider: &str) -> ProviderLabel {
        ProviderLabel {
            provider: provider.to_string(),
        }
    }

    /// Creates the counters of `providers` at zero, so that their first
    /// increment is visible to `increase()` and the series exist from the
    /// start.
    pub fn start(&self, providers: &[&str]) {
        for p in providers {
            for result in [SweepResult::Ok, SweepResult::Error, SweepResult::Aborted] {
                let _ = self.sweeps.get_or_create(&SweepLabels {
                    provider: p.to_string(),
                    result: result.as_str().to_string(),
                });
            }
            let _ = self.deleted.get_or_create(&Self::provider(p));
            let _ = self.delete_failures.get_or_create(&Self::provider(p));
        }
    }

    /// Counts one sweep of `provider`; an `ok` one also sets its
    /// last-success time to now.
    pub fn sweep(&self, provider: &str, result: SweepResult) {
        self.sweeps
            .get_or_create(&SweepLabels {
                provider: provider.to_string(),
                result: result.as_str().to_string(),
            })
            .inc();
        if result == SweepResult::Ok {
            // A clock before 1970 would be a broken host; 0 then reads as
            // "never", which is what an alert should see.
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            self.last_success
                .get_or_create(&Self::provider(provider))
                .set(now);
        }
    }

    /// Counts one orphan deleted.
    pub fn deleted(&self, provider: &str) {
        self.deleted.get_or_create(&Self::provider(provider)).inc();
    }

    /// Counts one failed delete of an orphan.
    pub fn delete_failed(&self, provider: &str) {
        self.delete_failures
            .get_or_create(&Self::provider(provider))
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_creates_the_provider_counters_at_zero() {
        let mut r = Registrar::new();
        let m = GcMetrics::register(&mut r);
        let exposition = r.finish();
        assert!(!exposition.encode().unwrap().contains("proxy_operator_gc_"));
        m.start(&["gcp-eu"]);
        let text = exposition.encode_prometheus_text().unwrap();
        for want in [
            "proxy_operator_gc_sweeps_total{provider=\"gcp-eu\",result=\"ok\"} 0",
            "proxy_operator_gc_sweeps_total{provider=\"gcp-eu\",result=\"error\"} 0",
            "proxy_operator_gc_deleted_total{provider=\"gcp-eu\"} 0",
            "proxy_operator_gc_delete_failures_total{provider=\"gcp-eu\"} 0",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        // No sweep has succeeded yet: no last-success time.
        assert!(
            !text.contains("proxy_operator_gc_last_success_timestamp_seconds{"),
            "{text}"
        );
    }
}
