//! Every series the operator can export is in the table of
//! docs/metrics.md with its type, and every series the table names is
//! exported: the registry is the one main builds (`Metrics::with_per_proxy`,
//! with the opt-in per-proxy series on), with a sample in every family so
//! that every family prints.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use egress_proxies_operator::gc::SweepResult;
use egress_proxies_operator::operator::Metrics;
use egress_proxies_operator::providerhealth::metrics::TargetSample;

/// The operator's registry with at least one sample in every family.
fn populated() -> Metrics {
    let m = Metrics::with_per_proxy(true);
    let took = Duration::from_millis(12);
    m.provider.observe("gcp-eu", "create", "ok", took);
    m.reconcile.observe("proxy", false, took);
    m.throttle.held("gcp-eu", "rate");
    m.throttle.set_limiters(|| {
        vec![(
            "gcp-eu".into(),
            egress_proxies_operator::controller::throttle::limiter::Gauges {
                tokens: 1,
                in_flight: 2,
                waiting: 3,
            },
        )]
    });
    m.health
        .observe("crawl/px-1", "gcp-eu", Some("timeout"), took);
    m.discovery
        .observe_request("POST /v1/leases", 201, "crawler-a", took);
    m.discovery.lease_event("granted", 1);
    m.discovery.forwarded("relayed");
    m.discovery.feed_answer("delta");
    m.discovery.told_dropped();
    m.gc.start(&["gcp-eu"]);
    m.gc.sweep("gcp-eu", SweepResult::Ok);
    m.gc.deleted("gcp-eu");
    m.gc.delete_failed("gcp-eu");
    m.phases
        .set_phases(|| vec![("Ready".into(), "gcp-eu".into(), 1)]);
    m.discovery.set_leases(|| 1);
    m.circuit.set_states(|| vec![("gcp-eu".into(), true)]);
    m.pool.decided("crawl", "eu", "Refusals");
    m.gateway
        .request(egress_proxies_operator::gateway::metrics::RequestLabels {
            client: "crawler-a".into(),
            kind: "connect",
            pool: "eu".into(),
            result: "ok",
        });
    m.gateway.set_up(took);
    m.gateway.upstream_error("connect");
    m.gateway.connection_refused("address_full");
    m.gateway.tunnel_opened();
    m.gateway.tunnel_closed(took, 10, 20);
    m.gateway.session_moved();
    m.gateway.set_sessions(1);
    m.pool.saw(
        "crawl",
        "eu",
        egress_proxies_operator::pool::metrics::PoolGauges {
            desired: 2,
            ready: 1,
            leased: 1,
            min: Some(1),
        },
    );
    m.provider_health.set_targets(|| {
        vec![TargetSample {
            provider: "kvm-home".into(),
            target: "nas1".into(),
            up: true,
            duration_seconds: 0.1,
            timestamp_seconds: 1_700_000_000.0,
        }]
    });
    m
}

/// `# TYPE <name> <type>` lines of an exposition.
fn types(exposition: &str) -> BTreeMap<String, String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect()
}

/// The families as Prometheus stores and users query them (counters with
/// `_total`), with their type.
fn exported() -> BTreeMap<String, String> {
    let m = populated();
    let openmetrics = types(&m.encode().unwrap());
    for name in m.family_names() {
        assert!(
            openmetrics.contains_key(*name),
            "family {name} has no sample in this test: add one to populated() \
             so that it is checked against docs/metrics.md"
        );
    }
    assert_eq!(
        openmetrics.len(),
        m.family_names().len(),
        "printed families {:?} differ from the registered ones {:?}",
        openmetrics.keys(),
        m.family_names()
    );
    types(&m.encode_prometheus_text().unwrap())
}

