//! A local stand-in for the Compute Engine REST API (v1, JSON), enough for
//! the gcp provider: instances.insert/get/delete/aggregatedList and
//! zoneOperations.get/wait. It keeps instances in memory, turns them
//! RUNNING with a 127.0.0.N NAT IP after a number of gets, and takes
//! injected errors, delays, partial lists and failing insert operations.
//! Binds 127.0.0.1 only and stops by itself (with its runtime, or after
//! two minutes at most, or the lifetime given to [`StandIn::start_for`]).

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};

/// The zone the fixtures place instances in.
pub const ZONE: &str = "europe-west1-b";

/// A gcp provider config pointing the real client at the stand-in.
pub fn config(endpoint: &str) -> egress_proxies_operator::config::GcpConfig {
    egress_proxies_operator::config::GcpConfig {
        project: "my-project".into(),
        network: "default".into(),
        network_tag: "egress-proxy".into(),
        disk_size_gb: 0,
        endpoint: Some(endpoint.into()),
        anonymous: true,
        allowed_zones: Vec::new(),
        allowed_machine_types: Vec::new(),
        allowed_images: Vec::new(),
        allowed_ports: egress_proxies_operator::config::default_allowed_ports(),
        firewall: None,
        destinations: Default::default(),
    }
}

/// Provider options for tests: one attempt, short limits.
pub fn options(wire_log_full_payloads: bool) -> egress_proxies_operator::provider::gcp::GcpOptions {
    egress_proxies_operator::provider::gcp::GcpOptions {
        wire_log_full_payloads,
        check_timeout: Duration::from_secs(5),
        max_attempts: 1,
        retry_time_limit: Duration::from_secs(5),
    }
}

/// A create request that the stand-in can satisfy.
pub fn request(
    name: &str,
    uid: &str,
    cloud_init: &str,
) -> egress_proxies_operator::provider::CreateRequest {
    egress_proxies_operator::provider::CreateRequest {
        name: name.into(),
        uid: uid.into(),
        namespace: "ns".into(),
        proxy_name: "px".into(),
        placement: egress_proxies_operator::api::Placement {
            region: "europe-west1".into(),
            zone: ZONE.into(),
            machine_type: "e2-micro".into(),
            image: "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64".into(),
        },
        cloud_init: egress_proxies_operator::provider::UserData::new(cloud_init),
        port: 3128,
        installation_id: "inst-1".into(),
        credentials: None,
    }
}

/// An error the next call of a method answers with.
#[derive(Clone, Debug)]
pub struct Inject {
    pub status: u16,
    pub reason: String,
    pub message: String,
}

#[derive(Clone, Debug)]
struct Inst {
    body: Value,
    gets: u32,
    /// Gets left before a deleted instance disappears.
    deleting: Option<u32>,
    delete_op: Option<String>,
    /// When its delete was asked for.
    deleted_at: Option<std::time::Instant>,
}

