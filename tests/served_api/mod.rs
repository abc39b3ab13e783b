//! What the discovery API serves in the tests that run it in a process of
//! its own (the fuzz run and the abuse test): Ready, Healthy Proxies on
//! 127.0.0.x and a lease store.
#![allow(clippy::unwrap_used, dead_code)] // a test fixture

use std::sync::Arc;
use std::time::Duration;

use egress_proxies_operator::api::Proxy;
use egress_proxies_operator::lease::{LeaseConfig, LeaseStore};
use serde_json::{json, Value};

/// `n` Ready and Healthy Proxies `p0`.. in `namespace`, at 127.0.0.2 on,
/// each with `spec` merged over `{provider: kubernetes, port: 3128}`.
pub fn ready_proxies(n: usize, namespace: &str, spec: Value) -> Vec<Arc<Proxy>> {
    (0..n)
        .map(|i| {
            let mut full = json!({"provider": "kubernetes", "port": 3128});
            if let (Some(f), Some(extra)) = (full.as_object_mut(), spec.as_object()) {
                f.extend(extra.clone());
            }
            Arc::new(
                serde_json::from_value(json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                    "metadata": {"name": format!("p{i}"), "namespace": namespace},
                    "spec": full,
                    "status": {"phase": "Ready", "ip": format!("127.0.0.{}", i + 2),
                        "conditions": [{"type": "Healthy", "status": "True", "reason": "ProbeSucceeded",
                        "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z"}]}}))
                .unwrap(),
            )
        })
        .collect()
}

/// A lease store with 5-minute default TTL and cooldown, a 1-hour cap, and
/// `max_leases_per_proxy`.
pub fn leases(max_leases_per_proxy: u32) -> Arc<LeaseStore> {
    Arc::new(LeaseStore::new(LeaseConfig {
        max_leases_per_proxy,
        default_ttl: Duration::from_secs(300),
        max_ttl: Duration::from_secs(3600),
        cooldown: Duration::from_secs(300),
    }))
}
