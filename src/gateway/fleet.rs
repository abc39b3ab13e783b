//! The upstreams the gateway may use: the lease API's eligible proxies
//! (Ready, Healthy, not draining, with their credentials at hand), less
//! those an exclusive lease holds or a report cooled down. It holds the
//! parts of the discovery API beside it (`discovery::GatewayParts`: the
//! listing in force, the token lookup, the lease service), so both ways
//! in read one listing and one lease store.

use std::sync::{Arc, Mutex};

use crate::discovery::{Filter, GatewayParts, Listing, ProxyItem};
use crate::lease::ProxyKey;
use crate::tenancy::ProbeDenylist;

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
    /// Where a `host` that is a name is dialled: resolved once, checked
    /// against the deny list, then kept for as long as the upstream stays
    /// eligible with this endpoint (carried from listing to listing), so
    /// a name that resolves elsewhere after its probe passed (DNS
    /// rebinding) is not followed; the health probe, which resolves it
    /// again, takes the upstream out if the new address fails or is
    /// denied, and a new pin is made only once it passes again.
    pub pin: Pin,
}

/// An upstream's pinned address (see [`Upstream::pin`]).
#[derive(Clone, Default)]
pub struct Pin(
    Arc<tokio::sync::OnceCell<Result<std::net::SocketAddr, String>>>,
    Option<Arc<ProbeDenylist>>,
);

impl Pin {
    /// A pin checked against `deny`.
    pub fn checked(deny: Option<Arc<ProbeDenylist>>) -> Self {
        Pin(Arc::default(), deny)
    }

    /// The address to dial for `host:port`: `host` itself when it is an
    /// address; else the name's first address the deny list allows,
    /// resolved once. An error says why none may be dialled.
    pub async fn address(&self, host: &str, port: u16) -> Result<std::net::SocketAddr, String> {
        if let Ok(ip) = host.trim_matches(['[', ']']).parse::<std::net::IpAddr>() {
            return Ok(std::net::SocketAddr::new(ip, port));
        }
        let deny = self.1.clone();
        let resolve = || async move {
            let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host, port))
                .await
                .map_err(|e| format!("{host} did not resolve: {e}"))?
                .collect();
            if let Some(deny) = &deny {
                if addrs.iter().any(|a| deny.denies(a.ip())) {
                    return Err(format!(
                        "{host} resolves to an address in --probe-deny-cidrs that --probe-allow-cidrs does not open; not dialled"
                    ));
                }
            }
            addrs
                .first()
                .copied()
                .ok_or_else(|| format!("{host} has no address"))
        };
        self.0.get_or_init(resolve).await.clone()
    }
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

/// The upstreams matching one connection's filters: every eligible one,
/// shared (built once per listing), and the positions of the matches.
#[derive(Clone)]
pub struct Candidates {
    /// Every eligible upstream, in listing order.
    pub all: Arc<[Upstream]>,
    /// Positions in `all` of the matches, ascending; `None`: all match.
    pub subset: Option<Arc<[u32]>>,
}

impl Candidates {
    /// Exactly `list`.
    pub fn of(list: Vec<Upstream>) -> Self {
        Candidates {
            all: list.into(),
            subset: None,
        }
    }

    /// The matches, in listing order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = &Upstream> + '_> {
        match &self.subset {
            None => Box::new(self.all.iter()),
            Some(s) => Box::new(s.iter().filter_map(|&p| self.all.get(p as usize))),
        }
    }

    /// The matches, as references.
    pub fn list(&self) -> Vec<&Upstream> {
        self.iter().collect()
    }

    /// How many match.
    pub fn len(&self) -> usize {
        self.subset.as_ref().map_or(self.all.len(), |s| s.len())
    }

    /// Whether none match.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`th match (below [`Candidates::len`]), without a walk.
    pub fn get(&self, i: usize) -> Option<&Upstream> {
        match &self.subset {
            None => self.all.get(i),
            Some(s) => self.all.get(*s.get(i)? as usize),
        }
    }
}

