//! What a gateway replica tells the leader (docs/architecture.md, "The
//! gateway"): cooldowns from outside a lease (its site bans, session
//! reports) and upstreams that failed a connection. A replica that does
//! not lead applies a cooldown to its own copy of the lease table at once,
//! for its own next choices, and sends it to the leader: every replica
//! copies the leader's table, so every gateway replica sees it, moves a
//! session the same way, and the cooldown outlives the next copy. A
//! failed upstream goes to the leader's health engine, which probes it at
//! once (only the leader probes). Both are calls only replicas may make,
//! signed with the shared lease key.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use super::error::ApiError;
use super::feed::{signed_call, Replica};
use super::state::{ApiState, Client};
use crate::lease::ProxyKey;
use crate::replica::forward::Leader;
use crate::replica::outbox::{Queued, Tell, MAX_WAITING};

/// The leader's route for cooldowns.
pub const COOLDOWNS_PATH: &str = "/internal/v1/cooldowns";

/// The leader's route for upstreams that failed a connection.
pub const FAILED_PATH: &str = "/internal/v1/failed";

/// One proxy, and for a cooldown the site (none: the client everywhere).
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Told {
    namespace: String,
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    site: Option<String>,
}

impl Told {
    fn key(self) -> (ProxyKey, Option<String>) {
        let key = ProxyKey {
            namespace: self.namespace,
            name: self.name,
        };
        (key, self.site)
    }
}

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
            s.hint_failed(&proxy);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// Delivers what this process's gateway queued for the leader
/// (`outbox.rs`), one message at a time, until `stop`.
pub async fn deliver(s: ApiState, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    loop {
        let t = tokio::select! {
            _ = &mut stop => return,
            t = s.outbox.next() => t,
        };
        let sent = async {
            match t {
                Tell::Cooldown {
                    proxy,
                    client,
                    site,
                } => {
                    s.cool_down_at_leader(&proxy, &client, site.as_deref())
                        .await
                }
                Tell::Failed(proxy) => s.upstream_failed(&proxy).await,
            }
        };
        tokio::select! {
            _ = &mut stop => return,
            _ = sent => {}
        }
    }
}

impl ApiState {
    /// Queues `t` for the leader (a gateway's cooldown or failed
    /// upstream), without waiting; the queue is bounded (`outbox.rs`).
    pub fn tell(&self, t: Tell) {
        if self.outbox.push(t) == Queued::Dropped {
            self.metrics.told_dropped();
            debug!(
                waiting = MAX_WAITING,
                "The queue to the leader is full; a message stays on this replica"
            );
        }
    }

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
        let t = Told {
            namespace: proxy.namespace.clone(),
            name: proxy.name.clone(),
            site: site.map(str::to_string),
        };
        if let Some(Err((base, e))) = self.tell_leader(COOLDOWNS_PATH, client, &t).await {
            warn!(leader = %base, proxy = %proxy, error = %e, "Cannot send a cooldown to the leader; it holds on this replica until its next copy of the lease table");
        }
    }

    /// `proxy` failed a connection through this replica's gateway: the
    /// health engine of the leader (this replica's own, when it leads)
    /// probes it at once.
    pub async fn upstream_failed(&self, proxy: &ProxyKey) {
        let t = Told {
            namespace: proxy.namespace.clone(),
            name: proxy.name.clone(),
            site: None,
        };
        match self
            .tell_leader(FAILED_PATH, super::state::ANONYMOUS, &t)
            .await
        {
            None => self.hint_failed(proxy),
            Some(Ok(())) => {}
            Some(Err((base, e))) => {
                warn!(leader = %base, proxy = %proxy, error = %e, "Cannot tell the leader of a failed upstream; its probes will find it")
            }
        }
    }

    fn hint_failed(&self, proxy: &ProxyKey) {
        if let Some(h) = &self.hints {
            h.failed(&proxy.namespace, &proxy.name);
        }
    }

    /// Sends `t` to the leader's `path`, signed for `client`: `None` when
    /// no other replica is known to lead (this one may), else how it went.
    async fn tell_leader(
        &self,
        path: &str,
        client: &str,
        t: &Told,
    ) -> Option<Result<(), (String, String)>> {
        let (Leader::At(base), Some(key)) = ((self.forward.leader)(), &self.forward.key) else {
            return None;
        };
        let sent = async {
            let body = serde_json::to_vec(t).map_err(|e| e.to_string())?;
            let req = signed_call(key, ("POST", &base, path), client, body)?;
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
        Some(sent.await.map_err(|e| (base.clone(), e)))
    }
}
