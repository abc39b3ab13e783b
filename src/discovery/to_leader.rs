//! The leader's routes for what a gateway replica tells it (cooldowns,
//! failed upstreams; docs/architecture.md, "The gateway"), and this
//! API's state as the sending side (`replica::to_leader`'s [`Teller`]):
//! its drops counted in the API's metrics, a failed upstream heard by
//! this process's health engine while no other replica leads.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;

use super::error::ApiError;
use super::feed::Replica;
use super::state::{ApiState, Client};
use crate::lease::ProxyKey;
use crate::replica::to_leader::{Teller, Told};

/// What the leader was told, once it checked the call: from a replica,
/// to the leader, a readable body.
fn told(s: &ApiState, replica: Option<Extension<Replica>>, body: &Bytes) -> Result<Told, ApiError> {
    super::feed::leader_for_replica(s, replica.is_some())?;
    serde_json::from_slice(body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", e.to_string()))
}

/// The leader puts a cooldown another replica sends into its table, for
/// the client the call is signed for. Anyone but a replica meets an
/// unknown route.
pub(super) async fn take_cooldown(
    State(s): State<ApiState>,
    replica: Option<Extension<Replica>>,
    client: Option<Extension<Client>>,
    body: Bytes,
) -> Response {
    let t = match told(&s, replica, &body) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let Some(Extension(client)) = client else {
        return ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route").into_response();
    };
    let (proxy, site) = t.key();
    s.leases.cool_down(&proxy, &client.0, site.as_deref());
    StatusCode::NO_CONTENT.into_response()
}

/// The leader's health engine hears of an upstream another replica's
/// gateway saw fail.
pub(super) async fn take_failed(
    State(s): State<ApiState>,
    replica: Option<Extension<Replica>>,
    body: Bytes,
) -> Response {
    match told(&s, replica, &body) {
        Ok(t) => {
            let (proxy, _) = t.key();
            hint_failed(s.hints.as_ref(), &proxy);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// `proxy` failed a connection: `hints`' engine, when this process runs
/// one, probes it at once.
fn hint_failed(hints: Option<&crate::health::Hints>, proxy: &ProxyKey) {
    if let Some(h) = hints {
        h.failed(&proxy.namespace, &proxy.name);
    }
}

impl ApiState {
    /// What tells the leader from this process (`replica::to_leader`),
    /// counting the messages its full queue drops in this API's metrics.
    pub(super) fn teller(&self) -> Teller {
        let metrics = self.metrics.clone();
        let hints = self.hints.clone();
        Teller {
            leases: self.leases.clone(),
            forward: self.forward.clone(),
            outbox: self.outbox.clone(),
            on_dropped: Arc::new(move || metrics.told_dropped()),
            on_failed_here: Arc::new(move |proxy| hint_failed(hints.as_ref(), proxy)),
        }
    }

    /// [`Teller::cool_down`] from this process: a session report's.
    pub(super) async fn cool_down(&self, proxy: &ProxyKey, client: &Arc<str>, site: Option<&str>) {
        self.teller().cool_down(proxy, client, site).await;
    }
}
