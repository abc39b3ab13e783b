//! The upstreams the gateway may use: the lease API's eligible proxies
//! (Ready, Healthy, not draining, with their credentials at hand), less
//! those an exclusive lease holds or a report cooled down. In the
//! operator process this is the discovery API's own state, so both ways
//! in read one listing and one lease store.

use std::sync::Arc;

use crate::discovery::{ApiState, Filter};
use crate::lease::ProxyKey;

/// One upstream proxy as the gateway dials it.
#[derive(Clone)]
pub struct Upstream {
    /// Its Proxy.
    pub key: ProxyKey,
    /// Its stable hash (`choose::upstream_hash`): its
    /// rendezvous weights.
    pub hash: u64,
    /// Where it listens.
    pub host: String,
    pub port: u16,
    /// `Proxy-Authorization` for it (`Basic …`); none: it takes none.
    pub authorization: Option<String>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The authorization is a password: never printed.
        f.debug_struct("Upstream")
            .field("key", &self.key)
            .field("host", &self.host)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

/// Where the gateway learns clients and upstreams.
pub trait Fleet: Send + Sync + 'static {
    /// The client a discovery token belongs to; none: refused.
    fn client_of(&self, token: &str) -> Option<Arc<str>>;
    /// The eligible upstreams that match `filter`.
    fn upstreams(&self, filter: &Filter) -> Vec<Upstream>;
    /// Whether `client`'s gateway connections (to `site`, when known)
    /// may use `key` now: no exclusive lease holds it and no report
    /// cooled it down for them.
    fn shared(&self, client: &str, key: &ProxyKey, site: Option<&str>) -> bool;
    /// `key` is banned by `site` (or failed `client` everywhere): the
    /// cooldown of a lease report.
    fn cool_down(&self, client: &Arc<str>, key: &ProxyKey, site: Option<&str>);
}

impl Fleet for ApiState {
    fn client_of(&self, token: &str) -> Option<Arc<str>> {
        self.client_of_token(token)
    }

    fn upstreams(&self, filter: &Filter) -> Vec<Upstream> {
        self.matching(filter)
            .into_iter()
            .map(|(key, item)| Upstream {
                hash: super::choose::upstream_hash(&key),
                key,
                host: item.ip,
                port: item.port,
                authorization: item.username.as_ref().map(|u| {
                    let pass = item.password.as_ref().map_or("", |p| p.expose());
                    format!(
                        "Basic {}",
                        data_encoding::BASE64.encode(format!("{u}:{pass}").as_bytes())
                    )
                }),
            })
            .collect()
    }

    fn shared(&self, client: &str, key: &ProxyKey, site: Option<&str>) -> bool {
        self.lease_store().lets_gateway_use(client, key, site)
    }

    fn cool_down(&self, client: &Arc<str>, key: &ProxyKey, site: Option<&str>) {
        self.lease_store().cool_down(key, client, site);
    }
}
