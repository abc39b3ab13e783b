//! The committed CRDs are exactly what the Rust types generate, and they
//! are structural as kube-apiserver requires, with a description on every
//! field so `kubectl explain` helps.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use egress_proxies_operator::api::crd;
use serde_json::{json, Value};

#[test]
fn committed_crds_match_the_types() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    for (file, def) in crd::all() {
        let want = crd::to_yaml(&def).unwrap();
        let have = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        assert!(
            have == want,
            "crds/{file} differs from the types in src/api: run `make crds` and commit the result"
        );
    }
}

/// The keys kube-apiserver allows at the root of a schema when the status
/// subresource is enabled (`allowedFieldsAtRootSchema` in
/// apiextensions-apiserver's validation.go, as JSON keys).
const ROOT_KEYS: &[&str] = &[
    "description",
    "type",
    "format",
    "title",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "uniqueItems",
    "multipleOf",
    "required",
    "items",
    "properties",
    "externalDocs",
    "example",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations",
];

/// The schema keywords kube-apiserver refuses anywhere.
const UNSUPPORTED: &[&str] = &[
    "$ref",
    "id",
    "additionalItems",
    "patternProperties",
    "definitions",
    "dependencies",
    "$schema",
];

const TYPES: &[&str] = &["string", "number", "integer", "boolean", "array", "object"];

/// Where a schema node sits, as kube-apiserver distinguishes them.
#[derive(Clone, Copy, PartialEq)]
enum Level {
    Root,
    Field,
    Item,
}

fn strs(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Checks the schema of one CRD version against the rules kube-apiserver
/// (apiextensions-apiserver v0.37 `ValidateCustomResourceDefinitionOpenAPISchema`
/// and the structural-schema invariants) enforces when the CRD is created,
/// plus this project's rule that every field has a description.
fn check_root(schema: &Value, status_subresource: bool) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(root) = schema.as_object() else {
        return vec!["root: not an object".into()];
    };
    if root.get("type").and_then(Value::as_str) != Some("object") {
        problems.push("root: type must be object".into());
    }
    if root.contains_key("additionalProperties") {
        problems.push("root: additionalProperties must not be used at the root".into());
    }
    if status_subresource {
        for k in root.keys() {
            if !ROOT_KEYS.contains(&k.as_str()) {
                problems.push(format!(
                    "root: {k} is not allowed at the root when the status subresource is enabled"
                ));
            }
        }
    }
    let props = root.get("properties").and_then(Value::as_object);
    for k in ["apiVersion", "kind"] {
        if let Some(p) = props.and_then(|p| p.get(k)) {
            if p.get("type").and_then(Value::as_str) != Some("string") {
                problems.push(format!("root.{k}: type must be string"));
            }
        }
    }
    // The server owns metadata's schema: it accepts `type: object` and
    // nothing else (bar name/generateName restrictions, which we never use).
    if let Some(md) = props.and_then(|p| p.get("metadata")) {
        if md != &serde_json::json!({"type": "object"}) {
            problems.push(format!(
                "root.metadata: must not specify anything other than type: object (the server refuses it), got {md}"
            ));
        }
    }
    check(schema, "root", Level::Root, &mut problems);
    problems
}

