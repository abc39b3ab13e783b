//! The `gcp` provider: Compute Engine VMs with an ephemeral external IP,
//! through the official `google-cloud-compute-v1` client. See
//! docs/gcp-provider.md and providers.md §11.
//!
//! Calls: `instances.insert`, `instances.get`, `instances.delete`,
//! `instances.aggregatedList`, plus `zoneOperations.get` for the operations
//! this process submitted (an insert that failed asynchronously, a delete
//! still in flight), and with `gcp.firewall` `firewalls.get`, `.insert`,
//! `.list` and `.delete` ([`firewall`]). Operations are never awaited.

mod api;
pub mod build;
mod check;
pub mod classify;
pub mod firewall;
mod list;
mod operations;
pub mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::OnceCell;
use tracing::{debug, warn};

use self::api::Clients;
use self::build::InstanceRef;
use self::operations::{lock, PendingOp};
use crate::config::GcpConfig;
use crate::provider::registry::ProviderType;
use crate::provider::{Checker, CreateRequest, Instance, Listing, Op, Provider, ProviderError};

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
    /// Creates ensure their port's firewall rule one at a time.
    firewall_lock: tokio::sync::Mutex<()>,
    /// When a create last made sure of each port's rule.
    ensured: Mutex<HashMap<u16, Instant>>,
    /// The ports each installation's instances serve on, by the last
    /// listing, and when it was taken.
    ports_seen: Mutex<Option<(Instant, firewall::PortsInUse)>>,
}

/// The gcp provider. Cheap to clone; clones share clients and the memory of
/// submitted operations.
#[derive(Clone)]
pub struct GcpProvider {
    inner: Arc<Inner>,
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
                firewall_lock: tokio::sync::Mutex::new(()),
                ensured: Mutex::new(HashMap::new()),
                ports_seen: Mutex::new(None),
            }),
        })
    }

    fn project(&self) -> &str {
        &self.inner.cfg.project
    }

    fn full(&self) -> bool {
        self.inner.opts.wire_log_full_payloads
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
        build::validate_placement(req, &self.inner.cfg)
            .map_err(|m| self.permanent(Op::Create, "", m))?;
        self.refuse_open(req)?;
        self.ensure_rule(req).await?;
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
        self.list_all().await
    }

    async fn collect_shared(&self, installation_id: &str) -> Result<Vec<String>, ProviderError> {
        self.sweep_rules(installation_id).await
    }

    fn checker(&self) -> Option<Arc<dyn Checker>> {
        Some(Arc::new(self.clone()))
    }
}

// Compile-time proof the provider satisfies both contracts.
const _: fn() = || {
    fn provider<T: Provider + Checker + Clone + 'static>() {}
    provider::<GcpProvider>();
};