/// The families print in the order they always have (dashboards and
/// diffs of scrapes read them so): registered families by subsystem, then
/// the scrape-time gauges.
#[test]
fn the_exposition_keeps_its_family_order() {
    let text = populated().encode().unwrap();
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
            "proxy_operator_creates_throttled",
            "proxy_operator_healthcheck_duration_seconds",
            "proxy_operator_healthcheck_failures",
            "proxy_operator_proxy_healthcheck_duration_seconds",
            "proxy_operator_proxy_healthcheck_failures",
            "proxy_operator_discovery_requests",
            "proxy_operator_discovery_request_duration_seconds",
            "proxy_operator_lease_events",
            "proxy_operator_discovery_forwarded",
            "proxy_operator_lease_feed_answers",
            "proxy_operator_lease_copy_lag_seconds",
            "proxy_operator_lease_copy_behind_changes",
            "proxy_operator_gateway_leader_messages_dropped",
            "proxy_operator_discovery_token_reload_failures",
            "proxy_operator_discovery_tokens_last_reload_successful",
            "proxy_operator_discovery_token_clients",
            "proxy_operator_lease_key_shared",
            "proxy_operator_gc_sweeps",
            "proxy_operator_gc_deleted",
            "proxy_operator_gc_delete_failures",
            "proxy_operator_gc_last_success_timestamp_seconds",
            "proxy_operator_leader",
            "proxy_operator_leader_step_downs",
            "proxy_operator_config_reload_failures",
            "proxy_operator_config_last_reload_successful",
            "proxy_operator_config_last_reload_success_timestamp_seconds",
            "proxy_operator_pool_scaling_decisions",
            "proxy_operator_gateway_requests",
            "proxy_operator_gateway_setup_seconds",
            "proxy_operator_gateway_upstream_errors",
            "proxy_operator_gateway_connections_refused",
            "proxy_operator_gateway_tunnels_open",
            "proxy_operator_gateway_tunnel_duration_seconds",
            "proxy_operator_gateway_tunnel_bytes",
            "proxy_operator_gateway_session_moves",
            "proxy_operator_gateway_sessions",
            "proxy_operator_proxies",
            "proxy_operator_create_tokens",
            "proxy_operator_creates_in_flight",
            "proxy_operator_creates_waiting",
            "proxy_operator_leases_active",
            "proxy_operator_lease_site_cooldowns",
            "proxy_operator_lease_copy_age_seconds",
            "proxy_operator_provider_target_up",
            "proxy_operator_provider_check_duration_seconds",
            "proxy_operator_provider_check_timestamp_seconds",
            "proxy_operator_provider_circuit_open",
            "proxy_operator_pool_replicas",
            "proxy_operator_build_info",
            "process_cpu_seconds",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ]
    );
}

#[test]
fn every_exported_series_is_documented_with_its_type() {
    let documented = support::documented_metrics();
    let mut missing = Vec::new();
    for (name, kind) in exported() {
        match documented.get(&name) {
            Some(doc) if *doc == kind => {}
            Some(doc) => missing.push(format!("{name}: documented as {doc}, exported as {kind}")),
            None => missing.push(format!("{name} ({kind}) is not in the table")),
        }
        if kind == "counter" {
            assert!(name.ends_with("_total"), "{name}");
        }
    }
    assert!(
        missing.is_empty(),
        "docs/metrics.md is out of date:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_documented_series_is_exported() {
    let exported = exported();
    let documented = support::documented_metrics();
    assert!(
        documented.len() >= 10,
        "the table parser found only {documented:?}"
    );
    let stale: Vec<&String> = documented
        .keys()
        .filter(|n| !exported.contains_key(*n))
        .collect();
    assert!(
        stale.is_empty(),
        "docs/metrics.md names series the operator does not export: {stale:?}"
    );
}

#[test]
fn promql_names_resolve_to_documented_series() {
    let documented = support::documented_metrics();
    let expr = r#"histogram_quantile(0.9, sum by (le) (rate(proxy_operator_reconcile_duration_seconds_bucket[5m]))) / on() proxy_operator_proxies{phase="Ready"} + x_proxy_operator_y"#;
    let names = support::metric_names_in(expr);
    assert_eq!(
        names,
        [
            "proxy_operator_reconcile_duration_seconds_bucket",
            "proxy_operator_proxies"
        ]
    );
    assert_eq!(
        support::resolve_metric(&names[0], &documented),
        Some("proxy_operator_reconcile_duration_seconds")
    );
    // The standard process series are found and documented too.
    let names = support::metric_names_in("rate(process_cpu_seconds_total[5m]) / x_process_y");
    assert_eq!(names, ["process_cpu_seconds_total"]);
    assert_eq!(
        support::resolve_metric(&names[0], &documented),
        Some("process_cpu_seconds_total")
    );
    // `_count` of a counter or gauge is not a series.
    assert_eq!(
        support::resolve_metric("proxy_operator_proxies_count", &documented),
        None
    );
    assert_eq!(
        support::resolve_metric("proxy_operator_reconcile_total", &documented),
        Some("proxy_operator_reconcile_total")
    );
}

/// The `result` label of the provider call counter lists every value a call
/// can end with: `ok` and each error class's label.
#[test]
fn provider_result_labels_are_documented() {
    use egress_proxies_operator::provider::ErrorClass;
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md")).unwrap();
    let row = doc
        .lines()
        .find(|l| l.starts_with("| `proxy_operator_provider_requests_total`"))
        .expect("the provider requests row");
    let labels = std::iter::once("ok").chain(ErrorClass::ALL.iter().map(|c| c.metric_label()));
    for label in labels {
        assert!(
            row.contains(&format!("`{label}`")),
            "docs/metrics.md does not list result `{label}`: {row}"
        );
    }
}