/// Where the gateway learns clients and upstreams.
pub trait Fleet: Send + Sync + 'static {
    /// The client a discovery token belongs to; none: refused.
    fn client_of(&self, token: &str) -> Option<Arc<str>>;
    /// The eligible upstreams that match `filter`.
    fn upstreams(&self, filter: &Filter) -> Candidates;
    /// Whether `client`'s gateway connections (to `site`, when known)
    /// may use `key` now: no exclusive lease holds it and no report
    /// cooled it down for them.
    fn shared(&self, client: &str, key: &ProxyKey, site: Option<&str>) -> bool;
    /// [`Fleet::shared`] for each of `keys`, in order, in one look.
    fn shared_all(&self, client: &str, keys: &[&ProxyKey], site: Option<&str>) -> Vec<bool> {
        keys.iter().map(|k| self.shared(client, k, site)).collect()
    }
    /// `key` is banned by `site` (or failed `client` everywhere): the
    /// cooldown of a lease report.
    fn cool_down(&self, client: &Arc<str>, key: &ProxyKey, site: Option<&str>);
    /// `key` failed a connection: the health engine probes it at once.
    fn failed(&self, _key: &ProxyKey) {}
}

/// The discovery API's listing and lease table as the gateway's fleet.
/// The upstreams are made from a listing once (a listing is rebuilt at
/// most every 250 ms, and not while nothing changes), so a new
/// connection costs a filter lookup and a walk over references, not a
/// copy of every proxy.
pub struct ApiFleet {
    api: GatewayParts,
    /// What an upstream's name must not resolve to (`--probe-deny-cidrs`
    /// less `--probe-allow-cidrs`).
    deny: Option<Arc<ProbeDenylist>>,
    /// The listing the upstreams were made from (held, so its address is
    /// not reused while it is compared), and them.
    made: Mutex<Option<(Listing, Arc<[Upstream]>)>>,
}

impl ApiFleet {
    /// The fleet of the API `api` was taken from.
    pub fn new(api: GatewayParts) -> Self {
        ApiFleet {
            api,
            deny: None,
            made: Mutex::new(None),
        }
    }

    /// Upstream names are checked against `deny` before they are dialled.
    pub fn with_deny(mut self, deny: Arc<ProbeDenylist>) -> Self {
        self.deny = Some(deny);
        self
    }

    /// Makes the upstreams of the listing in force, if not made yet: run
    /// off the connections' path (`warm_upstreams`), so the connection
    /// after a listing change finds them made.
    pub fn warm(&self) {
        self.made_from(&(self.api.listing)());
    }

    /// The upstreams of `listing`, made once. Made outside the lock: a
    /// connection never waits for another's walk over the fleet (two may
    /// make the same, once).
    fn made_from(&self, listing: &Listing) -> Arc<[Upstream]> {
        let made = || self.made.lock().unwrap_or_else(|p| p.into_inner());
        let before = match &*made() {
            Some((from, all)) if Arc::ptr_eq(from, listing) => return all.clone(),
            Some((_, all)) => Some(all.clone()),
            None => None,
        };
        // Pins carry over while an upstream keeps its endpoint.
        let pins: std::collections::HashMap<(&ProxyKey, &str, u16), &Pin> = before
            .iter()
            .flat_map(|all| all.iter())
            .map(|u| ((&u.key, u.host.as_str(), u.port), &u.pin))
            .collect();
        let all: Arc<[Upstream]> = listing
            .iter()
            .map(|e| {
                let mut u = upstream_of(&e.key, &e.item);
                u.pin = match pins.get(&(&u.key, u.host.as_str(), u.port)) {
                    Some(pin) => (*pin).clone(),
                    None => Pin::checked(self.deny.clone()),
                };
                u
            })
            .collect();
        drop(pins);
        *made() = Some((listing.clone(), all.clone()));
        all
    }
}

/// Keeps `fleet`'s upstreams made for the listing in force until `stop`,
/// looking every [`crate::discovery::REFRESH_EVERY`] (the pace the
/// listing itself is refreshed at).
pub async fn warm_upstreams(fleet: Arc<ApiFleet>, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    loop {
        let f = fleet.clone();
        if tokio::task::spawn_blocking(move || f.warm()).await.is_err() {
            return;
        }
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(crate::discovery::REFRESH_EVERY) => {}
        }
    }
}

