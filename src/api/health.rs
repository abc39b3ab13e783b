//! The contract between the health engine (which probes) and the Proxy
//! reconciler (which writes what the probes found into the status). Both
//! depend on it; neither depends on the other.

use chrono::{DateTime, Utc};

/// A health verdict source (the health engine, once it runs).
pub trait HealthSource: Send + Sync {
    /// The current verdict for a Proxy: `Some(true)` healthy, `Some(false)`
    /// unhealthy, `None` before the first verdict.
    fn verdict(&self, namespace: &str, name: &str, uid: &str) -> Option<bool>;

    /// The last status-affecting result, folded into the Proxy's status.
    /// Sources that only know verdicts return `None`.
    fn report(&self, namespace: &str, name: &str, uid: &str) -> Option<HealthReport> {
        let _ = (namespace, name, uid);
        None
    }

    /// The proxy host the current verdict was probed through, where the
    /// source knows it: a replaced instance's verdict stays until the
    /// source sees the new address, and must not be read as the new one's.
    fn probed_host(&self, namespace: &str, name: &str, uid: &str) -> Option<String> {
        let _ = (namespace, name, uid);
        None
    }
}

/// The health engine's last status-affecting result for one Proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthReport {
    /// The verdict.
    pub healthy: bool,
    /// Latency of that result.
    pub latency_ms: u64,
    /// When it was taken.
    pub probed_at: DateTime<Utc>,
    /// Why (the probe error when unhealthy).
    pub message: String,
}