/// Everything the stand-in knows; tests reach in through [`StandIn`].
#[derive(Default)]
pub struct Store {
    base: String,
    instances: BTreeMap<(String, String), Inst>,
    ops: HashMap<String, Value>,
    op_by_request_id: HashMap<String, String>,
    next_op: u64,
    next_ip: u8,
    /// Gets after which an instance turns RUNNING (default 2).
    pub running_after_gets: u32,
    /// Gets a deleted instance stays visible (STOPPING) before it is gone.
    pub delete_gets: u32,
    /// When set, a deleted instance stays visible (STOPPING, its delete
    /// operation RUNNING) for this long instead, whatever is asked: a
    /// delete that takes minutes, as real ones can.
    pub delete_takes: Option<Duration>,
    /// RUNNING instances get no NAT IP.
    pub no_ip: bool,
    /// Every RUNNING instance gets this NAT IP (one Squid then serves
    /// them all, old and new instances alike).
    pub fixed_ip: Option<String>,
    /// Status forced on an instance by name.
    pub status_override: HashMap<String, String>,
    /// One-shot errors per method (`insert`, `get`, `delete`, `list`, `op`).
    pub inject: HashMap<String, VecDeque<Inject>>,
    /// Delay before answering, per method.
    pub delay: HashMap<String, Duration>,
    /// The next insert is accepted, but its operation ends DONE with this
    /// error (code, message) and no instance appears.
    pub fail_next_insert_op: Option<(String, String)>,
    /// Zones the aggregated list reports as unreachable.
    pub unreachable_zones: Vec<String>,
    /// Return every instance regardless of the filter (tests the client's
    /// own managed-label check).
    pub ignore_filter: bool,
    /// Page size when the request sets no maxResults.
    pub page_size: usize,
    /// Aggregated-list pages always carry a next-page token (check test).
    pub endless_pages: bool,
    /// Every request: (method, path, query).
    pub requests: Vec<(String, String, String)>,
    /// Every insert that made an instance: when, and how many instances
    /// were PROVISIONING (not yet seen RUNNING by a get) right after it.
    pub inserts: Vec<(chrono::DateTime<chrono::Utc>, usize)>,
    /// While set, every call answers with this error (an outage: a rate
    /// limit, an unavailable API), until the test clears it.
    pub outage: Option<Inject>,
    /// Every call: when it arrived, its kind (`insert`, `get`, `delete`,
    /// `list`, `op`) and the instance it names (the body's name for an
    /// insert; empty for a list).
    pub calls: Vec<Call>,
    /// Firewall rules by name (`global/firewalls`).
    pub firewalls: BTreeMap<String, Value>,
}

/// One call the stand-in received.
#[derive(Clone, Debug)]
pub struct Call {
    pub at: std::time::Instant,
    pub kind: &'static str,
    pub instance: String,
}

pub struct StandIn {
    pub url: String,
    pub store: Arc<Mutex<Store>>,
}

impl StandIn {
    pub async fn start() -> StandIn {
        Self::start_for(Duration::from_secs(120)).await
    }

    /// A stand-in (stopping after `lifetime`) whose instances run after
    /// one get, go at once when deleted, and all have 127.0.0.1 as their
    /// address: a Squid the test starts there serves every one of them.
    pub async fn serving_on_loopback(lifetime: Duration) -> StandIn {
        let standin = Self::start_for(lifetime).await;
        standin.with(|st| {
            st.running_after_gets = 1;
            st.delete_gets = 0;
            st.fixed_ip = Some("127.0.0.1".into());
        });
        standin
    }

