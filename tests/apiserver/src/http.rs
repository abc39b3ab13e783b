//! HTTP routing: discovery, CRUD, patch, list/watch, tables.

use crate::errors::ApiError;
use crate::resources::ResourceDef;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{Filter, Store};
use crate::table;
use crate::watch::{self, WatchParams};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Shared state of the HTTP handlers.
pub struct App {
    pub store: Arc<Store>,
    pub addr: SocketAddr,
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    pub authz: Option<Arc<crate::authz::Authz>>,
}

pub fn router(app: Arc<App>) -> axum::Router {
    axum::Router::new().fallback(handle).with_state(app)
}

fn respond(code: u16, body: &Value) -> Response {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

fn error(e: ApiError) -> Response {
    respond(e.code, &e.to_status())
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(v) => {
                    out.push(v);
                    i += 2;
                }
                Err(_) => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_query(q: Option<&str>) -> HashMap<String, String> {
    q.unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
        .collect()
}

fn truthy(q: &HashMap<String, String>, k: &str) -> bool {
    matches!(q.get(k).map(String::as_str), Some("true" | "1"))
}

fn header(req: &Request, n: &str) -> String {
    req.headers()
        .get(n)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

async fn handle(State(app): State<Arc<App>>, req: Request) -> Response {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let query = parse_query(req.uri().query());
    let accept = header(&req, "accept");
    let content_type = header(&req, "content-type");
    let bearer = header(&req, "authorization");
    if content_type.contains("protobuf") || content_type.contains("cbor") {
        return error(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the test API server only accepts JSON bodies, not {content_type}"),
        ));
    }
    let body = match axum::body::to_bytes(req.into_body(), 32 << 20).await {
        Ok(b) => b,
        Err(e) => return error(ApiError::bad_request(format!("reading body: {e}"))),
    };
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if let Some(z) = app
        .authz
        .as_ref()
        .filter(|z| bearer == format!("Bearer {}", z.token))
    {
        let attrs = match segs.as_slice() {
            ["api", "v1", rest @ ..] if !rest.is_empty() => Some(crate::authz::attributes(
                &method,
                "",
                rest,
                truthy(&query, "watch"),
            )),
            ["apis", g, _, rest @ ..] if !rest.is_empty() => Some(crate::authz::attributes(
                &method,
                g,
                rest,
                truthy(&query, "watch"),
            )),
            _ => None,
        };
        if let Some(Err(msg)) = attrs.map(|a| z.check(a)) {
            return error(ApiError::new(403, "Forbidden", msg).with_details(json!({})));
        }
    }
    let ctx = Ctx {
        app: &app,
        method: &method,
        query: &query,
        accept: &accept,
        content_type: &content_type,
        body: &body,
    };
    match segs.as_slice() {
        [] => respond(
            200,
            &json!({"paths": ["/api", "/api/v1", "/apis", "/version"]}),
        ),
        ["version"] => respond(
            200,
            &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-test-apiserver",
                "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
                "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc",
                "platform": "linux/amd64"}),
        ),
        ["healthz" | "readyz" | "livez"] => Response::new(Body::from("ok")),
        ["openapi", "v3"] => respond(200, &openapi_root(&app.store)),
        ["openapi", "v3", "api", v] => openapi_gv(&app.store, "", v),
        ["openapi", "v3", "apis", g, v] => openapi_gv(&app.store, g, v),
        ["api"] => respond(
            200,
            &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": app.addr.to_string()}]}),
        ),
        ["apis"] => respond(200, &group_list(&app.store)),
        ["api", "v1"] => resource_list(&app.store, "", "v1"),
        ["apis", g] => match group(&app.store, g) {
            Some(v) => respond(200, &v),
            None => error(not_found_path()),
        },
        ["apis", g, v] => resource_list(&app.store, g, v),
        ["api", "v1", rest @ ..] => ctx.resource("", "v1", rest),
        ["apis", g, v, rest @ ..] => ctx.resource(g, v, rest),
        _ => error(not_found_path()),
    }
}

/// The /openapi/v3 index: one entry per group/version.
fn openapi_root(store: &Store) -> Value {
    let mut paths = serde_json::Map::new();
    for d in &store.defs {
        let gv = d.prefix().trim_start_matches('/').to_string();
        paths.insert(
            gv.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash=test{}", store.defs.len())}),
        );
    }
    json!({"paths": paths})
}

