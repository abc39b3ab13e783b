//! The operations this process submitted (inserts, deletes), remembered by
//! instance name, and what a finished or failed insert means for a get.

use std::collections::HashMap;
use std::sync::Mutex;

use google_cloud_compute_v1::model;
use tracing::debug;

use super::api::Clients;
use super::build::InstanceRef;
use super::{classify, GcpProvider};
use crate::provider::{Instance, InstanceState, Op, ProviderError};

/// An operation this process submitted for an instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct PendingOp {
    pub(super) zone: String,
    pub(super) operation: String,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned map only means another call panicked mid-update of a plain
    // HashMap insert/remove; the map itself is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl GcpProvider {
    pub(super) fn remember(
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
    pub(super) async fn missing(
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
        // The create failed, though get is the call that learned it: as a
        // create it may latch (an image that does not exist), where a
        // failing get of an instance never does.
        Err(ProviderError::new(
            class,
            Op::Create,
            &self.inner.name,
            &id,
            format!("insert operation {} failed: {message}", p.operation),
        ))
    }
}