/// Walks a schema node, collecting violations of kube-apiserver's rules.
fn check(node: &Value, path: &str, level: Level, problems: &mut Vec<String>) {
    let Some(obj) = node.as_object() else {
        problems.push(format!("{path}: not an object"));
        return;
    };
    for k in UNSUPPORTED {
        if obj.contains_key(*k) {
            problems.push(format!("{path}: {k} is not supported"));
        }
    }
    let bool_of = |k: &str| obj.get(k).and_then(Value::as_bool);
    let type_ = obj.get("type").and_then(Value::as_str);
    let int_or_string = bool_of("x-kubernetes-int-or-string") == Some(true);
    let preserve = bool_of("x-kubernetes-preserve-unknown-fields") == Some(true);
    let embedded = bool_of("x-kubernetes-embedded-resource") == Some(true);
    match type_ {
        None if !int_or_string && !preserve => problems.push(format!("{path}: no type")),
        Some(t) if !TYPES.contains(&t) => problems.push(format!("{path}: unsupported type {t}")),
        _ => {}
    }
    if bool_of("x-kubernetes-preserve-unknown-fields") == Some(false) {
        problems.push(format!(
            "{path}: x-kubernetes-preserve-unknown-fields must be true or undefined"
        ));
    }
    if int_or_string && (preserve || embedded) {
        problems.push(format!(
            "{path}: x-kubernetes-int-or-string excludes preserve-unknown-fields and embedded-resource"
        ));
    }
    if embedded && (type_ != Some("object") || obj.contains_key("additionalProperties")) {
        problems.push(format!(
            "{path}: x-kubernetes-embedded-resource needs type object and no additionalProperties"
        ));
    }
    // The project's rule: every field explains itself in `kubectl explain`.
    let root_metadata = path == "root.metadata";
    if level == Level::Field
        && !root_metadata
        && obj
            .get("description")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        problems.push(format!("{path}: no description"));
    }
    if obj.contains_key("properties") && obj.contains_key("additionalProperties") {
        problems.push(format!(
            "{path}: additionalProperties and properties are mutual exclusive"
        ));
    }
    if type_ == Some("array") && !obj.get("items").is_some_and(Value::is_object) {
        problems.push(format!(
            "{path}: an array needs items (one schema, not a list)"
        ));
    }
    if let Some(mt) = obj.get("x-kubernetes-map-type") {
        if type_ != Some("object") {
            problems.push(format!("{path}: x-kubernetes-map-type needs type object"));
        }
        if !matches!(mt.as_str(), Some("atomic" | "granular")) {
            problems.push(format!("{path}: x-kubernetes-map-type {mt}"));
        }
    }
    let list_type = obj.get("x-kubernetes-list-type").and_then(Value::as_str);
    let keys = strs(obj.get("x-kubernetes-list-map-keys"));
    if obj.contains_key("x-kubernetes-list-type") {
        if type_ != Some("array") {
            problems.push(format!("{path}: x-kubernetes-list-type needs type array"));
        }
        if !matches!(list_type, Some("atomic" | "set" | "map")) {
            problems.push(format!("{path}: x-kubernetes-list-type {list_type:?}"));
        }
    }
    if !keys.is_empty() && list_type != Some("map") {
        problems.push(format!(
            "{path}: x-kubernetes-list-map-keys needs x-kubernetes-list-type map"
        ));
    }
    if let (Some("map" | "set"), Some(items)) = (list_type, obj.get("items")) {
        if items.get("nullable") == Some(&Value::Bool(true)) {
            problems.push(format!(
                "{path}[]: items of a map or set list cannot be nullable"
            ));
        }
    }
    if let (Some("map"), Some(items)) = (list_type, obj.get("items")) {
        if keys.is_empty() {
            problems.push(format!("{path}: list-type map without keys"));
        }
        if items.get("type").and_then(Value::as_str) != Some("object") {
            problems.push(format!("{path}[]: items of a map list must be objects"));
        }
        let required = strs(items.get("required"));
        let mut seen = Vec::new();
        for k in keys {
            if seen.contains(&k) {
                problems.push(format!("{path}: duplicate list-map key {k}"));
            }
            seen.push(k);
            let Some(p) = items.get("properties").and_then(|p| p.get(k)) else {
                problems.push(format!("{path}: list-map key {k} is not an item property"));
                continue;
            };
            if matches!(
                p.get("type").and_then(Value::as_str),
                Some("array" | "object")
            ) {
                problems.push(format!("{path}: list-map key {k} must be a scalar"));
            }
            if !required.contains(&k) && p.get("default").is_none() {
                problems.push(format!(
                    "{path}: list-map key {k} must be required or have a default"
                ));
            }
            if p.get("nullable") == Some(&Value::Bool(true)) {
                problems.push(format!("{path}: list-map key {k} cannot be nullable"));
            }
        }
    }
    for junctor in ["anyOf", "oneOf", "allOf", "not"] {
        let nested: Vec<&Value> = match obj.get(junctor) {
            Some(Value::Array(a)) => a.iter().collect(),
            Some(v) => vec![v],
            None => continue,
        };
        for (i, n) in nested.into_iter().enumerate() {
            check_nested(
                n,
                &format!("{path}.{junctor}[{i}]"),
                junctor == "allOf",
                problems,
            );
        }
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            check(v, &format!("{path}.{k}"), Level::Field, problems);
        }
    }
    if let Some(ap) = obj.get("additionalProperties") {
        if ap.is_object() {
            check(ap, &format!("{path}[*]"), Level::Item, problems);
        }
    }
    if let Some(items) = obj.get("items").filter(|i| i.is_object()) {
        check(items, &format!("{path}[]"), Level::Item, problems);
    }
}

