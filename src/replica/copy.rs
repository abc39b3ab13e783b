//! A member's copy of the leader's lease table (docs/architecture.md,
//! "Warm followers" and "The change log"): every replica that does not
//! lead, and every gateway process, asks the leader in a long poll naming
//! the copy it holds, and takes the answer in (a delta that follows the
//! copy, or the whole table). Each ask is how the leader learns that a
//! grant is in a follower's copy (`members.rs`). Also the signed asks to
//! the leader that other copies (the upstream credentials) share.
//!
//! This works on the store, the forwarder and the members, never on the
//! discovery API's state: the route that answers is `discovery::feed`'s.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use tracing::{debug, info};

use super::feed::{ask_path, follows, signed_call, Fed, Held, FEED_HOLD};
use super::forward::{Forwarder, Leader};
use super::internal::{answer_checks, header_text, FORWARD_HEADER};
use super::members::Replicas;
use crate::lease::LeaseStore;

/// How long a member waits after a failed ask.
const FEED_RETRY: Duration = Duration::from_millis(500);

/// The client name a member's feed calls are signed for.
const FEED_CLIENT: &str = "replica";

/// What keeps a copy: the store it is kept in, the way to the leader,
/// the members (this one's name and its copy's age) and how a delta
/// taken is counted.
#[derive(Clone)]
pub struct Copier {
    pub leases: Arc<LeaseStore>,
    pub forward: Arc<Forwarder>,
    pub replicas: Arc<Replicas>,
    /// A process that can never lead (the gateway): it asks without
    /// naming itself, so grants never wait for it.
    pub observer: bool,
    /// Called for each delta taken: how old its oldest change was
    /// (seconds) and how many changes it carried.
    pub on_delta: Arc<dyn Fn(f64, u64) + Send + Sync>,
}

/// Keeps `c`'s store a copy of the leader's table while another replica
/// leads, until `stop`.
pub async fn follow(c: Copier, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    let mut held = Held::default();
    loop {
        let pause = match (c.forward.leader)() {
            Leader::At(url) => {
                if held.leader != url {
                    held = Held {
                        leader: url.clone(),
                        ..Held::default()
                    };
                }
                let ask = fetch(&c, &url, &held);
                let got = tokio::select! {
                    _ = &mut stop => return,
                    got = ask => got,
                };
                match got {
                    Ok(None) => {
                        c.replicas.copy().answered(std::time::Instant::now());
                        None
                    }
                    Ok(Some((fed, term))) => {
                        if take(&c, &mut held, fed, term) {
                            c.replicas.copy().answered(std::time::Instant::now());
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
                c.replicas.copy().leading();
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

/// Makes `fed` the copy (a whole table), or takes it into the copy (a
/// delta that follows the copy held), unless this replica took over
/// since asking. A delta that does not follow the copy is dropped, and so
/// is the copy's version: the next ask gets the whole table.
fn take(c: &Copier, held: &mut Held, fed: Fed, term: u64) -> bool {
    let taken = match fed.after {
        Some(after) if follows(held, &fed.feed, after) => {
            c.leases.patch(&fed.state, term, &fed.feed)
        }
        Some(_) => Ok(false),
        None => c.leases.replace(&fed.state, term, &fed.feed),
    };
    match taken {
        Ok(true) => {
            if let (Some(after), Some(since)) = (fed.after, fed.since_ms) {
                let lag = crate::lease::unix_ms().saturating_sub(since);
                (c.on_delta)(lag as f64 / 1000.0, fed.version.saturating_sub(after));
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
async fn fetch(c: &Copier, base: &str, held: &Held) -> Result<Option<(Fed, u64)>, String> {
    let term = c.leases.term();
    let path = ask_path(c.replicas.me(), c.observer, held);
    let limit = c.leases.state_limit();
    let Some(bytes) = ask_leader_bytes(&c.forward, base, &path, limit).await? else {
        return Ok(None);
    };
    Ok(Some((Fed::decode(&bytes)?, term)))
}

/// A signed `GET path` of the leader at `base`, held up to [`FEED_HOLD`]:
/// `None` for `304`, else the JSON answer (at most `limit` bytes).
pub async fn ask_leader<T: serde::de::DeserializeOwned>(
    forward: &Forwarder,
    base: &str,
    path: &str,
    limit: usize,
) -> Result<Option<T>, String> {
    match ask_leader_bytes(forward, base, path, limit).await? {
        Some(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| e.to_string()),
        None => Ok(None),
    }
}

/// [`ask_leader`]'s answer as the bytes sent.
pub async fn ask_leader_bytes(
    forward: &Forwarder,
    base: &str,
    path: &str,
    limit: usize,
) -> Result<Option<axum::body::Bytes>, String> {
    let key = forward.key.as_ref().ok_or("no shared key")?;
    let req = signed_call(key, ("GET", base, path), FEED_CLIENT, Vec::new())?;
    let ask = header_text(req.headers(), FORWARD_HEADER).to_string();
    let call = async {
        let resp = forward
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
