//! The `gcp` provider: Compute Engine VMs with an ephemeral external IP,
//! through the official `google-cloud-compute-v1` client. See
//! docs/gcp-provider.md and providers.md §11.
//!
//! Calls: `instances.insert`, `instances.get`, `instances.delete`,
//! `instances.aggregatedList`, plus `zoneOperations.get` for the operations
//! this process submitted (an insert that failed asynchronously, a delete
//! still in flight). Operations are never awaited.

pub mod build;
pub mod classify;
pub mod wire;

use std::collections::HashMap;
use std::error::Error as StdError;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use google_cloud_compute_v1::client::{Instances, ZoneOperations};
use google_cloud_compute_v1::model;
use google_cloud_gax::options::RequestOptionsBuilder;
use google_cloud_gax::retry_policy::{Aip194Strict, RetryPolicyExt};
use tokio::sync::OnceCell;
use tracing::{debug, trace, warn};

use self::build::{InstanceRef, MANAGED_FILTER};
use crate::config::GcpConfig;
use crate::provider::registry::ProviderType;
use crate::provider::{
    Checker, CreateRequest, ErrorClass, Instance, InstanceState, Listing, Op, Provider,
    ProviderError, TargetStatus,
};

/// The address the check reports for humans.
pub const CHECK_ADDRESS: &str = "compute.googleapis.com";

/// Most pages ListByTag reads before giving up (an error, not a partial
/// list): a bound against a server that never stops paging.
pub const MAX_LIST_PAGES: usize = 10_000;

/// Options that do not come from the providers file.
#[derive(Clone, Debug)]
pub struct GcpOptions {
    /// Log whole payloads in the wire log (`--gcp-wire-log-full-payloads`);
    /// user-data stays redacted.
    pub wire_log_full_payloads: bool,
    /// Upper bound of one health check.
    pub check_timeout: Duration,
    /// Attempts per call for the SDK's own retries of idempotent calls
    /// (get, delete, list) on unavailability and connection failures.
    pub max_attempts: u32,
    /// Time limit of those retries.
    pub retry_time_limit: Duration,
}

impl Default for GcpOptions {
    fn default() -> Self {
        GcpOptions {
            wire_log_full_payloads: false,
            check_timeout: Duration::from_secs(10),
            max_attempts: 5,
            retry_time_limit: Duration::from_secs(30),
        }
    }
}

/// The SDK clients, built on first use (construction never dials).
struct Clients {
    instances: Instances,
    operations: ZoneOperations,
}

/// An operation this process submitted for an instance.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PendingOp {
    zone: String,
    operation: String,
}

struct Inner {
    name: String,
    cfg: GcpConfig,
    opts: GcpOptions,
    clients: OnceCell<Clients>,
    /// Insert operations by instance name.
    inserts: Mutex<HashMap<String, PendingOp>>,
    /// Delete operations by instance name.
    deletes: Mutex<HashMap<String, PendingOp>>,
    /// The (uid, request id) of the insert attempt in flight, by instance name.
    /// Retries of one attempt reuse it (the API dedupes them); a new attempt
    /// after the instance is gone (replacement, recreation) gets a new one,
    /// or the API would answer with the old attempt's operation and create
    /// nothing.
    insert_ids: Mutex<HashMap<String, (String, String)>>,
}

/// The gcp provider. Cheap to clone; clones share clients and the memory of
/// submitted operations.
#[derive(Clone)]
pub struct GcpProvider {
    inner: Arc<Inner>,
}