    /// A stand-in that stops by itself after `lifetime`.
    pub async fn start_for(lifetime: Duration) -> StandIn {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local addr");
        let url = format!("http://{addr}");
        let store = Arc::new(Mutex::new(Store {
            base: format!("{url}/compute/v1"),
            running_after_gets: 2,
            delete_gets: 1,
            page_size: 500,
            ..Default::default()
        }));
        let app = Router::new().fallback(handle).with_state(store.clone());
        tokio::spawn(async move {
            let serve = axum::serve(listener, app);
            let _ = tokio::time::timeout(lifetime, serve).await;
        });
        StandIn { url, store }
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut Store) -> R) -> R {
        f(&mut self.store.lock().unwrap())
    }

    pub fn inject(&self, method: &str, status: u16, reason: &str) {
        self.with(|s| {
            s.inject
                .entry(method.into())
                .or_default()
                .push_back(Inject {
                    status,
                    reason: reason.into(),
                    message: format!("injected {status} {reason}"),
                })
        });
    }

    /// The firewall rules it holds.
    pub fn firewalls(&self) -> Vec<Value> {
        self.with(|s| s.firewalls.values().cloned().collect())
    }

    /// How many calls of `kind` (e.g. `fw.insert`) it received.
    pub fn calls_of(&self, kind: &str) -> usize {
        self.with(|s| s.calls.iter().filter(|c| c.kind == kind).count())
    }

    pub fn count(&self, method: &str, path_contains: &str) -> usize {
        self.with(|s| {
            s.requests
                .iter()
                .filter(|(m, p, _)| m == method && p.contains(path_contains))
                .count()
        })
    }

    /// From now on every call answers `status` with `reason`, until
    /// [`StandIn::heal`].
    pub fn outage(&self, status: u16, reason: &str) {
        self.with(|s| {
            s.outage = Some(Inject {
                status,
                reason: reason.into(),
                message: format!("injected outage {status} {reason}"),
            })
        });
    }

    /// Ends the outage.
    pub fn heal(&self) {
        self.with(|s| s.outage = None);
    }

    /// Calls of `kind` for `instance` (every instance when empty).
    /// The `user-data` metadata item of the live instance `name`, if any.
    pub fn user_data(&self, name: &str) -> Option<String> {
        self.with(|s| {
            let (_, inst) = s
                .instances
                .iter()
                .find(|((_, n), i)| n == name && i.deleting.is_none())?;
            let items = inst.body["metadata"]["items"].as_array()?;
            items
                .iter()
                .find(|i| i["key"] == "user-data")
                .and_then(|i| i["value"].as_str())
                .map(String::from)
        })
    }

    pub fn calls(&self, kind: &str, instance: &str) -> Vec<Call> {
        self.with(|s| {
            s.calls
                .iter()
                .filter(|c| c.kind == kind && (instance.is_empty() || c.instance == instance))
                .cloned()
                .collect()
        })
    }

    /// The instance `name` stops behind the operator's back: every get
    /// reports it TERMINATED until it is deleted (its replacement, a new
    /// instance of the same name, boots as usual).
    pub fn stop(&self, name: &str) {
        self.with(|s| {
            for ((_, n), i) in s.instances.iter_mut() {
                if n == name {
                    i.body["status"] = json!("TERMINATED");
                }
            }
        });
    }

    /// A stopped instance `name` runs again (a zone back from an outage),
    /// on the NAT IP it had.
    pub fn start_again(&self, name: &str) {
        self.with(|s| {
            for ((_, n), i) in s.instances.iter_mut() {
                if n == name && i.body["status"] == json!("TERMINATED") {
                    i.body["status"] = json!("RUNNING");
                }
            }
        });
    }

    /// A providers file of one gcp provider `gcp-eu` (project
    /// `my-project`, network tag `egress-proxy`) on this stand-in, without
    /// credentials; every port allowed, as the stand-in's instances serve on
    /// the free ports of their host Squids.
    pub fn providers_yaml(&self) -> String {
        format!(
            "providers:\n  - name: gcp-eu\n    type: gcp\n    gcp:\n      project: my-project\n      networkTag: egress-proxy\n      endpoint: {}\n      anonymous: true\n      allowedPorts: [\"1-65535\"]\n",
            self.url
        )
    }

    pub fn requests(&self) -> Vec<(String, String, String)> {
        self.with(|s| s.requests.clone())
    }

    /// Every instance the store holds: its name, its labels, and whether
    /// it is being deleted.
    pub fn held(&self) -> Vec<(String, Value, bool)> {
        self.with(|s| {
            s.instances
                .iter()
                .map(|((_, name), i)| {
                    (name.clone(), i.body["labels"].clone(), i.deleting.is_some())
                })
                .collect()
        })
    }

    /// The instances held, as inserted (plus the stand-in's own fields).
    pub fn instance_bodies(&self) -> Vec<Value> {
        self.with(|s| s.instances.values().map(|i| i.body.clone()).collect())
    }

    pub fn instance_count(&self) -> usize {
        self.with(|s| s.instances.len())
    }

    /// Puts an instance straight into the store (e.g. an unmarked one).
    pub fn put(&self, zone: &str, name: &str, labels: Value, status: &str) {
        self.with(|s| {
            let body = json!({
                "name": name,
                "labels": labels,
                "status": status,
                "zone": format!("{}/projects/my-project/zones/{zone}", s.base),
                "creationTimestamp": chrono::Utc::now().to_rfc3339(),
                "networkInterfaces": [{"accessConfigs": [{"type": "ONE_TO_ONE_NAT", "natIP": "127.0.0.200"}]}],
            });
            s.instances.insert(
                (zone.into(), name.into()),
                Inst { body, gets: 0, deleting: None, delete_op: None, deleted_at: None },
            );
        });
    }

    /// Forgets request ids, so a repeated insert meets the existing
    /// instance (409) instead of its earlier operation.
    pub fn forget_request_ids(&self) {
        self.with(|s| s.op_by_request_id.clear());
    }

    pub fn set_creation_timestamp(&self, name: &str, ts: &str) {
        self.with(|s| {
            for ((_, n), i) in s.instances.iter_mut() {
                if n == name {
                    i.body["creationTimestamp"] = json!(ts);
                }
            }
        });
    }
}

