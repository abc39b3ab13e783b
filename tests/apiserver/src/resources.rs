//! The served resource types: built-ins plus the CRDs loaded from YAML.

use serde_json::{json, Value};
use std::path::Path;

/// One additionalPrinterColumn of a CRD version.
#[derive(Debug, Clone)]
pub struct PrinterColumn {
    pub name: String,
    pub json_path: String,
    pub type_: String,
    pub description: String,
    pub priority: i64,
    pub format: String,
}

/// A served resource (one group/version/plural).
#[derive(Debug, Clone)]
pub struct ResourceDef {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub short_names: Vec<String>,
    pub namespaced: bool,
    pub status_subresource: bool,
    /// openAPIV3Schema of a CRD version; None for built-ins.
    pub schema: Option<Value>,
    pub columns: Vec<PrinterColumn>,
}

impl ResourceDef {
    fn builtin(group: &str, kind: &str, plural: &str, namespaced: bool, status: bool) -> Self {
        ResourceDef {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            short_names: vec![],
            namespaced,
            status_subresource: status,
            schema: None,
            columns: vec![],
        }
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Store key: `group/plural`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.group, self.plural)
    }

    /// Path prefix: `/api/v1` or `/apis/group/version`.
    pub fn prefix(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }

    /// The APIResource entries (main + status) for discovery.
    pub fn discovery_entries(&self) -> Vec<Value> {
        let mut main = json!({
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        });
        if !self.short_names.is_empty() {
            main["shortNames"] = json!(self.short_names);
        }
        if self.schema.is_some() {
            main["categories"] = json!(["all"]);
        }
        let mut out = vec![main];
        if self.status_subresource {
            out.push(json!({
                "name": format!("{}/status", self.plural),
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        out
    }
}

/// The built-in kinds.
pub fn builtins() -> Vec<ResourceDef> {
    let mut ns = ResourceDef::builtin("", "Namespace", "namespaces", false, true);
    ns.short_names = vec!["ns".into()];
    let mut pod = ResourceDef::builtin("", "Pod", "pods", true, true);
    pod.short_names = vec!["po".into()];
    let mut cm = ResourceDef::builtin("", "ConfigMap", "configmaps", true, false);
    cm.short_names = vec!["cm".into()];
    let mut ev = ResourceDef::builtin("", "Event", "events", true, false);
    ev.short_names = vec!["ev".into()];
    let ev2 = ResourceDef::builtin("events.k8s.io", "Event", "events", true, false);
    vec![
        ns,
        pod,
        ResourceDef::builtin("", "Secret", "secrets", true, false),
        cm,
        ev,
        ev2,
        ResourceDef::builtin("coordination.k8s.io", "Lease", "leases", true, false),
    ]
}

/// Load every CRD in `dir` (`*.yaml` / `*.yml` / `*.json`, multi-document YAML allowed).
pub fn load_crds(dir: &Path) -> Result<Vec<ResourceDef>, String> {
    let mut out = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("reading {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            )
        })
        .collect();
    entries.sort();
    for path in entries {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        for doc in serde_norway::Deserializer::from_str(&text) {
            let v: Value = serde::Deserialize::deserialize(doc)
                .map_err(|e| format!("parsing {}: {e}", path.display()))?;
            if v.get("kind").and_then(Value::as_str) == Some("CustomResourceDefinition") {
                out.extend(crd_defs(&v)?);
            }
        }
    }
    Ok(out)
}

fn s(v: &Value, ptr: &str) -> String {
    v.pointer(ptr)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// The served versions of one CRD.
pub fn crd_defs(crd: &Value) -> Result<Vec<ResourceDef>, String> {
    let group = s(crd, "/spec/group");
    let kind = s(crd, "/spec/names/kind");
    let plural = s(crd, "/spec/names/plural");
    if group.is_empty() || kind.is_empty() || plural.is_empty() {
        return Err(format!(
            "CRD {} lacks group/kind/plural",
            s(crd, "/metadata/name")
        ));
    }
    let singular = match s(crd, "/spec/names/singular") {
        x if x.is_empty() => kind.to_lowercase(),
        x => x,
    };
    let short_names: Vec<String> = crd
        .pointer("/spec/names/shortNames")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let namespaced = s(crd, "/spec/scope") != "Cluster";
    let mut out = Vec::new();
    for ver in crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if ver.get("served") == Some(&Value::Bool(false)) {
            continue;
        }
        // kube-apiserver owns the top-level metadata schema and refuses a
        // CRD that says anything there beyond `type: object`.
        if let Some(md) = ver.pointer("/schema/openAPIV3Schema/properties/metadata") {
            let extra: Vec<&String> = md
                .as_object()
                .map(|o| o.keys().filter(|k| *k != "type").collect())
                .unwrap_or_default();
            if md.get("type").and_then(Value::as_str) != Some("object") || !extra.is_empty() {
                return Err(format!(
                    "CRD {}: spec.validation.openAPIV3Schema.properties[metadata]: Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified (found {extra:?})",
                    s(crd, "/metadata/name")
                ));
            }
        }
        let columns = ver
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .map(|cols| {
                cols.iter()
                    .map(|c| PrinterColumn {
                        name: s(c, "/name"),
                        json_path: s(c, "/jsonPath"),
                        type_: s(c, "/type"),
                        description: s(c, "/description"),
                        priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                        format: s(c, "/format"),
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(ResourceDef {
            group: group.clone(),
            version: s(ver, "/name"),
            kind: kind.clone(),
            plural: plural.clone(),
            singular: singular.clone(),
            short_names: short_names.clone(),
            namespaced,
            status_subresource: ver.pointer("/subresources/status").is_some(),
            schema: ver.pointer("/schema/openAPIV3Schema").cloned(),
            columns,
        });
    }
    Ok(out)
}
