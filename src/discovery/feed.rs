//! Warm followers (docs/architecture.md, "Warm followers" and "In-sync
//! followers"): every replica that does not lead keeps a copy of the
//! leader's whole lease table, asked for in a long poll: the leader
//! answers as soon as its table changed past the version the follower
//! names, or `304` after [`FEED_HOLD`]. Each ask names the copy the
//! follower holds, which is how the leader learns that a grant is in it
//! (`replicas.rs`). The leader serves its table at
//! `GET /internal/v1/lease-state` to replicas only (a signed call, as a
//! forward is).

use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::{Deserialize, Serialize};
use tracing::{debug, info};

use super::error::ApiError;
use super::state::ApiState;
pub(super) use crate::replica::feed::signed_call;
use crate::replica::feed::{ask_path, follows, Held};
pub use crate::replica::feed::{Fed, Replica, FEED_HOLD, FEED_PATH};
use crate::replica::forward::Leader;
use crate::replica::internal::{answer_checks, header_text, FORWARD_HEADER};

/// How long a follower waits after a failed ask.
const FEED_RETRY: Duration = Duration::from_millis(500);

/// The client name a follower's feed calls are signed for.
const FEED_CLIENT: &str = "replica";

/// A follower's ask: `?replica=ID&feed=F&after=N` (the follower, and the
/// copy it holds).
#[derive(Debug, Default, Deserialize)]
pub(super) struct Ask {
    replica: Option<String>,
    feed: Option<String>,
    after: Option<u64>,
}