/// A minimal per-group-version OpenAPI v3 document: only the PATCH operations,
/// so kubectl sees that the server does field validation (`fieldValidation`)
/// and leaves validation to the server. No component schemas are published,
/// so kubectl uses JSON merge patches for custom resources.
/// The resources served under group `g`, version `v`; `None` when none.
fn defs_of<'a>(store: &'a Store, g: &str, v: &str) -> Option<Vec<&'a ResourceDef>> {
    let defs: Vec<&ResourceDef> = store
        .defs
        .iter()
        .filter(|d| d.group == g && d.version == v)
        .collect();
    (!defs.is_empty()).then_some(defs)
}

fn openapi_gv(store: &Store, g: &str, v: &str) -> Response {
    let Some(defs) = defs_of(store, g, v) else {
        return error(not_found_path());
    };
    let mut paths = serde_json::Map::new();
    for d in defs {
        let path = if d.namespaced {
            format!(
                "{}/namespaces/{{namespace}}/{}/{{name}}",
                d.prefix(),
                d.plural
            )
        } else {
            format!("{}/{}/{{name}}", d.prefix(), d.plural)
        };
        let op = json!({"patch": {
            "x-kubernetes-group-version-kind": {"group": d.group, "version": d.version, "kind": d.kind},
            "parameters": [
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": true}}],
            "responses": {"200": {"description": "OK"}}}});
        paths.insert(path, op);
    }
    respond(
        200,
        &json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.33.0"},
            "paths": paths, "components": {"schemas": {}}}),
    )
}

fn not_found_path() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
    .with_details(json!({}))
}

fn group_entry(store: &Store, g: &str) -> Value {
    let mut versions: Vec<String> = store
        .defs
        .iter()
        .filter(|d| d.group == g)
        .map(|d| d.version.clone())
        .collect();
    versions.dedup();
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    json!({"name": g, "versions": vs, "preferredVersion": vs[0]})
}

fn group_list(store: &Store) -> Value {
    let mut groups: Vec<&str> = Vec::new();
    for d in &store.defs {
        if !d.group.is_empty() && !groups.contains(&d.group.as_str()) {
            groups.push(&d.group);
        }
    }
    let groups: Vec<Value> = groups.iter().map(|g| group_entry(store, g)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn group(store: &Store, g: &str) -> Option<Value> {
    if !store.defs.iter().any(|d| d.group == g) {
        return None;
    }
    let mut v = group_entry(store, g);
    v["kind"] = json!("APIGroup");
    v["apiVersion"] = json!("v1");
    Some(v)
}

fn resource_list(store: &Store, g: &str, v: &str) -> Response {
    let Some(defs) = defs_of(store, g, v) else {
        return error(not_found_path());
    };
    let gv = if g.is_empty() {
        v.to_string()
    } else {
        format!("{g}/{v}")
    };
    let resources: Vec<Value> = defs.iter().flat_map(|d| d.discovery_entries()).collect();
    respond(
        200,
        &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

struct Ctx<'a> {
    app: &'a Arc<App>,
    method: &'a str,
    query: &'a HashMap<String, String>,
    accept: &'a str,
    content_type: &'a str,
    body: &'a [u8],
}

fn parse_body(body: &[u8], yaml: bool) -> Result<Value, ApiError> {
    if yaml {
        let text = std::str::from_utf8(body)
            .map_err(|e| ApiError::bad_request(format!("body is not UTF-8: {e}")))?;
        serde_norway::from_str(text)
            .map_err(|e| ApiError::bad_request(format!("invalid YAML: {e}")))
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
    }
}

/// A custom resource's create or update body is decoded as unstructured
/// data, which needs its `kind` (and, when given, the right `apiVersion`),
/// as kube-apiserver's decoder does: `Object 'Kind' is missing`. Built-in
/// types decode into their Go type, which supplies both.
fn check_type(def: &ResourceDef, obj: Value) -> Result<Value, ApiError> {
    if def.schema.is_none() || !obj.is_object() {
        return Ok(obj);
    }
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    if kind.is_empty() {
        let mut summary = obj.to_string();
        if summary.len() > 30 {
            let mut end = 30;
            while !summary.is_char_boundary(end) {
                end -= 1;
            }
            summary.truncate(end);
            summary.push_str(" ...");
        }
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {}): Object 'Kind' is missing in '{obj}' ({summary})",
            def.kind
        )));
    }
    let api_version = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !api_version.is_empty() && api_version != def.api_version() {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            def.api_version()
        )));
    }
    if kind != def.kind {
        return Err(ApiError::bad_request(format!(
            "{kind} in version {:?} cannot be handled as a {}: kind mismatch",
            def.version, def.kind
        )));
    }
    Ok(obj)
}

