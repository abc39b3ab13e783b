//! Cooldowns from outside a lease (the gateway's site bans and session
//! reports) kept in the leader's table. A replica that does not lead puts
//! one in its own copy at once, for its own next choices, and sends it to
//! the leader: every replica copies the leader's table, so every gateway
//! replica sees it, moves a session the same way, and the cooldown
//! outlives the next copy (docs/architecture.md, "The gateway").

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::error::ApiError;
use super::feed::{signed_call, Replica};
use super::forward::Leader;
use super::state::{ApiState, Client};
use crate::lease::ProxyKey;

/// The leader's route (replicas only, a signed call).
pub const COOLDOWNS_PATH: &str = "/internal/v1/cooldowns";

/// One cooldown, for the client the call is signed for.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Cooldown {
    namespace: String,
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    site: Option<String>,
}

/// The leader puts a cooldown another replica sends into its table.
/// Anyone but a replica meets an unknown route.
pub(super) async fn take(
    State(s): State<ApiState>,
    replica: Option<Extension<Replica>>,
    client: Option<Extension<Client>>,
    body: Bytes,
) -> Response {
    let (Some(_), Some(Extension(client))) = (replica, client) else {
        return ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route").into_response();
    };
    if (s.forward.leader)() != Leader::Me {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "leader_unavailable",
            "this replica does not lead",
        )
        .into_response();
    }
    let c: Cooldown = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => {
            return ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", e.to_string())
                .into_response()
        }
    };
    let proxy = ProxyKey {
        namespace: c.namespace,
        name: c.name,
    };
    s.leases.cool_down(&proxy, &client.0, c.site.as_deref());
    StatusCode::NO_CONTENT.into_response()
}

impl ApiState {
    /// `proxy` was banned by `site` (or failed `client` everywhere): the
    /// cooldown a lease report gives, here at once and, when another
    /// replica leads, in the leader's table too. A leader that cannot be
    /// reached leaves it in this copy only, until the next copy.
    pub async fn cool_down(&self, proxy: &ProxyKey, client: &Arc<str>, site: Option<&str>) {
        self.leases.cool_down(proxy, client, site);
        self.cool_down_at_leader(proxy, client, site).await;
    }

    /// The leader's half of [`ApiState::cool_down`]: nothing when this
    /// replica leads or no leader is known.
    pub async fn cool_down_at_leader(
        &self,
        proxy: &ProxyKey,
        client: &Arc<str>,
        site: Option<&str>,
    ) {
        let (Leader::At(base), Some(key)) = ((self.forward.leader)(), &self.forward.key) else {
            return;
        };
        let body = Cooldown {
            namespace: proxy.namespace.clone(),
            name: proxy.name.clone(),
            site: site.map(str::to_string),
        };
        let sent = async {
            let body = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
            let req = signed_call(key, ("POST", &base, COOLDOWNS_PATH), client, body)?;
            let call = self.forward.client.request(req);
            let resp = tokio::time::timeout(super::FORWARD_TIMEOUT, call)
                .await
                .map_err(|_| "timed out".to_string())?
                .map_err(|e| crate::provider::error::plain_message(&e))?;
            match resp.status() {
                StatusCode::NO_CONTENT => Ok(()),
                other => {
                    let _ = axum::body::to_bytes(Body::new(resp.into_body()), 4096).await;
                    Err(format!("answered {other}"))
                }
            }
        };
        if let Err(e) = sent.await {
            warn!(leader = %base, proxy = %proxy, error = %e, "Cannot send a cooldown to the leader; it holds on this replica until its next copy of the lease table");
        }
    }
}
