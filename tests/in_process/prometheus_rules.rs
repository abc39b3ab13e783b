//! config/prometheus: the PrometheusRule's groups pass `promtool check
//! rules` and the unit tests of rules_test.yaml (every alert fires on an
//! incident and stays quiet on a near miss), equal the bare rules.yaml,
//! query only documented series; the ServiceMonitor matches the metrics
//! Service. promtool must be installed: the test fails, never skips.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use serde_norway::Value;

const DIR: &str = "config/prometheus";

/// `spec.groups` of the PrometheusRule in alerts.yaml.
fn alert_groups() -> Value {
    let doc = support::repo_yaml(&format!("{DIR}/alerts.yaml"));
    assert_eq!(doc["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(doc["kind"], "PrometheusRule");
    let groups = doc["spec"]["groups"].clone();
    assert!(
        groups.as_sequence().is_some_and(|g| !g.is_empty()),
        "alerts.yaml has no spec.groups"
    );
    groups
}

/// Every rule of every group.
fn rules(groups: &Value) -> Vec<Value> {
    groups
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default())
        .collect()
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

#[test]
fn alerts_pass_promtool_check_and_unit_tests() {
    let dir = tempfile::tempdir().unwrap();
    let mut file = serde_norway::Mapping::new();
    file.insert("groups".into(), alert_groups());
    // rules_test.yaml loads rules.yaml next to it: here that is the groups
    // extracted from alerts.yaml.
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, serde_norway::to_string(&file).unwrap()).unwrap();
    let tests = dir.path().join("rules_test.yaml");
    std::fs::write(
        &tests,
        support::repo_file(&format!("{DIR}/rules_test.yaml")),
    )
    .unwrap();

    let out = support::promtool_ok(&["check".as_ref(), "rules".as_ref(), rules.as_os_str()]);
    assert!(out.contains("SUCCESS"), "{out}");
    let out = support::promtool_ok(&["test".as_ref(), "rules".as_ref(), tests.as_os_str()]);
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn bare_rules_file_equals_the_prometheus_rule() {
    let bare = support::repo_yaml(&format!("{DIR}/rules.yaml"));
    assert_eq!(
        bare["groups"],
        alert_groups(),
        "config/prometheus/rules.yaml differs from spec.groups of alerts.yaml"
    );
    let path = format!("{}/{DIR}/rules.yaml", env!("CARGO_MANIFEST_DIR"));
    support::promtool_ok(&["check", "rules", &path]);
}

#[test]
fn every_alert_is_actionable_and_unit_tested_both_ways() {
    let rules = rules(&alert_groups());
    let tests = support::repo_yaml(&format!("{DIR}/rules_test.yaml"));
    let cases: Vec<&Value> = tests["tests"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|t| t["alert_rule_test"].as_sequence().into_iter().flatten())
        .collect();
    let mut names = Vec::new();
    for rule in &rules {
        let name = text(&rule["alert"]);
        assert!(!name.is_empty(), "a rule without an alert name: {rule:?}");
        names.push(name);
        assert!(!text(&rule["for"]).is_empty(), "{name} has no for:");
        assert!(
            ["warning", "critical"].contains(&text(&rule["labels"]["severity"])),
            "{name}: severity must be warning or critical"
        );
        for a in ["summary", "description"] {
            assert!(
                text(&rule["annotations"][a]).len() > 20,
                "{name} needs a {a} annotation that says what to do"
            );
        }
        let of_this: Vec<&&Value> = cases
            .iter()
            .filter(|c| text(&c["alertname"]) == name)
            .collect();
        let fires = |c: &&&Value| c["exp_alerts"].as_sequence().is_some_and(|a| !a.is_empty());
        assert!(
            of_this.iter().any(fires),
            "rules_test.yaml never makes {name} fire"
        );
        assert!(
            of_this.iter().any(|c| !fires(c)),
            "rules_test.yaml has no case where {name} stays quiet"
        );
    }
    for required in [
        "ProxyOperatorProxiesNotReady",
        "ProxyOperatorProviderTargetDown",
        "ProxyOperatorNoLeaseCapacity",
        "ProxyOperatorGcFailing",
        "ProxyOperatorDown",
        "ProxyOperatorReconcileErrors",
        "ProxyOperatorDiscoveryErrors",
    ] {
        assert!(names.contains(&required), "{required} is missing");
    }
}

/// Where every runbook_url points: the runbook files in the repository.
const RUNBOOK_BASE: &str =
    "https://gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/src/branch/main/";

#[test]
fn every_alert_links_a_runbook_that_exists() {
    for rule in rules(&alert_groups()) {
        let name = text(&rule["alert"]);
        let url = text(&rule["annotations"]["runbook_url"]);
        let want = format!("{RUNBOOK_BASE}docs/runbooks/{name}.md");
        assert_eq!(url, want, "{name}: runbook_url");
        let runbook = support::repo_file(&format!("docs/runbooks/{name}.md"));
        for section in ["## What it means", "## How to confirm", "## What to do"] {
            assert!(
                runbook.contains(section),
                "docs/runbooks/{name}.md has no \"{section}\" section"
            );
        }
    }
}

#[test]
fn alert_expressions_query_documented_series() {
    let documented = support::documented_metrics();
    for rule in rules(&alert_groups()) {
        let expr = text(&rule["expr"]);
        let names = support::metric_names_in(expr);
        assert!(!names.is_empty(), "{expr} queries no operator series");
        for n in names {
            assert!(
                support::resolve_metric(&n, &documented).is_some(),
                "{} queries {n}, which docs/metrics.md does not list",
                text(&rule["alert"])
            );
        }
    }
}

#[test]
fn service_monitor_scrapes_the_metrics_service_over_https_with_a_token() {
    let kustomization = support::repo_yaml(&format!("{DIR}/kustomization.yaml"));
    let resources: Vec<&str> = kustomization["resources"]
        .as_sequence()
        .into_iter()
        .flatten()
        .map(text)
        .collect();
    assert_eq!(resources, ["monitor.yaml", "alerts.yaml"]);

    let m = support::repo_yaml(&format!("{DIR}/monitor.yaml"));
    assert_eq!(m["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(m["kind"], "ServiceMonitor");
    // Before the kustomize namePrefix and namespace, like the Service.
    assert_eq!(m["metadata"]["namespace"], "system");
    // The selector picks exactly the metrics Service of config/default.
    let selector: serde_json::Value =
        serde_json::to_value(&m["spec"]["selector"]["matchLabels"]).unwrap();
    let selected: Vec<String> = support::kustomize("config/default")
        .iter()
        .filter(|d| d["kind"] == "Service")
        .filter(|d| {
            selector
                .as_object()
                .unwrap()
                .iter()
                .all(|(k, v)| &d["metadata"]["labels"][k] == v)
        })
        .map(|d| d["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        selected,
        ["egress-proxies-operator-controller-manager-metrics-service"]
    );
    let endpoints = m["spec"]["endpoints"].as_sequence().unwrap();
    assert_eq!(endpoints.len(), 1);
    let e = &endpoints[0];
    assert_eq!(e["port"], "metrics");
    assert_eq!(e["path"], "/metrics");
    // --metrics-secure (the default): HTTPS with a self-signed certificate,
    // and the scraper's own ServiceAccount token (src/metrics_auth.rs).
    assert_eq!(e["scheme"], "https");
    assert_eq!(
        e["bearerTokenFile"],
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    );
    assert_eq!(e["tlsConfig"]["insecureSkipVerify"], true);
}

#[test]
fn kustomize_renders_the_service_monitor_and_the_rule() {
    // kubectl is required like promtool (CI installs both).
    let kinds: Vec<String> = support::kustomize(DIR)
        .iter()
        .map(|v| {
            format!(
                "{}/{}",
                v["kind"].as_str().unwrap_or(""),
                v["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "PrometheusRule/alerts",
            "ServiceMonitor/controller-manager-metrics-monitor"
        ]
    );
}