/// Inside anyOf/oneOf/allOf/not only value validations are allowed: no
/// types, descriptions, defaults, nullable or x-kubernetes-* extensions
/// (CEL rules only under allOf), and no `metadata` property.
fn check_nested(node: &Value, path: &str, cel_allowed: bool, problems: &mut Vec<String>) {
    let Some(obj) = node.as_object() else {
        return;
    };
    for k in obj.keys() {
        let forbidden = matches!(
            k.as_str(),
            "type" | "additionalProperties" | "default" | "title" | "description" | "nullable"
        ) || (k.starts_with("x-kubernetes-")
            && !(cel_allowed && k == "x-kubernetes-validations"));
        if forbidden {
            problems.push(format!("{path}: {k} must not be used inside a junctor"));
        }
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        if props.contains_key("metadata") {
            problems.push(format!(
                "{path}: metadata must not be specified in a nested context"
            ));
        }
        for (k, v) in props {
            check_nested(v, &format!("{path}.{k}"), cel_allowed, problems);
        }
    }
    if let Some(items) = obj.get("items") {
        check_nested(items, &format!("{path}[]"), cel_allowed, problems);
    }
}

fn version_schemas(def: &impl serde::Serialize) -> Vec<(Value, bool)> {
    let v = serde_json::to_value(def).unwrap();
    v["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ver| {
            (
                ver["schema"]["openAPIV3Schema"].clone(),
                ver["subresources"]["status"].is_object(),
            )
        })
        .collect()
}

#[test]
fn schemas_pass_the_api_servers_rules_and_are_documented() {
    for (file, def) in crd::all() {
        for (schema, status) in version_schemas(&def) {
            let problems = check_root(&schema, status);
            assert!(problems.is_empty(), "{file}: {problems:#?}");
        }
    }
}

/// The committed files, not just the generator, are what `kubectl apply`
/// sends: check them too.
#[test]
fn committed_crds_pass_the_api_servers_rules() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    for (file, _) in crd::all() {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        let def: Value = serde_norway::from_str(&text).unwrap();
        for (schema, status) in version_schemas(&def) {
            let problems = check_root(&schema, status);
            assert!(problems.is_empty(), "{file}: {problems:#?}");
        }
    }
}

/// The top-level metadata schema is exactly `type: object` in every CRD
/// (the real server refused the `description` the generator once put there).
#[test]
fn top_level_metadata_is_only_type_object() {
    for (file, def) in crd::all() {
        for (schema, _) in version_schemas(&def) {
            if let Some(md) = schema["properties"].get("metadata") {
                assert_eq!(md, &serde_json::json!({"type": "object"}), "{file}");
            }
        }
    }
}

/// The checker itself catches what the real server refused, so a passing
/// run means something.
#[test]
fn the_checker_refuses_what_the_server_refuses() {
    let (ph, _) = version_schemas(&crd::provider_health_crd()).remove(0);
    type Tamper = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Tamper, &str)> = vec![
        (
            "description on metadata",
            Box::new(|s| s["properties"]["metadata"]["description"] = "meta".into()),
            "root.metadata",
        ),
        (
            "metadata properties",
            Box::new(|s| {
                s["properties"]["metadata"]["properties"] =
                    serde_json::json!({"labels": {"type": "object"}})
            }),
            "root.metadata",
        ),
        (
            "nullable at the root",
            Box::new(|s| s["nullable"] = true.into()),
            "root: nullable is not allowed at the root",
        ),
        (
            "list-type on an object",
            Box::new(|s| s["properties"]["status"]["x-kubernetes-list-type"] = "map".into()),
            "root.status: x-kubernetes-list-type needs type array",
        ),
        (
            "nullable list-map key",
            Box::new(|s| {
                s["properties"]["status"]["properties"]["targets"]["items"]["properties"]["name"]
                    ["nullable"] = true.into()
            }),
            "list-map key name cannot be nullable",
        ),
        (
            "kind not a string",
            Box::new(|s| s["properties"]["kind"]["type"] = "object".into()),
            "root.kind: type must be string",
        ),
    ];
    for (name, tamper, want) in cases {
        let mut s = ph.clone();
        tamper(&mut s);
        let problems = check_root(&s, true);
        assert!(
            problems.iter().any(|p| p.contains(want)),
            "{name}: {problems:#?} lacks {want}"
        );
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
        &[
            "Mode",
            "Provider",
            "Phase",
            "IP",
            "Healthy",
            "Reason",
            "Age",
            "Zone",
            "Provider ID",
            "Latency",
            "Ready Reason",
        ],
    );
    // The last four are `-o wide` only.
    let priorities: Vec<i64> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["priority"].as_i64().unwrap_or(0))
        .collect();
    assert_eq!(priorities, [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]);
    assert_eq!(px["spec"]["names"]["categories"], json!(["egress-proxies"]));
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
    assert_eq!(status["observedGeneration"]["type"], "integer");

    let ph = serde_json::to_value(crd::provider_health_crd()).unwrap();
    assert_eq!(ph["metadata"]["name"], "providerhealths.crawl.example.com");
    let v = identity(
        &ph,
        "Cluster",
        "ph",
        &["Type", "Ready", "Targets", "Last Check", "Age"],
    );
    assert_eq!(ph["spec"]["names"]["categories"], json!(["egress-proxies"]));
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

