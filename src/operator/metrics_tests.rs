use std::time::Duration;

use super::*;
use crate::gc::metrics::SweepResult;
use crate::providerhealth::metrics::TargetSample;

#[test]
fn the_scrape_time_gauges_follow_their_sources() {
    let m = Metrics::new();
    let empty = m.encode().unwrap();
    assert!(empty.contains("proxy_operator_leases_active 0"), "{empty}");
    assert!(!empty.contains("proxy_operator_proxies"), "{empty}");
    m.phases
        .set_phases(|| vec![("Ready".into(), 2), ("Pending".into(), 1)]);
    m.discovery.set_leases(|| 3);
    let text = m.encode().unwrap();
    for want in [
        "proxy_operator_proxies{phase=\"Ready\"} 2",
        "proxy_operator_proxies{phase=\"Pending\"} 1",
        "proxy_operator_leases_active 3",
    ] {
        assert!(text.contains(want), "missing {want} in\n{text}");
    }
}

/// The families print in the order they always have: registered families
/// by subsystem, then the scrape-time gauges.
#[test]
fn the_exposition_keeps_its_family_order() {
    let m = Metrics::new();
    let took = Duration::from_millis(12);
    m.provider.observe("gcp-eu", "create", "ok", took);
    m.reconcile.observe("proxy", false, took);
    m.health.observe("crawl/px-1", Some("timeout"), took);
    m.discovery.observe_request("POST /v1/leases", 201, took);
    m.discovery.lease_event("granted", 1);
    m.gc.start(&["gcp-eu"]);
    m.gc.sweep("gcp-eu", SweepResult::Ok);
    m.phases.set_phases(|| vec![("Ready".into(), 1)]);
    m.provider_health.set_targets(|| {
        vec![TargetSample {
            provider: "kvm-home".into(),
            target: "nas1".into(),
            up: true,
            duration_seconds: 0.1,
            timestamp_seconds: 1_700_000_000.0,
        }]
    });
    let text = m.encode().unwrap();
    let order: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    assert_eq!(
        order,
        [
            "proxy_operator_provider_requests",
            "proxy_operator_provider_request_duration_seconds",
            "proxy_operator_reconcile",
            "proxy_operator_reconcile_errors",
            "proxy_operator_reconcile_duration_seconds",
            "proxy_operator_healthcheck_duration_seconds",
            "proxy_operator_healthcheck_failures",
            "proxy_operator_discovery_requests",
            "proxy_operator_discovery_request_duration_seconds",
            "proxy_operator_lease_events",
            "proxy_operator_gc_sweeps",
            "proxy_operator_gc_deleted",
            "proxy_operator_gc_delete_failures",
            "proxy_operator_gc_last_success_timestamp_seconds",
            "proxy_operator_proxies",
            "proxy_operator_leases_active",
            "proxy_operator_provider_target_up",
            "proxy_operator_provider_check_duration_seconds",
            "proxy_operator_provider_check_timestamp_seconds",
        ]
    );
    let mut registered = m.family_names().to_vec();
    registered.sort_unstable();
    let mut printed = order.clone();
    printed.sort_unstable();
    assert_eq!(registered, printed);
}
