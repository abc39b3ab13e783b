//! The lease table's feed between replicas, its protocol half: the route,
//! the ask naming the copy a follower holds, the leader's answer, and
//! the signed call every replica-only ask is (docs/architecture.md,
//! "Warm followers" and "The change log"). The member's loop is
//! `copy.rs`; the route that answers, through the discovery API's
//! state, is `discovery::feed`'s.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request};
use serde::{Deserialize, Serialize};

use super::internal::{sign_forward, Forward, CLIENT_HEADER, FORWARD_HEADER};
use crate::lease::{wire, LeaseStore, Snapshot};

/// The route.
pub const FEED_PATH: &str = "/internal/v1/lease-state";

/// How long the leader holds an ask when nothing changed.
pub const FEED_HOLD: Duration = Duration::from_secs(1);

/// A call signed by another replica (set by the auth middleware): a
/// manager's, with the lease key, or a gateway process's, with the
/// gateway key.
#[derive(Debug, Clone, Copy)]
pub struct Replica {
    /// Signed with the gateway key: never counted among the followers
    /// grants wait for.
    pub gateway: bool,
}

/// The leader's answer. The fields are in the order they are written:
/// the table before the version, which is read with it
/// ([`Fed::encode_whole`]).
#[derive(Debug, Serialize, Deserialize)]
pub struct Fed {
    /// The leader's feed (its process and term): versions count in it.
    pub feed: String,
    /// Set when `state` is a delta: the version it follows, which is the
    /// one the ask named (`LeaseStore::export_since`).
    pub after: Option<u64>,
    /// The whole table, or with `after` only what changed since.
    pub state: Snapshot,
    /// The leader's store version the state is at least as new as.
    pub version: u64,
    /// With a delta: when the oldest change in it was made, by the
    /// leader's clock (Unix ms); how far behind the member's copy was.
    pub since_ms: Option<u64>,
}

/// What starts an encoded [`Fed`].
const FED_MARK: &[u8; 4] = b"EPF\x02";

impl Fed {
    /// As the feed answers it: a mark, then postcard (`lease::wire`).
    pub fn encode(&self) -> Vec<u8> {
        // Fails only for a length past a varint, which no usize is.
        postcard::to_extend(self, FED_MARK.to_vec()).unwrap_or_else(|_| FED_MARK.to_vec())
    }

    /// A whole table of `store` from `feed`, as [`Fed::encode`] writes
    /// it, straight from the store (`lease::wire::export_body`: no copy
    /// of the table but its bytes); with its version.
    pub fn encode_whole(store: &LeaseStore, feed: &str) -> (u64, Vec<u8>) {
        let mut head = FED_MARK.to_vec();
        wire::put(&mut head, &feed);
        wire::put(&mut head, &None::<u64>);
        let (exported, mut out) = store.export_body(head);
        wire::put(&mut out, &exported.version);
        wire::put(&mut out, &None::<u64>);
        (exported.version, out)
    }

    /// An answer of [`Fed::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Fed, String> {
        let rest = bytes
            .strip_prefix(FED_MARK.as_slice())
            .ok_or("not a lease table of this format")?;
        postcard::from_bytes(rest).map_err(|e| e.to_string())
    }
}

/// The copy a follower holds: from which leader and feed, at which version.
#[derive(Debug, Default)]
pub(crate) struct Held {
    pub(crate) leader: String,
    pub(crate) feed: Option<String>,
    pub(crate) version: Option<u64>,
}

/// Whether a delta of `feed` after version `after` follows the copy held.
pub(crate) fn follows(held: &Held, feed: &str, after: u64) -> bool {
    held.feed.as_deref() == Some(feed) && held.version == Some(after)
}

/// The ask for the copy `held`; an observer names no replica, so the
/// leader never counts it among the followers grants wait for.
pub(crate) fn ask_path(me: &str, observer: bool, held: &Held) -> String {
    let mut query = Vec::new();
    if !observer {
        query.push(format!("replica={me}"));
    }
    if let (Some(feed), Some(v)) = (&held.feed, held.version) {
        query.push(format!("feed={feed}&after={v}"));
    }
    match query.is_empty() {
        true => FEED_PATH.to_string(),
        false => format!("{FEED_PATH}?{}", query.join("&")),
    }
}

/// A call from one replica to the leader at `base`, signed with the shared
/// `key` for `client` (no request key or deadline: it grants nothing).
pub(crate) fn signed_call(
    key: &crate::lease::LeaseKey,
    (method, base, path): (&str, &str, &str),
    client: &str,
    body: Vec<u8>,
) -> Result<Request<Body>, String> {
    let f = Forward {
        method,
        path,
        client,
        request_key: "",
        deadline_ms: "",
        body: &body,
    };
    let signed = sign_forward(key, &f, chrono::Utc::now().timestamp_millis());
    Request::builder()
        .method(method)
        .uri(format!("{}{path}", base.trim_end_matches('/')))
        .header(FORWARD_HEADER, signed)
        .header(CLIENT_HEADER, client)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::lease::{AcquireRequest, FakeClock, LeaseConfig, ProxyKey};

    #[test]
    fn a_whole_table_written_from_the_store_reads_as_the_answer_of_its_export() {
        let clock = FakeClock::at(chrono::Utc::now());
        let cfg = LeaseConfig {
            max_leases_per_proxy: 2,
            default_ttl: Duration::from_secs(60),
            max_ttl: Duration::from_secs(600),
            cooldown: Duration::from_secs(120),
        };
        let store = LeaseStore::with(cfg, Arc::new(clock.clone()));
        let p = ProxyKey {
            namespace: "crawl".into(),
            name: "a".into(),
        };
        for sticky in [Some("s-1".to_string()), None] {
            let req = AcquireRequest {
                ttl: Duration::from_secs(60),
                client: "team-x".into(),
                sticky_key: sticky,
                site: None,
            };
            store.acquire(std::slice::from_ref(&p), &req).unwrap();
        }
        store.cool_down(&p, &Arc::from("team-y"), Some("shop.example"));
        clock.advance(Duration::from_millis(1500));
        let (version, whole) = Fed::encode_whole(&store, "f1");
        let fed = Fed::decode(&whole).unwrap();
        assert_eq!(
            (fed.version, fed.feed.as_str(), fed.after),
            (version, "f1", None)
        );
        assert_eq!(fed.state, store.export());
        assert_eq!(fed.state.leases.len(), 2);
        let value = Fed {
            feed: "f1".into(),
            after: None,
            state: store.export(),
            version: store.version(),
            since_ms: None,
        };
        assert_eq!(whole, value.encode(), "the same bytes as the value's");
    }
}
