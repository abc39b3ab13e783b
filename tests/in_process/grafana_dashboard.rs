//! config/grafana/egress-proxies-operator.json: a dashboard Grafana can
//! import (title, uid, panels with targets, the `${datasource}` variable),
//! whose queries are valid PromQL (`promtool check rules` on them as
//! recording rules) over documented series only, and which shows every
//! documented series somewhere.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use std::collections::BTreeSet;

use serde_json::Value;

const PATH: &str = "config/grafana/egress-proxies-operator.json";
const DATASOURCE: &str = "${datasource}";

fn dashboard() -> Value {
    serde_json::from_str(&support::repo_file(PATH)).unwrap_or_else(|e| panic!("{PATH}: {e}"))
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// Every panel, rows and the panels of collapsed rows included.
fn all_panels(d: &Value) -> Vec<&Value> {
    fn walk<'a>(panels: &'a Value, out: &mut Vec<&'a Value>) {
        for p in panels.as_array().into_iter().flatten() {
            out.push(p);
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&d["panels"], &mut out);
    out
}

/// The panels that query (rows excluded).
fn query_panels(d: &Value) -> Vec<&Value> {
    all_panels(d)
        .into_iter()
        .filter(|p| p["type"] != "row")
        .collect()
}

/// (panel title, expr) of every target.
fn exprs(d: &Value) -> Vec<(String, String)> {
    query_panels(d)
        .into_iter()
        .flat_map(|p| {
            p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |t| (text(&p["title"]).to_string(), text(&t["expr"]).to_string()))
        })
        .collect()
}

#[test]
fn dashboard_has_the_shape_grafana_imports() {
    let d = dashboard();
    assert!(!text(&d["title"]).is_empty(), "no title");
    let uid = text(&d["uid"]);
    assert!(
        !uid.is_empty() && uid.len() <= 40,
        "uid must be 1..=40 characters: {uid:?}"
    );
    assert!(d["schemaVersion"].is_u64(), "no schemaVersion");

    let vars = d["templating"]["list"].as_array().expect("templating.list");
    assert!(
        vars.iter().any(|v| v["name"] == "datasource"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "needs a `datasource` variable of type datasource, query prometheus"
    );

    let panels = query_panels(&d);
    assert!(panels.len() >= 10, "only {} panels", panels.len());
    let all = all_panels(&d);
    let ids: BTreeSet<u64> = all
        .iter()
        .map(|p| p["id"].as_u64().expect("every panel has a numeric id"))
        .collect();
    assert_eq!(ids.len(), all.len(), "panel ids are not unique");
    for p in panels {
        let title = text(&p["title"]);
        assert!(!title.is_empty(), "a panel without a title: {p}");
        assert!(!text(&p["type"]).is_empty(), "{title}: no type");
        for k in ["x", "y", "w", "h"] {
            assert!(p["gridPos"][k].is_u64(), "{title}: gridPos.{k}");
        }
        assert_eq!(p["datasource"]["uid"], DATASOURCE, "{title}: datasource");
        let targets = p["targets"].as_array().filter(|t| !t.is_empty());
        let targets = targets.unwrap_or_else(|| panic!("{title}: no targets"));
        let mut refs = BTreeSet::new();
        for t in targets {
            assert!(!text(&t["expr"]).is_empty(), "{title}: empty expr");
            assert!(refs.insert(text(&t["refId"])), "{title}: duplicate refId");
            assert_eq!(
                t["datasource"]["uid"], DATASOURCE,
                "{title}: target datasource"
            );
        }
    }
}

#[test]
fn dashboard_queries_documented_series_and_shows_them_all() {
    let documented = support::documented_metrics();
    let mut shown = BTreeSet::new();
    for (title, expr) in exprs(&dashboard()) {
        let names = support::metric_names_in(&expr);
        assert!(
            !names.is_empty(),
            "{title}: {expr} queries no operator series"
        );
        for n in names {
            let series = support::resolve_metric(&n, &documented)
                .unwrap_or_else(|| panic!("{title}: {n} is not a series in docs/metrics.md"));
            shown.insert(series.to_string());
        }
    }
    let missing: Vec<&String> = documented.keys().filter(|n| !shown.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "no panel shows {missing:?}: add one to {PATH}"
    );
}

#[test]
fn dashboard_queries_are_valid_promql() {
    // Grafana's variables are not PromQL: give them values first.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let all = exprs(&dashboard());
    for (i, (_, expr)) in all.iter().enumerate() {
        let expr = expr
            .replace("$__rate_interval", "5m")
            .replace("$__interval", "1m")
            .replace("$namespace", ".*");
        assert!(!expr.contains('$'), "unknown variable in {expr}");
        rules.push_str(&format!(
            "      - record: dashboard:query_{i}\n        expr: {}\n",
            serde_json::to_string(&expr).unwrap()
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard-queries.yaml");
    std::fs::write(&file, &rules).unwrap();
    let out = support::promtool_ok(&["check".as_ref(), "rules".as_ref(), file.as_os_str()]);
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", all.len())),
        "{out}"
    );
}
