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
//!
//! This is the sending side, over the store, the forwarder and the
//! process's queue; the routes that take the calls are
//! `discovery::to_leader`'s.

use std::sync::Arc;

use axum::body::Body;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use super::feed::signed_call;
use super::forward::{Forwarder, Leader, FORWARD_TIMEOUT};
use super::outbox::{Outbox, Queued, Tell, MAX_WAITING};
use crate::lease::{LeaseStore, ProxyKey};

/// The leader's route for cooldowns.
pub const COOLDOWNS_PATH: &str = "/internal/v1/cooldowns";

/// The leader's route for upstreams that failed a connection.
pub const FAILED_PATH: &str = "/internal/v1/failed";

/// The client a failed upstream is signed for: it is no client's, so it
/// names the one client of an API without tokens, as it always did.
const NO_CLIENT: &str = "anonymous";

/// One proxy, and for a cooldown the site (none: the client everywhere).
#[derive(Debug, Serialize, Deserialize)]
pub struct Told {
    namespace: String,
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    site: Option<String>,
}

impl Told {
    fn of(proxy: &ProxyKey, site: Option<&str>) -> Self {
        Told {
            namespace: proxy.namespace.clone(),
            name: proxy.name.clone(),
            site: site.map(str::to_string),
        }
    }

    /// The proxy told of, and the site of a cooldown.
    pub fn key(self) -> (ProxyKey, Option<String>) {
        let key = ProxyKey {
            namespace: self.namespace,
            name: self.name,
        };
        (key, self.site)
    }
}

/// What tells the leader: this process's copy of the table (a cooldown
/// holds there at once), the way to the leader, the queue a gateway's
/// messages wait in, and what is told here instead of there.
#[derive(Clone)]
pub struct Teller {
    pub leases: Arc<LeaseStore>,
    pub forward: Arc<Forwarder>,
    pub outbox: Arc<Outbox>,
    /// Called for each message the full queue drops.
    pub on_dropped: Arc<dyn Fn() + Send + Sync>,
    /// Called for a failed upstream while no other replica is known to
    /// lead: this process's own health engine hears of it, if it runs one.
    pub on_failed_here: Arc<dyn Fn(&ProxyKey) + Send + Sync>,
}

impl Teller {
    /// Queues `t` for the leader (a gateway's cooldown or failed
    /// upstream), without waiting; the queue is bounded (`outbox.rs`).
    pub fn tell(&self, t: Tell) {
        if self.outbox.push(t) == Queued::Dropped {
            (self.on_dropped)();
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

    /// The leader's half of [`Teller::cool_down`]: nothing when this
    /// replica leads or no leader is known.
    pub async fn cool_down_at_leader(
        &self,
        proxy: &ProxyKey,
        client: &Arc<str>,
        site: Option<&str>,
    ) {
        let t = Told::of(proxy, site);
        if let Some(Err((base, e))) = self.tell_leader(COOLDOWNS_PATH, client, &t).await {
            warn!(leader = %base, proxy = %proxy, error = %e, "Cannot send a cooldown to the leader; it holds on this replica until its next copy of the lease table");
        }
    }

    /// `proxy` failed a connection through this replica's gateway: the
    /// health engine of the leader (this replica's own, when it leads)
    /// probes it at once.
    pub async fn upstream_failed(&self, proxy: &ProxyKey) {
        let t = Told::of(proxy, None);
        match self.tell_leader(FAILED_PATH, NO_CLIENT, &t).await {
            None => (self.on_failed_here)(proxy),
            Some(Ok(())) => {}
            Some(Err((base, e))) => {
                warn!(leader = %base, proxy = %proxy, error = %e, "Cannot tell the leader of a failed upstream; its probes will find it")
            }
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
            let resp = tokio::time::timeout(FORWARD_TIMEOUT, call)
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

/// Delivers what this process's gateway queued for the leader
/// (`outbox.rs`), one message at a time, until `stop`.
pub async fn deliver(teller: Teller, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    loop {
        let t = tokio::select! {
            _ = &mut stop => return,
            t = teller.outbox.next() => t,
        };
        let sent = async {
            match t {
                Tell::Cooldown {
                    proxy,
                    client,
                    site,
                } => {
                    teller
                        .cool_down_at_leader(&proxy, &client, site.as_deref())
                        .await
                }
                Tell::Failed(proxy) => teller.upstream_failed(&proxy).await,
            }
        };
        tokio::select! {
            _ = &mut stop => return,
            _ = sent => {}
        }
    }
}