/// Why a client could not be built (credentials, endpoint).
#[derive(Debug, thiserror::Error)]
#[error("building the Compute client: {0}")]
pub struct ClientBuildError(String);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned map only means another call panicked mid-update of a plain
    // HashMap insert/remove; the map itself is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl GcpProvider {
    /// Builds the provider. Never dials: the SDK clients are created on the
    /// first call. Fails only on config errors.
    pub fn new(name: &str, cfg: &GcpConfig, opts: GcpOptions) -> Result<Self, String> {
        if cfg.project.trim().is_empty() {
            return Err("gcp.project is required".into());
        }
        if cfg.anonymous {
            warn!(
                provider = name,
                "gcp.anonymous is set: calls carry no credentials (only for local stand-ins)"
            );
        }
        if std::env::var("GOOGLE_CLOUD_RUST_LOGGING").is_ok_and(|v| v == "true") {
            warn!(
                provider = name,
                "GOOGLE_CLOUD_RUST_LOGGING=true makes the Compute SDK log whole requests at DEBUG, cloud-init included; unset it in production"
            );
        }
        Ok(GcpProvider {
            inner: Arc::new(Inner {
                name: name.to_string(),
                cfg: cfg.clone(),
                opts,
                clients: OnceCell::new(),
                inserts: Mutex::new(HashMap::new()),
                deletes: Mutex::new(HashMap::new()),
                insert_ids: Mutex::new(HashMap::new()),
            }),
        })
    }

    fn project(&self) -> &str {
        &self.inner.cfg.project
    }

    fn full(&self) -> bool {
        self.inner.opts.wire_log_full_payloads
    }

    async fn clients(&self) -> Result<&Clients, ClientBuildError> {
        self.inner
            .clients
            .get_or_try_init(|| async {
                let cfg = &self.inner.cfg;
                let opts = &self.inner.opts;
                let policy = || {
                    Aip194Strict
                        .with_attempt_limit(opts.max_attempts.max(1))
                        .with_time_limit(opts.retry_time_limit)
                };
                let mut ib = Instances::builder().with_retry_policy(policy());
                let mut ob = ZoneOperations::builder().with_retry_policy(policy());
                if let Some(ep) = &cfg.endpoint {
                    ib = ib.with_endpoint(ep.clone());
                    ob = ob.with_endpoint(ep.clone());
                }
                if cfg.anonymous {
                    let c = google_cloud_auth::credentials::anonymous::Builder::new().build();
                    ib = ib.with_credentials(c.clone());
                    ob = ob.with_credentials(c);
                }
                let instances = ib
                    .build()
                    .await
                    .map_err(|e| ClientBuildError(e.to_string()))?;
                let operations = ob
                    .build()
                    .await
                    .map_err(|e| ClientBuildError(e.to_string()))?;
                Ok(Clients {
                    instances,
                    operations,
                })
            })
            .await
    }

    /// Wraps a failed call after the raw-error log line.
    fn fail(
        &self,
        op: Op,
        id: &str,
        call: &str,
        err: impl Into<crate::provider::BoxError>,
    ) -> ProviderError {
        let err = err.into();
        debug!(
            provider = %self.inner.name,
            op = op.as_str(),
            id,
            call,
            detail = %classify::describe(err.as_ref()),
            "gcp api call failed"
        );
        ProviderError::classify_with(op, &self.inner.name, id, err, classify::classify)
    }

    fn permanent(&self, op: Op, id: &str, message: impl Into<String>) -> ProviderError {
        ProviderError::new(ErrorClass::Permanent, op, &self.inner.name, id, message)
    }

    fn wire_request<T: serde::Serialize>(&self, call: &str, target: &str, body: Option<&T>) {
        if tracing::enabled!(target: wire::TARGET, tracing::Level::TRACE) {
            let body = body
                .map(|b| wire::render(b, self.full()))
                .unwrap_or_default();
            trace!(target: wire::TARGET, provider = %self.inner.name, call, target, body = %body, "api request");
        }
    }

    fn wire_response<T: serde::Serialize>(
        &self,
        call: &str,
        started: Instant,
        res: &Result<T, google_cloud_compute_v1::Error>,
    ) {
        if tracing::enabled!(target: wire::TARGET, tracing::Level::TRACE) {
            let elapsed_ms = started.elapsed().as_millis() as u64;
            match res {
                Ok(b) => {
                    let body = wire::render(b, self.full());
                    trace!(target: wire::TARGET, provider = %self.inner.name, call, elapsed_ms, body = %body, "api response");
                }
                Err(e) => {
                    let detail = classify::describe(e);
                    trace!(target: wire::TARGET, provider = %self.inner.name, call, elapsed_ms, error = %detail, "api response");
                }
            }
        }
    }

    async fn api_get(
        &self,
        c: &Clients,
        r: &InstanceRef,
    ) -> Result<model::Instance, google_cloud_compute_v1::Error> {
        self.wire_request::<()>("instances.get", &r.id(), None);
        let t = Instant::now();
        let res = c
            .instances
            .get()
            .set_project(self.project())
            .set_zone(&r.zone)
            .set_instance(&r.name)
            .send()
            .await;
        self.wire_response("instances.get", t, &res);
        res
    }

    async fn api_operation(
        &self,
        c: &Clients,
        p: &PendingOp,
    ) -> Result<model::Operation, google_cloud_compute_v1::Error> {
        self.wire_request::<()>("zoneOperations.get", &p.operation, None);
        let t = Instant::now();
        let res = c
            .operations
            .get()
            .set_project(self.project())
            .set_zone(&p.zone)
            .set_operation(&p.operation)
            .send()
            .await;
        self.wire_response("zoneOperations.get", t, &res);
        res
    }

    fn remember(
        map: &Mutex<HashMap<String, PendingOp>>,
        name: &str,
        zone: &str,
        op: &model::Operation,
    ) {
        if let Some(opname) = op.name.as_deref().filter(|n| !n.is_empty()) {
            lock(map).insert(
                name.to_string(),
                PendingOp {
                    zone: zone.to_string(),
                    operation: opname.to_string(),
                },
            );
        }
    }

    /// An instance that get found missing: if this process submitted its
    /// insert, the operation tells whether the insert failed (reported once,
    /// classified, with the API's message), is still running (Provisioning)
    /// or finished (really gone: NotFound).
    async fn missing(
        &self,
        c: &Clients,
        r: &InstanceRef,
        not_found: google_cloud_compute_v1::Error,
    ) -> Result<Instance, ProviderError> {
        let id = r.id();
        let pending = lock(&self.inner.inserts)
            .get(&r.name)
            .filter(|p| p.zone == r.zone)
            .cloned();
        let Some(p) = pending else {
            return Err(self.fail(Op::Get, &id, "instances.get", not_found));
        };
        let op = match self.api_operation(c, &p).await {
            Ok(op) => op,
            Err(e) if classify::http_status(&e) == Some(404) => {
                lock(&self.inner.inserts).remove(&r.name);
                return Err(self.fail(Op::Get, &id, "instances.get", not_found));
            }
            Err(e) => return Err(self.fail(Op::Get, &id, "zoneOperations.get", e)),
        };
        let done = op.status.as_ref().and_then(|s| s.name()) == Some("DONE");
        if !done {
            debug!(provider = %self.inner.name, id, operation = %p.operation, "insert still in progress");
            return Ok(Instance::new(id, InstanceState::Provisioning));
        }
        // Done: report a failure once, then forget the operation so the
        // next get answers NotFound and the reconciler may create again.
        lock(&self.inner.inserts).remove(&r.name);
        let errors = op
            .error
            .as_ref()
            .map(|e| e.errors.as_slice())
            .unwrap_or_default();
        if errors.is_empty() {
            return Err(self.fail(Op::Get, &id, "instances.get", not_found));
        }
        let class =
            classify::classify_operation_codes(errors.iter().filter_map(|e| e.code.as_deref()));
        let message = errors
            .iter()
            .map(|e| {
                format!(
                    "{}: {}",
                    e.code.as_deref().unwrap_or("UNKNOWN"),
                    e.message.as_deref().unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        debug!(provider = %self.inner.name, id, operation = %p.operation, %message, "insert operation failed");
        Err(ProviderError::new(
            class,
            Op::Get,
            &self.inner.name,
            &id,
            format!("insert operation {} failed: {message}", p.operation),
        ))
    }
}

#[async_trait]
impl Provider for GcpProvider {
    fn name(&self) -> &str {
        &self.inner.name
    }

    fn provider_type(&self) -> ProviderType {
        ProviderType::Gcp
    }

    async fn create(&self, req: &CreateRequest) -> Result<String, ProviderError> {
        build::validate_placement(req).map_err(|m| self.permanent(Op::Create, "", m))?;
        let zone = req.placement.zone.clone();
        let r = InstanceRef {
            zone: zone.clone(),
            name: req.name.clone(),
        };
        let id = r.id();
        let c = self
            .clients()
            .await
            .map_err(|e| self.fail(Op::Create, "", "client", e))?;
        let body = build::build_instance(req, &self.inner.cfg);
        let request_id = {
            let mut ids = lock(&self.inner.insert_ids);
            let entry = ids.entry(req.name.clone()).or_insert_with(|| {
                (
                    req.uid.clone(),
                    build::insert_request_id(&req.name, &req.uid),
                )
            });
            // Another Proxy's create for this name is never the same attempt.
            if entry.0 != req.uid {
                *entry = (
                    req.uid.clone(),
                    build::insert_request_id(&req.name, &req.uid),
                );
            }
            entry.1.clone()
        };
        self.wire_request("instances.insert", &id, Some(&body));
        let t = Instant::now();
        let res = c
            .instances
            .insert()
            .set_project(self.project())
            .set_zone(&zone)
            .set_request_id(request_id)
            .set_body(body)
            .send()
            .await;
        self.wire_response("instances.insert", t, &res);
        match res {
            Ok(op) => {
                Self::remember(&self.inner.inserts, &req.name, &zone, &op);
                debug!(
                    provider = %self.inner.name,
                    id,
                    operation = op.name.as_deref().unwrap_or(""),
                    cloud_init_bytes = req.cloud_init.len(),
                    "instance insert submitted"
                );
                Ok(id)
            }
            Err(e) if classify::http_status(&e) == Some(409) => {
                // Already exists: adopt it only if it is this Proxy's.
                let existing = self
                    .api_get(c, &r)
                    .await
                    .map_err(|e| self.fail(Op::Create, "", "instances.get", e))?;
                let uid = existing
                    .labels
                    .get(build::LABEL_UID)
                    .map(String::as_str)
                    .unwrap_or("");
                if uid != req.uid {
                    return Err(self.permanent(
                        Op::Create,
                        &id,
                        format!(
                            "instance {} already exists with {}={uid:?}, not the requested uid {:?}",
                            req.name,
                            build::LABEL_UID,
                            req.uid
                        ),
                    ));
                }
                debug!(provider = %self.inner.name, id, "instance already exists; adopted");
                Ok(id)
            }
            Err(e) => Err(self.fail(Op::Create, "", "instances.insert", e)),
        }
    }

    async fn get(&self, id: &str) -> Result<Instance, ProviderError> {
        let r = build::parse_id(id).map_err(|m| self.permanent(Op::Get, id, m))?;
        let c = self
            .clients()
            .await
            .map_err(|e| self.fail(Op::Get, id, "client", e))?;
        match self.api_get(c, &r).await {
            Ok(inst) => {
                let out = build::to_instance(id.to_string(), &inst);
                debug!(provider = %self.inner.name, id, state = out.state.as_str(), ip = %out.ip, "instance read");
                Ok(out)
            }
            Err(e) if classify::http_status(&e) == Some(404) => {
                let res = self.missing(c, &r, e).await;
                if res.is_err() {
                    // The attempt is over (gone, or failed and reported): a
                    // new create is a new attempt.
                    lock(&self.inner.insert_ids).remove(&r.name);
                }
                res
            }
            Err(e) => Err(self.fail(Op::Get, id, "instances.get", e)),
        }
    }

    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        let r = build::parse_id(id).map_err(|m| self.permanent(Op::Delete, id, m))?;
        let c = self
            .clients()
            .await
            .map_err(|e| self.fail(Op::Delete, id, "client", e))?;
        let pending = lock(&self.inner.deletes)
            .get(&r.name)
            .filter(|p| p.zone == r.zone)
            .cloned();
        if let Some(p) = pending {
            match self.api_operation(c, &p).await {
                Ok(op) if op.status.as_ref().and_then(|s| s.name()) != Some("DONE") => {
                    debug!(provider = %self.inner.name, id, operation = %p.operation, "delete already in progress");
                    return Ok(());
                }
                // Done (or unknown): submit again, which answers 404 once gone.
                _ => {
                    lock(&self.inner.deletes).remove(&r.name);
                }
            }
        }
        self.wire_request::<()>("instances.delete", id, None);
        let t = Instant::now();
        let res = c
            .instances
            .delete()
            .set_project(self.project())
            .set_zone(&r.zone)
            .set_instance(&r.name)
            .send()
            .await;
        self.wire_response("instances.delete", t, &res);
        lock(&self.inner.inserts).remove(&r.name);
        lock(&self.inner.insert_ids).remove(&r.name);
        match res {
            Ok(op) => {
                Self::remember(&self.inner.deletes, &r.name, &r.zone, &op);
                debug!(provider = %self.inner.name, id, operation = op.name.as_deref().unwrap_or(""), "instance delete submitted");
                Ok(())
            }
            Err(e) if classify::http_status(&e) == Some(404) => {
                debug!(provider = %self.inner.name, id, "instance already gone");
                Ok(())
            }
            Err(e) => Err(self.fail(Op::Delete, id, "instances.delete", e)),
        }
    }

    async fn list_by_tag(&self) -> Result<Listing, ProviderError> {
        let c = self
            .clients()
            .await
            .map_err(|e| self.fail(Op::List, "", "client", e))?;
        let mut listing = Listing::default();
        let mut token = String::new();
        for page in 0.. {
            if page >= MAX_LIST_PAGES {
                return Err(self.permanent(
                    Op::List,
                    "",
                    format!("aggregated list did not end after {MAX_LIST_PAGES} pages"),
                ));
            }
            let mut b = c
                .instances
                .aggregated_list()
                .set_project(self.project())
                .set_filter(MANAGED_FILTER);
            if !token.is_empty() {
                b = b.set_page_token(token.clone());
            }
            self.wire_request::<()>("instances.aggregatedList", &token, None);
            let t = Instant::now();
            let res = b.send().await;
            self.wire_response("instances.aggregatedList", t, &res);
            let resp = res.map_err(|e| self.fail(Op::List, "", "instances.aggregatedList", e))?;
            collect_page(&resp, &mut listing);
            match resp.next_page_token.as_deref() {
                Some(next) if !next.is_empty() => {
                    if next == token {
                        return Err(self.permanent(
                            Op::List,
                            "",
                            "aggregated list returned the same page token twice",
                        ));
                    }
                    token = next.to_string();
                }
                _ => break,
            }
        }
        listing.unread_scopes.sort();
        listing.unread_scopes.dedup();
        if !listing.unread_scopes.is_empty() {
            warn!(provider = %self.inner.name, unread = ?listing.unread_scopes, "instances listed without some zones");
        }
        debug!(provider = %self.inner.name, filter = MANAGED_FILTER, count = listing.instances.len(), "instances listed");
        Ok(listing)
    }

    fn checker(&self) -> Option<Arc<dyn Checker>> {
        Some(Arc::new(self.clone()))
    }
}

/// Adds one aggregated-list page to `listing`: managed instances, and the
/// zones that reported themselves unreachable.
fn collect_page(resp: &model::InstanceAggregatedList, listing: &mut Listing) {
    for u in &resp.unreachables {
        listing.unread_scopes.push(u.clone());
    }
    let mut scopes: Vec<_> = resp.items.iter().collect();
    scopes.sort_by(|a, b| a.0.cmp(b.0));
    for (scope, list) in scopes {
        if let Some(w) = &list.warning {
            let code = w.code.as_ref().and_then(|c| c.name()).unwrap_or("");
            if code == "UNREACHABLE" {
                listing.unread_scopes.push(scope.clone());
            }
        }
        for inst in &list.instances {
            if !build::is_managed(inst) {
                continue;
            }
            let Some(name) = inst.name.as_deref() else {
                continue;
            };
            let zone = inst
                .zone
                .as_deref()
                .map(build::last_segment)
                .unwrap_or_else(|| build::last_segment(scope));
            listing
                .instances
                .push(build::to_instance(build::format_id(zone, name), inst));
        }
    }
}

#[async_trait]
impl Checker for GcpProvider {
    async fn check(&self) -> Vec<TargetStatus> {
        let started = Instant::now();
        let project = self.project().to_string();
        let run = async {
            let c = self
                .clients()
                .await
                .map_err(|e| -> Box<dyn StdError + Send + Sync> { Box::new(e) })?;
            c.instances
                .aggregated_list()
                .set_project(self.project())
                .set_filter(MANAGED_FILTER)
                .set_max_results(1_u32)
                // One page, one request: a refused connection reads as
                // Unreachable now, not as Timeout after retries.
                .with_retry_policy(Aip194Strict.with_attempt_limit(1))
                .send()
                .await
                .map(|_| ())
                .map_err(|e| -> Box<dyn StdError + Send + Sync> { Box::new(e) })
        };
        let (ready, reason, message) = match tokio::time::timeout(
            self.inner.opts.check_timeout,
            run,
        )
        .await
        {
            Ok(Ok(())) => (true, "Reachable", String::new()),
            Ok(Err(e)) => {
                debug!(provider = %self.inner.name, op = "check", detail = %classify::describe(e.as_ref()), "gcp api call failed");
                (false, classify::check_reason(e.as_ref()), e.to_string())
            }
            Err(elapsed) => (false, "Timeout", format!("check did not finish: {elapsed}")),
        };
        vec![TargetStatus {
            name: project,
            address: CHECK_ADDRESS.to_string(),
            ready,
            reason: reason.to_string(),
            message,
            latency: started.elapsed(),
            details: Default::default(),
        }]
    }
}

// Compile-time proof the provider satisfies both contracts.
const _: fn() = || {
    fn provider<T: Provider + Checker + Clone + 'static>() {}
    provider::<GcpProvider>();
};