/// The leader's table, to a replica, once it is newer than the copy the
/// replica holds (at most [`FEED_HOLD`] later, else `304`). Anyone else
/// meets an unknown route.
pub(super) async fn lease_state(
    State(s): State<ApiState>,
    replica: Option<Extension<Replica>>,
    ask: Result<Query<Ask>, QueryRejection>,
) -> Response {
    if let Err(e) = leader_for_replica(&s, replica.is_some()) {
        return e.into_response();
    }
    // A malformed ask (only a replica's, signed) is a first one.
    let ask = ask.map(|Query(a)| a).unwrap_or_default();
    let feed = s.replicas.feed();
    // Only a manager replica is counted among the followers in sync.
    let gateway = replica.is_some_and(|Extension(r)| r.gateway);
    if let (Some(who), false) = (&ask.replica, gateway) {
        s.replicas.saw(who, ask.feed.as_deref(), ask.after);
    }
    let current = ask.feed.as_deref() == Some(feed.as_str());
    if let (true, Some(after)) = (current, ask.after) {
        if !s.leases.changed_since(after, FEED_HOLD).await {
            return StatusCode::NOT_MODIFIED.into_response();
        }
    }
    // A copy the change log still covers is sent what changed; any other,
    // the whole table.
    let delta = ask
        .after
        .filter(|_| current)
        .and_then(|after| {
            let since_ms = s.leases.changed_at(after);
            Some((after, since_ms, s.leases.export_since(after)?))
        });
    let body = match delta {
        Some((after, since_ms, (version, state))) => {
            s.metrics.feed_answer("delta");
            let fed = Fed {
                feed,
                after: Some(after),
                state,
                version,
                since_ms,
            };
            fed.encode()
        }
        None => {
            s.metrics.feed_answer("whole");
            // Written straight from the store, one table at a time: at
            // the caps its bytes are 16.6 MB (`lease::caps_tests`), and
            // members joining at once must not hold one each.
            let _one = WHOLE.acquire().await.ok();
            Fed::encode_whole(&s.leases, &feed).1
        }
    };
    ([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response()
}

/// Whole tables being answered: one at a time in this process.
static WHOLE: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// `value` as a JSON answer to another replica.
pub(super) fn json_answer(value: &impl Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
            .into_response(),
    }
}

/// Keeps this replica's store a copy of the leader's table while another
/// replica leads, until `stop`.
pub async fn follow(s: ApiState, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    let mut held = Held::default();
    loop {
        let pause = match (s.forward.leader)() {
            Leader::At(url) => {
                if held.leader != url {
                    held = Held {
                        leader: url.clone(),
                        ..Held::default()
                    };
                }
                let ask = fetch(&s, &url, &held);
                let got = tokio::select! {
                    _ = &mut stop => return,
                    got = ask => got,
                };
                match got {
                    Ok(None) => {
                        s.replicas.copy().answered(std::time::Instant::now());
                        None
                    }
                    Ok(Some((fed, term))) => {
                        if take(&s, &mut held, fed, term) {
                            s.replicas.copy().answered(std::time::Instant::now());
                        }
                        None
                    }
                    Err(e) => {
                        debug!(leader = %url, error = %e, "Cannot copy the leader's lease table");
                        Some(FEED_RETRY)
                    }
                }
            }
            Leader::Me => {
                s.replicas.copy().leading();
                Some(FEED_RETRY)
            }
            // Nobody to ask yet: the copy ages.
            _ => Some(FEED_RETRY),
        };
        if let Some(pause) = pause {
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
}

/// Makes `fed` this replica's copy (a whole table), or takes it into the
/// copy (a delta that follows the copy held), unless this replica took
/// over since asking. A delta that does not follow the copy is dropped,
/// and so is the copy's version: the next ask gets the whole table.
fn take(s: &ApiState, held: &mut Held, fed: Fed, term: u64) -> bool {
    let taken = match fed.after {
        Some(after) if follows(held, &fed.feed, after) => {
            s.leases.patch(&fed.state, term, &fed.feed)
        }
        Some(_) => Ok(false),
        None => s.leases.replace(&fed.state, term, &fed.feed),
    };
    match taken {
        Ok(true) => {
            if let (Some(after), Some(since)) = (fed.after, fed.since_ms) {
                let lag = crate::lease::unix_ms().saturating_sub(since);
                s.metrics
                    .copy_delta(lag as f64 / 1000.0, fed.version.saturating_sub(after));
            }
            if held.feed.as_deref() != Some(fed.feed.as_str()) {
                info!(leader = %held.leader, leases = fed.state.leases.len(), "Copying the leader's lease table");
            }
            held.version = Some(fed.version);
            held.feed = Some(fed.feed);
            true
        }
        Ok(false) => {
            held.version = None;
            false
        }
        Err(e) => {
            held.version = None;
            debug!(error = %e, "Ignoring an unreadable lease table from the leader");
            false
        }
    }
}

/// One ask: `None` when the copy is current, else the table and the
/// store's term when it was asked for.
async fn fetch(s: &ApiState, base: &str, held: &Held) -> Result<Option<(Fed, u64)>, String> {
    let term = s.leases.term();
    let path = ask_path(s.replicas.me(), s.observer, held);
    let Some(bytes) = ask_leader_bytes(s, base, &path, s.leases.state_limit()).await? else {
        return Ok(None);
    };
    Ok(Some((Fed::decode(&bytes)?, term)))
}

/// A signed `GET path` of the leader at `base`, held up to [`FEED_HOLD`]:
/// `None` for `304`, else the JSON answer (at most `limit` bytes).
pub(super) async fn ask_leader<T: serde::de::DeserializeOwned>(
    s: &ApiState,
    base: &str,
    path: &str,
    limit: usize,
) -> Result<Option<T>, String> {
    match ask_leader_bytes(s, base, path, limit).await? {
        Some(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| e.to_string()),
        None => Ok(None),
    }
}

/// [`ask_leader`]'s answer as the bytes sent.
pub(super) async fn ask_leader_bytes(
    s: &ApiState,
    base: &str,
    path: &str,
    limit: usize,
) -> Result<Option<axum::body::Bytes>, String> {
    let key = s.forward.key.as_ref().ok_or("no shared key")?;
    let req = signed_call(key, ("GET", base, path), FEED_CLIENT, Vec::new())?;
    let ask = header_text(req.headers(), FORWARD_HEADER).to_string();
    let call = async {
        let resp = s
            .forward
            .client
            .request(req)
            .await
            .map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        let bytes = axum::body::to_bytes(Body::new(body), limit)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((parts, bytes))
    };
    let (parts, bytes) = tokio::time::timeout(FEED_HOLD + Duration::from_secs(2), call)
        .await
        .map_err(|_| "timed out".to_string())??;
    let status = parts.status;
    if !answer_checks(key, &ask, (status.as_u16(), &parts.headers, &bytes)) {
        return Err(format!(
            "answered {status} without the leader's seal for this call; not taken"
        ));
    }
    match status {
        StatusCode::NOT_MODIFIED => Ok(None),
        StatusCode::OK => Ok(Some(bytes)),
        other => Err(format!("answered {other}")),
    }
}

/// A replica-only route's first check: anyone but a replica meets an
/// unknown route, and only the leader answers.
pub(super) fn leader_for_replica(s: &ApiState, replica: bool) -> Result<(), ApiError> {
    if !replica {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such route",
        ));
    }
    if (s.forward.leader)() != Leader::Me {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "leader_unavailable",
            "this replica does not lead",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_observer_asks_without_naming_a_replica() {
        let none = Held::default();
        let held = Held {
            leader: "http://l".into(),
            feed: Some("f1".into()),
            version: Some(7),
        };
        let cases = [
            (false, &none, "/internal/v1/lease-state?replica=r1"),
            (
                false,
                &held,
                "/internal/v1/lease-state?replica=r1&feed=f1&after=7",
            ),
            (true, &none, "/internal/v1/lease-state"),
            (true, &held, "/internal/v1/lease-state?feed=f1&after=7"),
        ];
        for (observer, held, want) in cases {
            assert_eq!(ask_path("r1", observer, held), want, "observer {observer}");
        }
    }
}