fn status_name(code: u16) -> &'static str {
    match code {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ALREADY_EXISTS",
        429 => "RESOURCE_EXHAUSTED",
        500 => "INTERNAL",
        503 => "UNAVAILABLE",
        _ => "UNKNOWN",
    }
}

fn google_error(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({"error": {
        "code": code,
        "message": message,
        "errors": [{"message": message, "domain": "global", "reason": reason}],
        "status": status_name(code),
    }});
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn ok(v: Value) -> Response {
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        v.to_string(),
    )
        .into_response()
}

fn query_map(uri: &Uri) -> HashMap<String, String> {
    url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

async fn handle(
    State(store): State<Arc<Mutex<Store>>>,
    method: Method,
    uri: Uri,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let q = query_map(&uri);
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let kind = match (method.as_str(), segs.as_slice()) {
        ("POST", ["compute", "v1", "projects", _, "zones", _, "instances"]) => "insert",
        ("GET", ["compute", "v1", "projects", _, "zones", _, "instances", _]) => "get",
        ("DELETE", ["compute", "v1", "projects", _, "zones", _, "instances", _]) => "delete",
        ("GET", ["compute", "v1", "projects", _, "aggregated", "instances"]) => "list",
        ("GET", ["compute", "v1", "projects", _, "zones", _, "operations", _]) => "op",
        ("POST", ["compute", "v1", "projects", _, "zones", _, "operations", _, "wait"]) => "op",
        ("POST", ["compute", "v1", "projects", _, "global", "firewalls"]) => "fw.insert",
        ("GET", ["compute", "v1", "projects", _, "global", "firewalls"]) => "fw.list",
        ("GET", ["compute", "v1", "projects", _, "global", "firewalls", _]) => "fw.get",
        ("DELETE", ["compute", "v1", "projects", _, "global", "firewalls", _]) => "fw.delete",
        _ => "unknown",
    };
    let instance = match kind {
        "insert" => serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|b| b["name"].as_str().map(str::to_string))
            .unwrap_or_default(),
        "get" | "delete" => segs[7].to_string(),
        "fw.get" | "fw.delete" => segs[6].to_string(),
        _ => String::new(),
    };
    let (delay, injected) = {
        let mut s = store.lock().unwrap();
        s.requests.push((
            method.to_string(),
            path.clone(),
            uri.query().unwrap_or("").to_string(),
        ));
        s.calls.push(Call {
            at: std::time::Instant::now(),
            kind,
            instance,
        });
        let injected = match &s.outage {
            Some(o) if kind != "unknown" => Some(o.clone()),
            _ => s.inject.get_mut(kind).and_then(VecDeque::pop_front),
        };
        (s.delay.get(kind).copied(), injected)
    };
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    if let Some(i) = injected {
        return google_error(i.status, &i.reason, &i.message);
    }
    let mut s = store.lock().unwrap();
    if let Some(takes) = s.delete_takes {
        s.instances
            .retain(|_, i| i.deleted_at.is_none_or(|t| t.elapsed() < takes));
    }
    match kind {
        "insert" => insert(&mut s, segs[5], &q, &body),
        "get" => get(&mut s, segs[5], segs[7]),
        "delete" => delete(&mut s, segs[5], segs[7]),
        "list" => list(&mut s, &q),
        "op" => operation(&mut s, segs[7]),
        "fw.insert" => firewall_insert(&mut s, &body),
        "fw.list" => ok(json!({"kind": "compute#firewallList",
            "items": s.firewalls.values().cloned().collect::<Vec<_>>()})),
        "fw.get" => match s.firewalls.get(segs[6]) {
            Some(rule) => ok(rule.clone()),
            None => firewall_not_found(segs[6]),
        },
        "fw.delete" => match s.firewalls.remove(segs[6]) {
            Some(_) => ok(global_op(&mut s, "delete", segs[6])),
            None => firewall_not_found(segs[6]),
        },
        _ => google_error(404, "notFound", &format!("no route {method} {path}")),
    }
}

