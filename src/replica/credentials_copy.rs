//! A gateway process's copy of the upstreams' credentials
//! (docs/architecture.md, "Credentials for the gateway"). A gateway's
//! ServiceAccount reads no Secret outside its own namespace, so it cannot
//! watch the credentials Secrets as the manager does; it asks the leader
//! for the usable ones instead, in a call signed with the shared key that
//! only replicas can make, once a second, and the leader sends them only
//! when its credentials cache changed since the copy the gateway names.
//! The gateway keeps its last copy while no leader answers. The route
//! that answers is `discovery::credentials_feed`'s.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::{debug, info};

use super::copy::ask_leader;
use super::forward::{Forwarder, Leader};
use crate::credentials::cache::{CredentialsCache, Entry};

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

/// Keeps a gateway process's `credentials` a copy of the leader's
/// (asked through `forward`), until `stop`. Anything but a gateway (an
/// `observer`) watches the Secrets itself and returns at once.
pub async fn follow_credentials(
    (forward, credentials): (Arc<Forwarder>, Arc<CredentialsCache>),
    observer: bool,
    stop: impl std::future::Future<Output = ()>,
) {
    if !observer {
        return;
    }
    tokio::pin!(stop);
    let mut held = Held::default();
    loop {
        let pause = match (forward.leader)() {
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
                    got = ask_leader::<Handed>(&forward, &url, &path, CREDENTIALS_LIMIT) => got,
                };
                match got {
                    Ok(None) => ASK_EVERY,
                    Ok(Some(h)) => {
                        if held.feed.is_none() {
                            info!(leader = %url, secrets = h.secrets.len(), "Copying the leader's upstream credentials");
                        }
                        credentials.take_fed(h.secrets);
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
