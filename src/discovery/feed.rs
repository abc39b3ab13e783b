//! Warm followers (docs/architecture.md, "Warm followers"): every replica
//! that does not lead copies the leader's whole lease table once a second,
//! so that when the leader dies the next one starts with the table as it
//! was a second or so before, instead of an empty one behind a recovery
//! window as long as the longest lease. The leader serves its table at
//! `GET /internal/v1/lease-state` to replicas only (a signed call, as a
//! forward is); a follower asks with the version it holds and gets `304`
//! when nothing changed.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{header, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::{Deserialize, Serialize};
use tracing::{debug, info};

use super::error::ApiError;
use super::forward::Leader;
use super::internal::{sign_forward, Forward, CLIENT_HEADER, FORWARD_HEADER};
use super::state::ApiState;
use crate::lease::Snapshot;

/// The route.
pub const FEED_PATH: &str = "/internal/v1/lease-state";

/// How often a follower asks.
pub const FEED_EVERY: Duration = Duration::from_secs(1);

/// The client name a follower's feed calls are signed for.
const FEED_CLIENT: &str = "replica";

/// A call signed by another replica (set by the auth middleware).
#[derive(Debug, Clone, Copy)]
pub struct Replica;

/// The leader's answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct Fed {
    /// The leader's store version the state is at least as new as.
    pub version: u64,
    /// The whole table.
    pub state: Snapshot,
}

/// The leader's table, to a replica; `304` when the replica's version
/// (`?after=N`) is current. Anyone else meets an unknown route.
pub(super) async fn lease_state(
    State(s): State<ApiState>,
    replica: Option<Extension<Replica>>,
    RawQuery(q): RawQuery,
) -> Response {
    if replica.is_none() {
        return ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route").into_response();
    }
    if (s.forward.leader)() != Leader::Me {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "leader_unavailable",
            "this replica does not lead",
        )
        .into_response();
    }
    let version = s.leases.version();
    let after = q
        .as_deref()
        .and_then(|q| q.strip_prefix("after="))
        .and_then(|v| v.parse::<u64>().ok());
    if after == Some(version) {
        return StatusCode::NOT_MODIFIED.into_response();
    }
    let fed = Fed {
        version,
        state: s.leases.export(),
    };
    match serde_json::to_vec(&fed) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
            .into_response(),
    }
}

/// What a follower asked last: from which leader, at which version.
#[derive(Debug, Default)]
struct Held {
    leader: String,
    version: Option<u64>,
}

/// Copies the leader's table into this replica's store every
/// [`FEED_EVERY`] while another replica leads, until `stop`.
pub async fn follow(s: ApiState, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    let mut held = Held::default();
    let mut tick = tokio::time::interval(FEED_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tick.tick() => {}
        }
        let Leader::At(url) = (s.forward.leader)() else {
            continue;
        };
        if held.leader != url {
            held = Held {
                leader: url.clone(),
                version: None,
            };
        }
        match fetch(&s, &url, held.version).await {
            Ok(None) => {}
            Ok(Some((fed, term))) => match s.leases.replace(&fed.state, term) {
                Ok(true) => {
                    if held.version.is_none() {
                        info!(leader = %url, leases = fed.state.leases.len(), "Copying the leader's lease table");
                    }
                    held.version = Some(fed.version);
                }
                Ok(false) => {}
                Err(e) => debug!(error = %e, "Ignoring an unreadable lease table from the leader"),
            },
            Err(e) => debug!(leader = %url, error = %e, "Cannot copy the leader's lease table"),
        }
    }
}

/// One ask: `None` when the copy is current, else the table and the
/// store's term when it was asked for.
async fn fetch(s: &ApiState, base: &str, after: Option<u64>) -> Result<Option<(Fed, u64)>, String> {
    let key = s.forward.key.as_ref().ok_or("no shared key")?;
    let term = s.leases.term();
    let path = match after {
        Some(v) => format!("{FEED_PATH}?after={v}"),
        None => FEED_PATH.to_string(),
    };
    let f = Forward {
        method: "GET",
        path: &path,
        client: FEED_CLIENT,
        request_key: "",
        deadline_ms: "",
        body: b"",
    };
    let signed = sign_forward(key, &f, chrono::Utc::now().timestamp_millis());
    let req = Request::builder()
        .method("GET")
        .uri(format!("{}{path}", base.trim_end_matches('/')))
        .header(FORWARD_HEADER, signed)
        .header(CLIENT_HEADER, FEED_CLIENT)
        .body(Body::empty())
        .map_err(|e| e.to_string())?;
    let call = async {
        let resp = s
            .forward
            .client
            .request(req)
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        let bytes = axum::body::to_bytes(Body::new(resp.into_body()), FEED_LIMIT)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((status, bytes))
    };
    let (status, bytes) = tokio::time::timeout(FEED_EVERY * 2, call)
        .await
        .map_err(|_| "timed out".to_string())??;
    match status {
        StatusCode::NOT_MODIFIED => Ok(None),
        StatusCode::OK => {
            let fed: Fed = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
            Ok(Some((fed, term)))
        }
        other => Err(format!("answered {other}")),
    }
}

/// The largest table a follower takes: as much as the hand-over Secrets
/// hold.
const FEED_LIMIT: usize = 8 * 1_000_000;