/// Strategic-merge directives (`$patch`, `$setElementOrder/...`, `$retainKeys`) are dropped.
fn strip_directives(v: &mut Value) {
    match v {
        Value::Object(o) => {
            o.retain(|k, _| !k.starts_with('$'));
            o.values_mut().for_each(strip_directives);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_directives),
        _ => {}
    }
}

impl Ctx<'_> {
    fn resource(&self, g: &str, v: &str, rest: &[&str]) -> Response {
        let ns_path = rest.len() >= 3
            && rest[0] == "namespaces"
            && !(g.is_empty() && rest.len() == 3 && matches!(rest[2], "status" | "finalize"));
        let (ns, rest) = if ns_path {
            (Some(rest[1]), &rest[2..])
        } else {
            (None, rest)
        };
        let Some(def) = self.app.store.def_gvr(g, v, rest[0]) else {
            return error(not_found_path());
        };
        if (ns.is_some() && !def.namespaced) || rest.len() > 3 {
            return error(not_found_path());
        }
        let name = rest.get(1).copied();
        let sub = rest.get(2).copied();
        if matches!(sub, Some(s) if s != "status" || !def.status_subresource) {
            return error(not_found_path());
        }
        if def.namespaced && name.is_some() && ns.is_none() {
            return error(not_found_path());
        }
        let result = match (self.method, name) {
            ("GET", None) => {
                if truthy(self.query, "watch") {
                    return self.watch(def, ns);
                }
                self.list(def, ns)
            }
            ("GET", Some(n)) => self
                .app
                .store
                .get(def, ns, n)
                .map(|o| (200, self.maybe_table(def, o))),
            ("POST", None) => parse_body(self.body, false)
                .and_then(|o| check_type(def, o))
                .and_then(|o| self.admit(def, ns, o))
                .and_then(|o| self.app.store.create(def, ns, o))
                .map(|o| (201, o)),
            ("PUT", Some(n)) => parse_body(self.body, false)
                .and_then(|o| check_type(def, o))
                .and_then(|body| {
                    self.app
                        .store
                        .update(def, ns, n, sub.is_some(), |_| Ok(body))
                        .map(|o| (200, o))
                }),
            ("PATCH", Some(n)) => self.patch(def, ns, n, sub.is_some()),
            ("DELETE", Some(n)) => self.delete(def, ns, n),
            ("DELETE", None) => self.delete_collection(def, ns),
            _ => Err(ApiError::method_not_allowed()),
        };
        match result {
            Ok((code, v)) => respond(code, &v),
            Err(e) => error(e),
        }
    }

    /// Pod Security admission (`restricted` only) for new Pods.
    fn admit(&self, def: &ResourceDef, ns: Option<&str>, obj: Value) -> Result<Value, ApiError> {
        if !def.group.is_empty() || def.plural != "pods" {
            return Ok(obj);
        }
        let ns = ns.unwrap_or("default");
        let level = self
            .app
            .store
            .def("", "namespaces")
            .and_then(|nsdef| self.app.store.get(nsdef, None, ns).ok())
            .and_then(|n| {
                n["metadata"]["labels"][crate::pss::ENFORCE_LABEL]
                    .as_str()
                    .map(String::from)
            });
        if level.as_deref() != Some("restricted") {
            return Ok(obj);
        }
        let violations = crate::pss::restricted_violations(&obj["spec"]);
        if violations.is_empty() {
            return Ok(obj);
        }
        let name = obj["metadata"]["name"]
            .as_str()
            .or(obj["metadata"]["generateName"].as_str())
            .unwrap_or_default();
        Err(ApiError::new(
            403,
            "Forbidden",
            format!(
                "pods \"{name}\" is forbidden: violates PodSecurity \"restricted:latest\": {}",
                violations.join(", ")
            ),
        ))
    }

    fn filter(&self, ns: Option<&str>) -> Result<Filter, ApiError> {
        Ok(Filter {
            namespace: ns.map(String::from),
            labels: LabelSelector::parse(self.query.get("labelSelector").map_or("", |s| s))
                .map_err(ApiError::bad_request)?,
            fields: FieldSelector::parse(self.query.get("fieldSelector").map_or("", |s| s))
                .map_err(ApiError::bad_request)?,
        })
    }

    fn wants_table(&self) -> Option<String> {
        self.accept.contains("as=Table").then(|| {
            self.query
                .get("includeObject")
                .cloned()
                .unwrap_or_else(|| "Metadata".into())
        })
    }

    fn maybe_table(&self, def: &ResourceDef, obj: Value) -> Value {
        match self.wants_table() {
            Some(include) => table::table(def, &[obj], None, &include, true),
            None => obj,
        }
    }

    fn list(&self, def: &ResourceDef, ns: Option<&str>) -> Result<(u16, Value), ApiError> {
        let filter = self.filter(ns)?;
        let (items, rv) = self.app.store.list(def, &filter);
        if let Some(include) = self.wants_table() {
            return Ok((200, table::table(def, &items, Some(rv), &include, true)));
        }
        Ok((
            200,
            json!({"kind": format!("{}List", def.kind), "apiVersion": def.api_version(),
                "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
        ))
    }

    fn watch(&self, def: &ResourceDef, ns: Option<&str>) -> Response {
        let filter = match self.filter(ns) {
            Ok(f) => f,
            Err(e) => return error(e),
        };
        let params = WatchParams {
            resource_version: self.query.get("resourceVersion").cloned(),
            timeout: self
                .query
                .get("timeoutSeconds")
                .and_then(|t| t.parse::<u64>().ok())
                .map(Duration::from_secs),
            bookmarks: truthy(self.query, "allowWatchBookmarks"),
            send_initial_events: truthy(self.query, "sendInitialEvents"),
            table: self.wants_table(),
        };
        watch::start(
            self.app.store.clone(),
            def.clone(),
            filter,
            params,
            self.app.shutdown.clone(),
        )
    }

    fn patch(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        name: &str,
        status: bool,
    ) -> Result<(u16, Value), ApiError> {
        let ct = self
            .content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim();
        let store = &self.app.store;
        match ct {
            "application/json-patch+json" => {
                let patch: json_patch::Patch = serde_json::from_slice(self.body)
                    .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
                store
                    .update(def, ns, name, status, |cur| {
                        let mut doc = cur.clone();
                        json_patch::patch(&mut doc, &patch).map_err(|e| {
                            ApiError::new(422, "Invalid", format!("the JSON patch could not be applied: {e}"))
                        })?;
                        Ok(doc)
                    })
                    .map(|o| (200, o))
            }
            "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                let mut patch = parse_body(self.body, false)?;
                strip_directives(&mut patch);
                store
                    .update(def, ns, name, status, |cur| {
                        let mut doc = cur.clone();
                        json_patch::merge(&mut doc, &patch);
                        Ok(doc)
                    })
                    .map(|o| (200, o))
            }
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                let mut applied = parse_body(self.body, true)?;
                if let Some(m) = applied.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("managedFields");
                }
                let r = store.update(def, ns, name, status, |cur| {
                    let mut doc = cur.clone();
                    json_patch::merge(&mut doc, &applied);
                    Ok(doc)
                });
                match r {
                    Err(e) if e.code == 404 && !status => {
                        let mut obj = applied.clone();
                        if obj.pointer("/metadata/name").is_none() {
                            obj["metadata"]["name"] = json!(name);
                        }
                        store.create(def, ns, obj).map(|o| (201, o))
                    }
                    other => other.map(|o| (200, o)),
                }
            }
            other => Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other:?})"),
            )),
        }
    }

    fn delete(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        name: &str,
    ) -> Result<(u16, Value), ApiError> {
        let opts: Value = if self.body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(self.body).unwrap_or(Value::Null)
        };
        let pre = |k: &str| {
            opts.pointer(&format!("/preconditions/{k}"))
                .and_then(Value::as_str)
                .map(String::from)
        };
        self.app
            .store
            .delete(def, ns, name, (pre("uid"), pre("resourceVersion")))
            .map(|o| (200, o))
    }

    fn delete_collection(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
    ) -> Result<(u16, Value), ApiError> {
        let filter = self.filter(ns)?;
        let (items, _) = self.app.store.list(def, &filter);
        let mut deleted = Vec::new();
        for it in items {
            let n = it
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let ins = it.pointer("/metadata/namespace").and_then(Value::as_str);
            if let Ok(o) = self.app.store.delete(def, ins, n, (None, None)) {
                deleted.push(o);
            }
        }
        Ok((
            200,
            json!({"kind": format!("{}List", def.kind), "apiVersion": def.api_version(),
                "metadata": {"resourceVersion": self.app.store.current_rv().to_string()}, "items": deleted}),
        ))
    }
}
