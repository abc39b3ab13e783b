//! The edge of the Compute API: the SDK clients, one wrapper per call with
//! the TRACE wire log, and the one place a failed call is classified.

use std::time::Instant;

use google_cloud_compute_v1::client::{Firewalls, Instances, ZoneOperations};
use google_cloud_compute_v1::model;
use google_cloud_gax::retry_policy::{Aip194Strict, RetryPolicyExt};
use tracing::{debug, trace};

use super::build::InstanceRef;
use super::operations::PendingOp;
use super::{classify, wire, GcpProvider};
use crate::provider::{ErrorClass, Op, ProviderError};

/// The SDK clients, built on first use (construction never dials).
pub(super) struct Clients {
    pub(super) instances: Instances,
    pub(super) operations: ZoneOperations,
    pub(super) firewalls: Firewalls,
}

/// Why a client could not be built (credentials, endpoint).
#[derive(Debug, thiserror::Error)]
#[error("building the Compute client: {0}")]
pub struct ClientBuildError(String);

impl GcpProvider {
    pub(super) async fn clients(&self) -> Result<&Clients, ClientBuildError> {
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
                // The Google client takes rustls's process-wide provider;
                // main installs it, this may run first (tests, tools).
                crate::tls::install_ring();
                let mut ib = Instances::builder().with_retry_policy(policy());
                let mut ob = ZoneOperations::builder().with_retry_policy(policy());
                let mut fb = Firewalls::builder().with_retry_policy(policy());
                if let Some(ep) = &cfg.endpoint {
                    ib = ib.with_endpoint(ep.clone());
                    ob = ob.with_endpoint(ep.clone());
                    fb = fb.with_endpoint(ep.clone());
                }
                if cfg.anonymous {
                    let c = google_cloud_auth::credentials::anonymous::Builder::new().build();
                    ib = ib.with_credentials(c.clone());
                    ob = ob.with_credentials(c.clone());
                    fb = fb.with_credentials(c);
                }
                let firewalls = fb
                    .build()
                    .await
                    .map_err(|e| ClientBuildError(e.to_string()))?;
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
                    firewalls,
                })
            })
            .await
    }

    /// Wraps a failed call after the raw-error log line.
    pub(super) fn fail(
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

    pub(super) fn permanent(&self, op: Op, id: &str, message: impl Into<String>) -> ProviderError {
        ProviderError::new(ErrorClass::Permanent, op, &self.inner.name, id, message)
    }

    pub(super) fn wire_request<T: serde::Serialize>(
        &self,
        call: &str,
        target: &str,
        body: Option<&T>,
    ) {
        if tracing::enabled!(target: wire::TARGET, tracing::Level::TRACE) {
            let body = body
                .map(|b| wire::render(b, self.full()))
                .unwrap_or_default();
            trace!(target: wire::TARGET, provider = %self.inner.name, call, target, body = %body, "api request");
        }
    }

    pub(super) fn wire_response<T: serde::Serialize>(
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

    pub(super) async fn api_get(
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

    pub(super) async fn api_operation(
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
}
