//! The committed CRDs are exactly what the Rust types generate, and they
//! are structural as kube-apiserver requires, with a description on every
//! field so `kubectl explain` helps.

use egress_proxies_operator::api::crd;
use serde_json::Value;

#[test]
fn committed_crds_match_the_types() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/crd/bases");
    for (file, def) in crd::all() {
        let want = crd::to_yaml(&def).unwrap();
        let have = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        assert!(
            have == want,
            "config/crd/bases/{file} differs from the types in src/api: run `make crds` and commit the result"
        );
    }
}

/// Walks a schema node, collecting violations of the structural rules.
fn check(node: &Value, path: &str, problems: &mut Vec<String>, needs_description: bool) {
    let Some(obj) = node.as_object() else {
        problems.push(format!("{path}: not an object"));
        return;
    };
    if obj.contains_key("$ref") {
        problems.push(format!("{path}: $ref"));
    }
    for forbidden in ["anyOf", "oneOf", "allOf", "not"] {
        if obj.contains_key(forbidden) && !obj.contains_key("type") {
            problems.push(format!("{path}: {forbidden} without a type"));
        }
    }
    let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    let preserve = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if !obj.contains_key("type") && !int_or_string && !preserve {
        problems.push(format!("{path}: no type"));
    }
    if needs_description
        && obj
            .get("description")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        problems.push(format!("{path}: no description"));
    }
    if obj.contains_key("properties") && obj.contains_key("additionalProperties") {
        problems.push(format!(
            "{path}: properties and additionalProperties together"
        ));
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            check(v, &format!("{path}.{k}"), problems, true);
        }
    }
    if let Some(ap) = obj.get("additionalProperties") {
        if ap.is_object() {
            check(ap, &format!("{path}[*]"), problems, false);
        }
    }
    if let Some(items) = obj.get("items") {
        check(items, &format!("{path}[]"), problems, false);
        if obj.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map") {
            let keys: Vec<&str> = obj
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if keys.is_empty() {
                problems.push(format!("{path}: list-type map without keys"));
            }
            let required: Vec<&str> = items
                .get("required")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for k in keys {
                if !required.contains(&k) {
                    problems.push(format!("{path}: list-map key {k} is not required"));
                }
            }
        }
    }
}

#[test]
fn schemas_are_structural_and_documented() {
    for (file, def) in crd::all() {
        let v = serde_json::to_value(&def).unwrap();
        for version in v["spec"]["versions"].as_array().unwrap() {
            let schema = &version["schema"]["openAPIV3Schema"];
            let mut problems = Vec::new();
            check(schema, "", &mut problems, true);
            assert!(problems.is_empty(), "{file}: {problems:#?}");
        }
    }
}

/// Checks scope, short name, version, status subresource and printer
/// columns; returns the version entry.
fn identity<'a>(crd: &'a Value, scope: &str, short: &str, columns: &[&str]) -> &'a Value {
    assert_eq!(crd["spec"]["scope"], scope);
    assert_eq!(crd["spec"]["names"]["shortNames"][0], short);
    let v = &crd["spec"]["versions"][0];
    assert_eq!(v["name"], "v1alpha1");
    assert!(v["subresources"]["status"].is_object());
    let cols: Vec<&str> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(cols, columns);
    v
}

#[test]
fn names_scopes_columns_and_subresources() {
    let px = serde_json::to_value(crd::proxy_crd()).unwrap();
    assert_eq!(px["metadata"]["name"], "proxies.crawl.example.com");
    let v = identity(
        &px,
        "Namespaced",
        "px",
        &["Mode", "Provider", "Phase", "IP", "Healthy", "Age"],
    );
    let spec = &v["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(spec["properties"]["mode"]["default"], "Managed");
    assert_eq!(spec["properties"]["port"]["minimum"], 1.0);
    assert_eq!(spec["properties"]["port"]["maximum"], 65535.0);
    assert_eq!(spec["properties"]["provider"]["maxLength"], 63);
    let rules: Vec<&str> = spec["x-kubernetes-validations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rule"].as_str().unwrap())
        .collect();
    assert!(
        rules.iter().any(|r| r.contains("has(self.endpoint)")),
        "{rules:?}"
    );
    for immutable in ["mode", "provider"] {
        assert_eq!(
            spec["properties"][immutable]["x-kubernetes-validations"][0]["rule"], "self == oldSelf",
            "{immutable}"
        );
    }
    assert!(
        spec["properties"]["cloudInit"]["x-kubernetes-validations"][0]["rule"]
            .as_str()
            .unwrap()
            .contains("secretRef")
    );
    let status = &v["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
    assert!(
        status["phase"].is_object() && status["ip"].is_object() && status["providerID"].is_object()
    );

    let ph = serde_json::to_value(crd::provider_health_crd()).unwrap();
    assert_eq!(ph["metadata"]["name"], "providerhealths.crawl.example.com");
    let v = identity(
        &ph,
        "Cluster",
        "ph",
        &["Type", "Ready", "Targets", "Last Check", "Age"],
    );
    let props = &v["schema"]["openAPIV3Schema"]["properties"];
    assert!(props.get("spec").is_none(), "ProviderHealth has no spec");
    let targets = &props["status"]["properties"]["targets"];
    assert_eq!(targets["x-kubernetes-list-map-keys"][0], "name");
    assert_eq!(targets["items"]["properties"]["message"]["maxLength"], 1024);
}

#[test]
fn proxy_round_trips_through_json() {
    use egress_proxies_operator::api::{Proxy, ProxyMode};
    let doc = serde_json::json!({
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"provider": "kubernetes", "port": 3128, "attributes": {"geo": "home"},
                  "cloudInit": {"secretRef": {"name": "ci"}}},
        "status": {"phase": "Ready", "providerID": "default/proxy-x", "ip": "127.0.0.2"}
    });
    let p: Proxy = serde_json::from_value(doc.clone()).unwrap();
    assert_eq!(p.spec.mode, ProxyMode::Managed);
    assert_eq!(
        p.spec
            .cloud_init
            .as_ref()
            .unwrap()
            .secret_ref
            .as_ref()
            .unwrap()
            .key_or_default(),
        "user-data"
    );
    let back = serde_json::to_value(&p).unwrap();
    assert_eq!(back["status"]["providerID"], "default/proxy-x");
    assert_eq!(back["spec"]["mode"], "Managed");
}
