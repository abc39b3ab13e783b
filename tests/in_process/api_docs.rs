//! docs/api.md is written from the OpenAPI document the server serves: every
//! operation has a row in its endpoint table, and the row names every
//! status code the document declares for it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::time::Duration;

#[test]
fn every_openapi_operation_and_status_is_in_api_md() {
    let doc: serde_json::Value = serde_json::from_str(
        &egress_proxies_operator::discovery::openapi_json(Duration::from_secs(3600)),
    )
    .unwrap();
    let md = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/api.md")).unwrap();
    let mut problems = Vec::new();
    let mut ops = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            ops += 1;
            let key = format!("`{} {path}`", method.to_uppercase());
            let Some(row) = md.lines().find(|l| l.starts_with(&format!("| {key}"))) else {
                problems.push(format!("no row for {key}"));
                continue;
            };
            for code in op["responses"].as_object().unwrap().keys() {
                if !row.contains(code.as_str()) {
                    problems.push(format!("{key}: status {code} not in its row"));
                }
            }
        }
    }
    assert!(ops >= 7, "the document has {ops} operations");
    assert!(
        problems.is_empty(),
        "docs/api.md is behind the OpenAPI document: {problems:#?}"
    );
}
