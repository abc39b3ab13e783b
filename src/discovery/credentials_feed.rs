//! The leader's side of the upstreams' credentials handed to gateway
//! processes (docs/architecture.md, "Credentials for the gateway"): the
//! route answering a gateway's signed ask with the usable credentials,
//! unless the copy it names is current. The gateway's loop is
//! `replica::credentials_copy`.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;

use super::error::ApiError;
use super::feed::Replica;
use super::state::ApiState;
pub use crate::replica::credentials_copy::{follow_credentials, Handed, CREDENTIALS_PATH};

/// A gateway's ask: `?feed=F&after=N` (the copy it holds).
#[derive(Debug, Default, Deserialize)]
pub(super) struct Ask {
    feed: Option<String>,
    after: Option<u64>,
}

/// The leader's usable credentials, to a replica, unless the copy it names
/// is current (`304`). Before the leader's own watch listed, `503`: an
/// empty copy would take every upstream from the gateways.
pub(super) async fn upstream_credentials(
    State(s): State<ApiState>,
    replica: Option<Extension<Replica>>,
    ask: Result<Query<Ask>, QueryRejection>,
) -> Response {
    if let Err(e) = super::feed::leader_for_replica(&s, replica.is_some()) {
        return e.into_response();
    }
    let ask = ask.map(|Query(a)| a).unwrap_or_default();
    let feed = s.replicas.feed();
    // Read before the entries: the copy is at least this new.
    let version = s.credentials.version();
    if ask.feed.as_deref() == Some(feed.as_str()) && ask.after == Some(version) {
        return StatusCode::NOT_MODIFIED.into_response();
    }
    if !s.credentials.synced() {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_synced",
            "the leader has not listed the credentials Secrets yet",
        )
        .into_response();
    }
    let handed = Handed {
        feed,
        version,
        secrets: s.credentials.entries(),
    };
    super::feed::json_answer(&handed)
}