fn upstream_of(key: &ProxyKey, item: &ProxyItem) -> Upstream {
    Upstream {
        hash: super::choose::upstream_hash(key),
        key: key.clone(),
        host: item.ip.clone(),
        port: item.port,
        pin: Pin::default(),
        authorization: item.username.as_ref().map(|u| {
            let pass = item.password.as_ref().map_or("", |p| p.expose());
            format!(
                "Basic {}",
                data_encoding::BASE64.encode(format!("{u}:{pass}").as_bytes())
            )
        }),
    }
}

impl Fleet for ApiFleet {
    fn client_of(&self, token: &str) -> Option<Arc<str>> {
        self.api.tokens.client_of(token)
    }

    fn upstreams(&self, filter: &Filter) -> Candidates {
        let listing = (self.api.listing)();
        let all = self.made_from(&listing);
        Candidates {
            all,
            subset: listing.positions(filter),
        }
    }

    fn shared(&self, client: &str, key: &ProxyKey, site: Option<&str>) -> bool {
        self.shared_all(client, &[key], site)
            .first()
            .copied()
            .unwrap_or(false)
    }

    fn shared_all(&self, client: &str, keys: &[&ProxyKey], site: Option<&str>) -> Vec<bool> {
        self.api.leases.lets_use_all(client, keys, site)
    }

    fn cool_down(&self, client: &Arc<str>, key: &ProxyKey, site: Option<&str>) {
        self.api.leases.cool_down(client, key, site);
    }