/// A finished global operation (firewall calls).
fn global_op(s: &mut Store, op_type: &str, target: &str) -> Value {
    s.next_op += 1;
    json!({
        "kind": "compute#operation",
        "id": s.next_op.to_string(),
        "name": format!("operation-{}-{op_type}", s.next_op),
        "operationType": op_type,
        "targetLink": format!("{}/projects/my-project/global/firewalls/{target}", s.base),
        "status": "DONE",
        "progress": 100,
    })
}

fn firewall_not_found(name: &str) -> Response {
    google_error(
        404,
        "notFound",
        &format!("The resource 'projects/my-project/global/firewalls/{name}' was not found"),
    )
}

/// A firewall insert: the rule kept as sent; 409 when its name exists.
fn firewall_insert(s: &mut Store, body: &[u8]) -> Response {
    let Ok(rule) = serde_json::from_slice::<Value>(body) else {
        return google_error(400, "invalid", "the body is not JSON");
    };
    let Some(name) = rule["name"].as_str().map(str::to_string) else {
        return google_error(400, "invalid", "a firewall needs a name");
    };
    if s.firewalls.contains_key(&name) {
        return google_error(
            409,
            "alreadyExists",
            &format!("The resource 'projects/my-project/global/firewalls/{name}' already exists"),
        );
    }
    s.firewalls.insert(name.clone(), rule);
    ok(global_op(s, "insert", &name))
}

fn new_op(s: &mut Store, zone: &str, op_type: &str, target: &str, status: &str) -> Value {
    s.next_op += 1;
    let name = format!("operation-{}-{op_type}", s.next_op);
    let op = json!({
        "kind": "compute#operation",
        "id": s.next_op.to_string(),
        "name": name,
        "zone": format!("{}/projects/my-project/zones/{zone}", s.base),
        "operationType": op_type,
        "targetLink": target,
        "status": status,
        "progress": 0,
    });
    s.ops.insert(name, op.clone());
    op
}

fn insert(s: &mut Store, zone: &str, q: &HashMap<String, String>, body: &[u8]) -> Response {
    let Ok(mut inst) = serde_json::from_slice::<Value>(body) else {
        return google_error(400, "parseError", "body is not JSON");
    };
    let name = inst["name"].as_str().unwrap_or("").to_string();
    if name.is_empty() {
        return google_error(
            400,
            "required",
            "Required field 'resource.name' not specified",
        );
    }
    let rid = q.get("requestId").cloned().unwrap_or_default();
    if let Some(op) = s.op_by_request_id.get(&rid).and_then(|n| s.ops.get(n)) {
        return ok(op.clone());
    }
    if s.instances.contains_key(&(zone.to_string(), name.clone())) {
        return google_error(
            409,
            "alreadyExists",
            &format!(
                "The resource 'projects/my-project/zones/{zone}/instances/{name}' already exists"
            ),
        );
    }
    let target = format!(
        "{}/projects/my-project/zones/{zone}/instances/{name}",
        s.base
    );
    let op = new_op(s, zone, "insert", &target, "RUNNING");
    let op_name = op["name"].as_str().unwrap_or("").to_string();
    if !rid.is_empty() {
        s.op_by_request_id.insert(rid, op_name.clone());
    }
    let mut done = op.clone();
    done["status"] = json!("DONE");
    if let Some((code, message)) = s.fail_next_insert_op.take() {
        done["error"] = json!({"errors": [{"code": code, "message": message}]});
        done["httpErrorStatusCode"] = json!(403);
        s.ops.insert(op_name, done);
        return ok(op);
    }
    s.ops.insert(op_name, done);
    s.next_op += 1;
    inst["id"] = json!((1000 + s.next_op).to_string());
    inst["kind"] = json!("compute#instance");
    inst["status"] = json!("PROVISIONING");
    inst["zone"] = json!(format!("{}/projects/my-project/zones/{zone}", s.base));
    inst["selfLink"] = json!(target);
    inst["creationTimestamp"] = json!(chrono::Utc::now()
        .with_timezone(&chrono::FixedOffset::west_opt(7 * 3600).unwrap())
        .to_rfc3339());
    s.instances.insert(
        (zone.to_string(), name),
        Inst {
            body: inst,
            gets: 0,
            deleting: None,
            delete_op: None,
            deleted_at: None,
        },
    );
    let provisioning = s
        .instances
        .values()
        .filter(|i| i.body["status"] == json!("PROVISIONING"))
        .count();
    s.inserts.push((chrono::Utc::now(), provisioning));
    ok(op)
}