/// Where `node` (under `path`) lets a tenant write something of unbounded
/// size: a string with neither `maxLength` nor `enum` nor the date-time
/// format, a map without `maxProperties`, or
/// whose keys no CEL rule bounds, a list without `maxItems`.
fn unbounded(node: &Value, path: &str, found: &mut Vec<String>) {
    let has = |k: &str| node.get(k).is_some();
    match node["type"].as_str() {
        Some("string")
            if !has("maxLength") && !has("enum") && node["format"] != json!("date-time") =>
        {
            found.push(format!("{path}: a string without maxLength"))
        }
        Some("array") => {
            if !has("maxItems") {
                found.push(format!("{path}: a list without maxItems"));
            }
            unbounded(&node["items"], &format!("{path}[]"), found);
        }
        Some("object") => {
            if let Some(values) = node.get("additionalProperties") {
                if !has("maxProperties") {
                    found.push(format!("{path}: a map without maxProperties"));
                }
                let keys_bounded = node["x-kubernetes-validations"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|r| r["rule"].as_str().is_some_and(|s| s.contains("size(k) <=")));
                if !keys_bounded {
                    found.push(format!("{path}: a map whose keys no rule bounds"));
                }
                unbounded(values, &format!("{path}.*"), found);
            }
            for (name, child) in node["properties"].as_object().into_iter().flatten() {
                unbounded(child, &format!("{path}.{name}"), found);
            }
        }
        _ => {}
    }
}

/// Every free-form field a tenant writes into a Proxy or a ProxyPool (the
/// spec; status is the operator's) has a size bound the API server
/// enforces, so a new unbounded field fails here before it ships; and the
/// bounds docs/api-reference.md promises are the ones in the schema.
#[test]
fn every_field_a_tenant_writes_is_bounded() {
    use egress_proxies_operator::api::limits;
    for (file, def) in crd::all() {
        for (schema, _) in version_schemas(&def) {
            let Some(spec) = schema["properties"].get("spec") else {
                continue;
            };
            let mut found = Vec::new();
            unbounded(spec, "spec", &mut found);
            assert!(found.is_empty(), "{file}: {found:#?}");
        }
    }
    let px = serde_json::to_value(crd::proxy_crd()).unwrap();
    let spec =
        &px["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert_eq!(
        spec["cloudInit"]["properties"]["inline"]["maxLength"],
        json!(65536)
    );
    assert_eq!(limits::CLOUD_INIT_INLINE_MAX, 65536);
    assert_eq!(spec["attributes"]["maxProperties"], json!(32));
    assert_eq!(
        spec["attributes"]["additionalProperties"]["maxLength"],
        json!(256)
    );
    assert_eq!(
        spec["attributes"]["x-kubernetes-validations"][0]["rule"],
        json!("self.all(k, size(k) <= 256)")
    );
    for key in ["region", "zone", "machineType", "image"] {
        assert_eq!(
            spec["placement"]["properties"][key]["maxLength"],
            json!(253),
            "placement.{key}"
        );
    }
    // A pool's template is a Proxy spec: the same bounds, one level down.
    let pool = serde_json::to_value(crd::proxy_pool_crd()).unwrap();
    let template = &pool["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["properties"]["template"]["properties"];
    assert_eq!(
        template["spec"]["properties"]["attributes"],
        spec["attributes"]
    );
    assert_eq!(
        template["spec"]["properties"]["cloudInit"],
        spec["cloudInit"]
    );
}

/// The walk above finds each kind of unbounded field, so its passing
/// means something.
#[test]
fn the_bound_checker_finds_unbounded_fields() {
    let spec = json!({"type": "object", "properties": {
        "s": {"type": "string"},
        "ok": {"type": "string", "maxLength": 3},
        "e": {"type": "string", "enum": ["A"]},
        "t": {"type": "string", "format": "date-time"},
        "l": {"type": "array", "items": {"type": "string", "maxLength": 1}},
        "m": {"type": "object", "additionalProperties": {"type": "string"}},
    }});
    let mut found = Vec::new();
    unbounded(&spec, "spec", &mut found);
    assert_eq!(
        found,
        [
            "spec.l: a list without maxItems",
            "spec.m: a map without maxProperties",
            "spec.m: a map whose keys no rule bounds",
            "spec.m.*: a string without maxLength",
            "spec.s: a string without maxLength",
        ]
    );
}