    fn failed(&self, key: &ProxyKey) {
        self.api.leases.failed(key);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test: a panic is its failure report
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::api::Proxy;
    use crate::discovery::{Filters, LISTING_MAX_AGE};
    use crate::lease::{LeaseConfig, LeaseStore};

    fn proxy(name: &str, pool: &str) -> Arc<Proxy> {
        Arc::new(
            serde_json::from_value(json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                "metadata": {"name": name, "namespace": "ns", "labels": {"crawl.example.com/pool": pool}},
                "spec": {"provider": "kubernetes", "port": 3128},
                "status": {"phase": "Ready", "ip": "127.0.0.5",
                    "conditions": [{"type": "Healthy", "status": "True", "reason": "R", "message": "",
                    "lastTransitionTime": "2025-01-01T00:00:00Z"}]}}))
            .unwrap(),
        )
    }

    /// The parts of an API listing the Ready Proxies `(name, pool)`, one
    /// lease per proxy, the client `default` signing in with the token `t`.
    fn api_of(proxies: &[(&str, &str)]) -> GatewayParts {
        let source: Vec<Arc<Proxy>> = proxies.iter().map(|(n, p)| proxy(n, p)).collect();
        let config = LeaseConfig {
            max_leases_per_proxy: 1,
            default_ttl: Duration::from_secs(300),
            max_ttl: Duration::from_secs(3600),
            cooldown: Duration::from_secs(300),
        };
        let mut registry = crate::metrics::Registrar::new();
        let metrics = crate::discovery::metrics::DiscoveryMetrics::register(&mut registry);
        let leases = Arc::new(LeaseStore::new(config));
        crate::discovery::ApiState::new(Arc::new(source), leases, Some("t"), &metrics)
            .gateway_parts()
    }

    #[tokio::test]
    async fn upstreams_are_made_once_per_listing_and_chosen_by_position() {
        let api = api_of(&[("a", "eu"), ("b", "us"), ("c", "eu")]);
        let fleet = ApiFleet::new(api);
        let all = Filter::new(Filters::default()).unwrap();
        let eu = Filter::new(Filters {
            pool: Some("eu".into()),
            ..Filters::default()
        })
        .unwrap();
        let first = fleet.upstreams(&all);
        let names = |c: &Candidates| -> Vec<String> {
            c.list().iter().map(|u| u.key.name.clone()).collect()
        };
        assert_eq!(names(&first), ["a", "b", "c"]);
        let pool = fleet.upstreams(&eu);
        assert_eq!(names(&pool), ["a", "c"]);
        assert!(
            Arc::ptr_eq(&first.all, &pool.all),
            "made once for the listing"
        );
        assert_eq!(first.all[0].port, 3128);
        assert_eq!(
            first.all[0].authorization, None,
            "no credentials: none sent"
        );
        // A rebuilt listing (another Arc) makes them anew.
        tokio::time::sleep(LISTING_MAX_AGE + Duration::from_millis(50)).await;
        let later = fleet.upstreams(&all);
        assert!(!Arc::ptr_eq(&first.all, &later.all));
        assert_eq!(names(&later), ["a", "b", "c"]);
    }

    /// A name is resolved once, checked against the deny list and kept;
    /// an address is dialled as given (the probe checked it).
    #[tokio::test]
    async fn a_name_is_resolved_once_checked_and_kept() {
        let loopback = || Some(Arc::new(ProbeDenylist::parse("127.0.0.0/8,::1").unwrap()));
        let denied = Pin::checked(loopback()).address("localhost", 3128).await;
        assert!(
            denied.as_ref().unwrap_err().contains("--probe-deny-cidrs"),
            "{denied:?}"
        );
        let open = Pin::checked(None);
        let first = open.address("localhost", 3128).await.unwrap();
        assert!(first.ip().is_loopback() && first.port() == 3128, "{first}");
        assert_eq!(open.address("localhost", 3128).await.unwrap(), first);
        let ip = Pin::checked(loopback()).address("127.0.0.9", 81).await;
        assert_eq!(ip, Ok("127.0.0.9:81".parse().unwrap()));
    }

    /// A session's report may reach a gateway replica that never carried
    /// it: given the session's username, that replica finds the upstream
    /// the one that carried it chose (the rendezvous winner).
    #[tokio::test]
    async fn a_session_is_found_from_its_username_where_it_was_never_carried() {
        use crate::discovery::GatewaySessions;
        let pools = [
            ("a", "eu"),
            ("b", "us"),
            ("c", "eu"),
            ("d", "eu"),
            ("e", "us"),
        ];
        let api = api_of(&pools);
        let mut registry = crate::metrics::Registrar::new();
        let gateway_metrics = crate::gateway::metrics::GatewayMetrics::register(&mut registry);
        let gateway = || {
            let fleet = Arc::new(ApiFleet::new(api.clone()));
            crate::gateway::Gateway::new(fleet, Default::default(), gateway_metrics.clone())
        };
        let (carried, other) = (gateway(), gateway());
        let client: Arc<str> = "default".into();
        let max = Duration::from_secs(3600);
        for n in 0..8 {
            let user = format!("default-session-s{n}-pool-eu");
            let wanted = crate::gateway::username::parse(&user, &client, max).unwrap();
            let filter = Filter::new(wanted.filters.clone()).unwrap();
            let chosen = carried
                .choose((&client, None), &wanted, &filter, None)
                .unwrap();
            let id = format!("s{n}");
            assert_eq!(
                carried.upstream_of(&client, &id, (None, None)),
                Ok(Some(chosen.upstream.key.clone())),
                "remembered where it was carried"
            );
            assert_eq!(other.upstream_of(&client, &id, (None, None)), Ok(None));
            assert_eq!(
                other.upstream_of(&client, &id, (Some(&user), None)),
                Ok(Some(chosen.upstream.key)),
                "session {n}: found from its username"
            );
        }
        let wrong = other.upstream_of(&client, "s1", (Some("default-session-s2"), None));
        assert!(wrong.unwrap_err().contains("does not name session \"s1\""));
        let bad = other.upstream_of(&client, "s1", (Some("default-sesion-s1"), None));
        assert!(bad.unwrap_err().contains("unknown parameter"));
        let nothing =
            other.upstream_of(&client, "s1", (Some("default-session-s1-pool-asia"), None));
        assert_eq!(nothing, Ok(None), "no proxy matches");
    }
}