fn not_found(zone: &str, name: &str) -> Response {
    google_error(
        404,
        "notFound",
        &format!("The resource 'projects/my-project/zones/{zone}/instances/{name}' was not found"),
    )
}

fn get(s: &mut Store, zone: &str, name: &str) -> Response {
    settle_deletes(s);
    let key = (zone.to_string(), name.to_string());
    let running_after = s.running_after_gets;
    let no_ip = s.no_ip;
    let forced = s.status_override.get(name).cloned();
    let slow_delete = s.delete_takes.is_some();
    let Some(inst) = s.instances.get_mut(&key) else {
        return not_found(zone, name);
    };
    inst.gets += 1;
    if let Some(left) = inst.deleting {
        if slow_delete {
            let mut b = inst.body.clone();
            b["status"] = json!("STOPPING");
            return ok(b);
        }
        if left == 0 {
            s.instances.remove(&key);
            return not_found(zone, name);
        }
        inst.deleting = Some(left - 1);
        let mut b = inst.body.clone();
        b["status"] = json!("STOPPING");
        return ok(b);
    }
    let mut b = inst.body.clone();
    if b["status"] == json!("PROVISIONING") && inst.gets >= running_after {
        b["status"] = json!("RUNNING");
    }
    if b["status"] == json!("RUNNING") && !no_ip {
        if b.pointer("/networkInterfaces/0/accessConfigs/0/natIP")
            .is_none()
        {
            let ip = match &s.fixed_ip {
                Some(ip) => ip.clone(),
                None => {
                    s.next_ip = s.next_ip.wrapping_add(1).max(1);
                    format!("127.0.0.{}", s.next_ip)
                }
            };
            if let Some(ac) = b.pointer_mut("/networkInterfaces/0/accessConfigs/0") {
                ac["natIP"] = json!(ip);
            }
        }
    } else if let Some(ac) = b.pointer_mut("/networkInterfaces/0/accessConfigs/0") {
        if let Some(m) = ac.as_object_mut() {
            m.remove("natIP");
        }
    }
    if let Some(inst) = s.instances.get_mut(&key) {
        inst.body = b.clone();
    }
    if let Some(f) = forced {
        b["status"] = json!(f);
    }
    ok(b)
}

fn delete(s: &mut Store, zone: &str, name: &str) -> Response {
    let key = (zone.to_string(), name.to_string());
    let delete_gets = s.delete_gets;
    let Some(existing) = s.instances.get(&key).cloned() else {
        return not_found(zone, name);
    };
    if let Some(op) = existing.delete_op.as_ref().and_then(|n| s.ops.get(n)) {
        return ok(op.clone());
    }
    let target = format!(
        "{}/projects/my-project/zones/{zone}/instances/{name}",
        s.base
    );
    let op = new_op(s, zone, "delete", &target, "RUNNING");
    if let Some(inst) = s.instances.get_mut(&key) {
        inst.deleting = Some(delete_gets);
        inst.delete_op = op["name"].as_str().map(str::to_string);
        inst.deleted_at = Some(std::time::Instant::now());
    }
    ok(op)
}

