//! The leader's side of warm followers (docs/architecture.md, "Warm
//! followers" and "In-sync followers"): it serves its table at
//! `GET /internal/v1/lease-state` to replicas only (a signed call, as a
//! forward is), answering a long poll as soon as its table changed past
//! the version the member names, or `304` after [`FEED_HOLD`]. Each ask
//! names the copy the member holds, which is how the leader learns that
//! a grant is in it (`replica::members`). The member's loop is
//! `replica::copy`.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::state::ApiState;
pub use crate::replica::feed::{Fed, Replica, FEED_HOLD, FEED_PATH};
use crate::replica::forward::Leader;

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
    let delta = ask.after.filter(|_| current).and_then(|after| {
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
    use crate::replica::feed::{ask_path, Held};

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
