//! The upstreams' credentials, handed from the leader to gateway
//! processes (docs/architecture.md, "Credentials for the gateway"). A
//! gateway's ServiceAccount reads no Secret outside its own namespace, so
//! it cannot watch the credentials Secrets as the manager does; it asks
//! the leader for the usable ones instead, in a call signed with the
//! shared key that only replicas can make, once a second, and the leader
//! sends them only when its credentials cache changed since the copy the
//! gateway names. The gateway keeps its last copy while no leader
//! answers.

use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::{Deserialize, Serialize};
use tracing::{debug, info};

use super::error::ApiError;
use super::feed::Replica;
use super::state::ApiState;
use crate::credentials::cache::Entry;
use crate::replica::copy::ask_leader;
use crate::replica::forward::Leader;

/// The route.
pub const CREDENTIALS_PATH: &str = "/internal/v1/upstream-credentials";

/// How often a gateway asks: a new Proxy's credentials are written before
/// its instance is created, far longer than this before it can be Ready.
const ASK_EVERY: Duration = Duration::from_secs(1);

/// The largest copy a gateway takes (about 60,000 Secrets).
const CREDENTIALS_LIMIT: usize = 8 * 1_000_000;

/// The leader's answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct Handed {
    /// The leader's feed (its process and term): versions count in it.
    pub feed: String,
    /// The leader's credentials cache version this copy is of.
    pub version: u64,
    /// Every usable credentials Secret.
    pub secrets: Vec<Entry>,
}

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

/// The copy a gateway holds: from which leader, feed and version.
#[derive(Debug, Default, PartialEq)]
struct Held {
    leader: String,
    feed: Option<String>,
    version: Option<u64>,
}

/// The ask for the copy `held`.
fn ask_path(held: &Held) -> String {
    match (&held.feed, held.version) {
        (Some(feed), Some(v)) => format!("{CREDENTIALS_PATH}?feed={feed}&after={v}"),
        _ => CREDENTIALS_PATH.to_string(),
    }
}

/// Keeps a gateway process's credentials a copy of the leader's, until
/// `stop`. Anything but a gateway (an observer) watches the Secrets
/// itself and returns at once.
pub async fn follow_credentials(s: ApiState, stop: impl std::future::Future<Output = ()>) {
    if !s.observer {
        return;
    }
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
                let path = ask_path(&held);
                let got = tokio::select! {
                    _ = &mut stop => return,
                    got = ask_leader::<Handed>(&s.forward, &url, &path, CREDENTIALS_LIMIT) => got,
                };
                match got {
                    Ok(None) => ASK_EVERY,
                    Ok(Some(h)) => {
                        if held.feed.is_none() {
                            info!(leader = %url, secrets = h.secrets.len(), "Copying the leader's upstream credentials");
                        }
                        s.credentials.take_fed(h.secrets);
                        held.feed = Some(h.feed);
                        held.version = Some(h.version);
                        ASK_EVERY
                    }
                    Err(e) => {
                        debug!(leader = %url, error = %e, "Cannot copy the leader's upstream credentials");
                        ASK_EVERY / 2
                    }
                }
            }
            // Leading (a gateway never does), or nobody to ask yet.
            _ => ASK_EVERY / 2,
        };
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gateway_names_the_copy_it_holds() {
        let held = Held {
            leader: "http://l".into(),
            feed: Some("f1".into()),
            version: Some(7),
        };
        assert_eq!(ask_path(&Held::default()), CREDENTIALS_PATH);
        assert_eq!(
            ask_path(&held),
            "/internal/v1/upstream-credentials?feed=f1&after=7"
        );
    }
}