fn operation(s: &mut Store, name: &str) -> Response {
    let Some(mut op) = s.ops.get(name).cloned() else {
        return google_error(404, "notFound", &format!("operation {name} not found"));
    };
    if op["operationType"] == json!("delete") {
        let still = s
            .instances
            .values()
            .any(|i| i.delete_op.as_deref() == Some(name));
        op["status"] = json!(if still { "RUNNING" } else { "DONE" });
    }
    ok(op)
}

/// Parses `labels.KEY = VALUE` (spaces optional).
fn parse_filter(f: &str) -> Option<(String, String)> {
    let (k, v) = f.split_once('=')?;
    let k = k.trim().strip_prefix("labels.")?;
    Some((k.trim().to_string(), v.trim().trim_matches('"').to_string()))
}

/// A deleted instance is gone a few seconds after its delete, however
/// it is read (as on the real API): a reader that only lists, and never
/// gets it, must see it go too. `delete_takes` keeps it longer.
const DELETED_AFTER: Duration = Duration::from_secs(5);

fn settle_deletes(s: &mut Store) {
    if s.delete_takes.is_some() {
        return;
    }
    s.instances.retain(|_, i| {
        !(i.deleting.is_some() && i.deleted_at.is_some_and(|t| t.elapsed() >= DELETED_AFTER))
    });
}

fn list(s: &mut Store, q: &HashMap<String, String>) -> Response {
    settle_deletes(s);
    let filter = q.get("filter").and_then(|f| parse_filter(f));
    let mut all: Vec<Value> = s
        .instances
        .values()
        .filter(|i| {
            s.ignore_filter
                || match &filter {
                    Some((k, v)) => i.body["labels"][k.as_str()].as_str() == Some(v.as_str()),
                    None => true,
                }
        })
        .map(|i| {
            // A forced status is the instance's status, whichever call
            // reads it; one being deleted shows STOPPING, as to a get.
            let mut b = i.body.clone();
            if let Some(f) = b["name"].as_str().and_then(|n| s.status_override.get(n)) {
                b["status"] = json!(f);
            } else if i.deleting.is_some() {
                b["status"] = json!("STOPPING");
            }
            b
        })
        .collect();
    all.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    let size = q
        .get("maxResults")
        .and_then(|m| m.parse::<usize>().ok())
        .unwrap_or(s.page_size)
        .max(1);
    let start = q
        .get("pageToken")
        .and_then(|t| t.strip_prefix("page-"))
        .and_then(|t| t.parse::<usize>().ok())
        .unwrap_or(0);
    let page: Vec<Value> = all.iter().skip(start).take(size).cloned().collect();
    let mut items = serde_json::Map::new();
    for inst in page {
        let zone = inst["zone"]
            .as_str()
            .unwrap_or("")
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_string();
        let entry = items
            .entry(format!("zones/{zone}"))
            .or_insert_with(|| json!({"instances": []}));
        if let Some(a) = entry["instances"].as_array_mut() {
            a.push(inst);
        }
    }
    let mut resp = json!({"kind": "compute#instanceAggregatedList", "id": "projects/my-project/aggregated/instances"});
    if start == 0 {
        for z in &s.unreachable_zones {
            items.insert(
                format!("zones/{z}"),
                json!({"warning": {"code": "UNREACHABLE", "message": format!("zone {z} unreachable"), "data": [{"key": "scope", "value": format!("zones/{z}")}]}}),
            );
        }
        if !s.unreachable_zones.is_empty() {
            resp["unreachables"] = json!(s
                .unreachable_zones
                .iter()
                .map(|z| format!("zones/{z}"))
                .collect::<Vec<_>>());
        }
    }
    resp["items"] = Value::Object(items);
    if start + size < all.len() || s.endless_pages {
        resp["nextPageToken"] = json!(format!("page-{}", start + size));
    }
    ok(resp)
}
