//! What every handler shares: the Proxy source, the lease store, the
//! token digest, the API's metrics and the cached listing of eligible
//! proxies.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kube::runtime::reflector::Store;
use tokio::sync::broadcast;

use super::metrics::DiscoveryMetrics;
use super::model::{Filter, ProxyItem};
use super::tokens::TokenSet;
use crate::api::Proxy;
use crate::credentials::CredentialsCache;
use crate::lease::{Lease, LeaseStore};
use crate::proxy_store::Touch;
use crate::replica::forward::Forwarder;
use crate::tenancy::ExternalNamespaces;

use super::freshness::{due, fresh, Stamp};
pub use super::freshness::{LISTING_MAX_AGE, REFRESH_EVERY};

/// The listing held: when it was built, from what, and itself.
pub(super) type Held = Option<(Instant, Option<Stamp>, Listing)>;

/// Where the API reads Proxies from (the shared cache in the operator, a
/// fixed list in tests).
pub trait ProxySource: Send + Sync {
    /// Every Proxy currently known.
    fn proxies(&self) -> Vec<Arc<Proxy>>;

    /// Changes seen so far, when the source counts them: while it stays
    /// the same, [`ProxySource::proxies`] answers the same.
    fn version(&self) -> Option<u64> {
        None
    }

    /// Its changes from now on, one Proxy each, when the source announces
    /// them: a listing is then patched where they fall instead of built
    /// from every Proxy.
    fn follow(&self) -> Option<broadcast::Receiver<Touch>> {
        None
    }

    /// The Proxy `namespace/name` now.
    fn get(&self, namespace: &str, name: &str) -> Option<Arc<Proxy>> {
        self.proxies().into_iter().find(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.metadata.name.as_deref() == Some(name)
        })
    }
}

impl ProxySource for crate::proxy_store::ProxyStore {
    fn proxies(&self) -> Vec<Arc<Proxy>> {
        self.reader().state()
    }

    fn version(&self) -> Option<u64> {
        Some(crate::proxy_store::ProxyStore::version(self))
    }

    fn follow(&self) -> Option<broadcast::Receiver<Touch>> {
        Some(crate::proxy_store::ProxyStore::follow(self))
    }

    fn get(&self, namespace: &str, name: &str) -> Option<Arc<Proxy>> {
        self.reader()
            .get(&kube::runtime::reflector::ObjectRef::new(name).within(namespace))
    }
}

impl ProxySource for Store<Proxy> {
    fn proxies(&self) -> Vec<Arc<Proxy>> {
        self.state()
    }
}

impl ProxySource for Vec<Arc<Proxy>> {
    fn proxies(&self) -> Vec<Arc<Proxy>> {
        self.clone()
    }
}

pub use super::client::{Client, ANONYMOUS, DEFAULT_CLIENT};

use super::changes::Changes;
pub use super::listing::Listing;

/// What every handler shares.
#[derive(Clone)]
pub struct ApiState {
    pub(super) source: Arc<dyn ProxySource>,
    pub(super) leases: Arc<LeaseStore>,
    /// The named tokens in force (replaced when the tokens Secret changes).
    pub(super) tokens: Arc<TokenSet>,
    pub(super) metrics: DiscoveryMetrics,
    pub(super) listing: Arc<Mutex<Held>>,
    pub(super) rebuilding: Arc<AtomicBool>,
    /// Whether a refresher keeps the listing fresh (requests then never
    /// rebuild it).
    refreshed: Arc<AtomicBool>,
    /// The generation of the last listing built.
    pub(super) generations: Arc<AtomicU64>,
    /// Where External Proxies may be offered from.
    pub(super) external: Arc<ExternalNamespaces>,
    /// The proxies' credentials, handed out with them.
    pub(super) credentials: Arc<CredentialsCache>,
    /// Where lease calls go when this replica does not lead.
    pub(super) forward: Arc<Forwarder>,
    /// Forwarded acquires answered, by request key (`replay.rs`).
    pub(super) replays: Arc<Mutex<crate::replica::replay::Replays>>,
    /// Addresses whose signed calls proved them replicas: they may use
    /// the connections kept for forwards.
    pub(super) peers: crate::server::Trusted,
    /// The followers grants wait for (`replicas.rs`).
    pub(super) replicas: Arc<crate::replica::members::Replicas>,
    /// Who replaces a proxy a crawler asks to (`replace.rs`); none: the
    /// API replaces nothing.
    pub(super) replacer: Option<Arc<dyn super::hooks::Replacer>>,
    /// Each client's recent replaces.
    pub(super) replace_limits: Arc<Mutex<super::hooks::ReplaceLimits>>,
    /// The benchmark's probe switch; set: the bench routes are served.
    pub(super) bench: Option<crate::health::Pause>,
    /// The gateway of this process, for session reports; none: no gateway.
    pub(super) gateway: Option<Arc<dyn super::hooks::GatewaySessions>>,
    /// Copies the leader's table without joining the followers grants
    /// wait for: a process that can never lead (the gateway).
    pub(super) observer: bool,
    /// The health engine's hints, when this process runs one (it probes
    /// a failed upstream at once while this replica leads).
    pub(super) hints: Option<crate::health::Hints>,
    /// The source's changes since the listing in force was built.
    pub(super) changes: Arc<Mutex<Changes>>,
    /// What this process's gateway has to tell the leader (`outbox.rs`).
    pub(super) outbox: Arc<crate::replica::outbox::Outbox>,
}

impl ApiState {
    /// What keeps this process's copy of the leader's table
    /// (`replica::copy`), counting each delta in this API's metrics.
    pub(super) fn copier(&self) -> crate::replica::copy::Copier {
        let metrics = self.metrics.clone();
        crate::replica::copy::Copier {
            leases: self.leases.clone(),
            forward: self.forward.clone(),
            replicas: self.replicas.clone(),
            observer: self.observer,
            on_delta: Arc::new(move |lag, behind| metrics.copy_delta(lag, behind)),
        }
    }

    /// The state; `token` is `DISCOVERY_TOKEN` (None or empty: open API),
    /// the client named [`DEFAULT_CLIENT`].
    pub fn new(
        source: Arc<dyn ProxySource>,
        leases: Arc<LeaseStore>,
        token: Option<&str>,
        metrics: &DiscoveryMetrics,
    ) -> Self {
        let named: Vec<(String, String)> = token
            .filter(|t| !t.is_empty())
            .map(|t| (DEFAULT_CLIENT.to_string(), t.to_string()))
            .into_iter()
            .collect();
        Self::with_clients(source, leases, &named, metrics)
    }

    /// The state with named tokens, (client name, token); none: open API.
    pub fn with_clients(
        source: Arc<dyn ProxySource>,
        leases: Arc<LeaseStore>,
        tokens: &[(String, String)],
        metrics: &DiscoveryMetrics,
    ) -> Self {
        let (l, l2) = (leases.clone(), leases.clone());
        metrics.set_leases(move || i64::try_from(l.active()).unwrap_or(i64::MAX));
        let sites = leases.clone();
        metrics.set_site_cooldowns(move || i64::try_from(sites.held().1).unwrap_or(i64::MAX));
        let metrics = metrics.clone();
        ApiState {
            leases,
            tokens: Arc::new(TokenSet::new(tokens, false)),
            metrics,
            listing: Arc::new(Mutex::new(None)),
            rebuilding: Arc::new(AtomicBool::new(false)),
            refreshed: Arc::new(AtomicBool::new(false)),
            generations: Arc::new(AtomicU64::new(0)),
            // None until told: a namespace that may write a Proxy's status
            // must still not get its own endpoint into the pool.
            external: Arc::new(ExternalNamespaces::only([])),
            credentials: Arc::default(),
            forward: Arc::new(Forwarder::alone()),
            replays: Arc::default(),
            peers: crate::server::Trusted::default(),
            replicas: Arc::new(crate::replica::members::Replicas::new(l2, "local")),
            replacer: None,
            replace_limits: Arc::default(),
            bench: None,
            gateway: None,
            observer: false,
            hints: None,
            // Subscribed before the first build: nothing changed after it
            // is missed.
            changes: Arc::new(Mutex::new(Changes::new(source.follow()))),
            outbox: Arc::default(),
            source,
        }
    }

    /// Serves `make bench-scale`'s routes (`bench.rs`), switching `pause`;
    /// none: they do not exist.
    pub fn with_bench_routes(mut self, pause: Option<crate::health::Pause>) -> Self {
        self.bench = pause;
        self
    }

    /// Takes session reports for `gateway`'s sessions.
    /// Copies the leader's lease table as an observer: never waited for
    /// by grants, as a process that cannot lead must not be.
    pub fn as_observer(mut self) -> Self {
        self.observer = true;
        self
    }

    /// Hands the upstreams a gateway saw fail to `hints`, the health
    /// engine's (while this replica leads; the leader's otherwise).
    pub fn with_hints(mut self, hints: crate::health::Hints) -> Self {
        self.hints = Some(hints);
        self
    }

    /// Takes session reports for `gateway`.
    pub fn with_gateway(mut self, gateway: Arc<dyn super::hooks::GatewaySessions>) -> Self {
        self.gateway = Some(gateway);
        self
    }

    /// Replaces the proxies crawlers ask to through `replacer`.
    pub fn with_replacer(mut self, replacer: Arc<dyn super::hooks::Replacer>) -> Self {
        self.replacer = Some(replacer);
        self
    }

    /// Serves lease calls only while `forwarder` says this replica leads,
    /// forwarding them to the leader otherwise.
    pub fn with_forwarder(mut self, forwarder: Forwarder) -> Self {
        self.forward = Arc::new(forwarder);
        self
    }

    /// The replicas of this store's table, this replica named as in
    /// `replicas` (its election identity).
    pub fn with_replicas(mut self, replicas: Arc<crate::replica::members::Replicas>) -> Self {
        let r = replicas.clone();
        self.metrics.set_copy_age(move || {
            use crate::replica::copy_age::CopyState;
            match r.copy().at(std::time::Instant::now()) {
                CopyState::Leading => 0,
                CopyState::None => -1,
                CopyState::Aged(age) => i64::try_from(age.as_secs()).unwrap_or(i64::MAX),
            }
        });
        self.replicas = replicas;
        self
    }

    /// Offers External Proxies from the namespaces `external` allows only.
    pub fn with_external_namespaces(mut self, external: Arc<ExternalNamespaces>) -> Self {
        self.external = external;
        self
    }

    /// Hands out the proxies' credentials from `credentials` (a proxy
    /// that takes credentials it does not hold is not offered).
    pub fn with_credentials(mut self, credentials: Arc<CredentialsCache>) -> Self {
        self.credentials = credentials;
        self
    }

    /// Checks tokens against `tokens`, a set its owner replaces while the
    /// API serves (the tokens Secret's watcher).
    pub fn with_token_set(mut self, tokens: Arc<TokenSet>) -> Self {
        self.tokens = tokens;
        self
    }

    /// Whether a token is required.
    pub fn authenticated(&self) -> bool {
        self.tokens.required()
    }

    /// The versions of what the listing is built from, when the source
    /// counts its changes.
    fn stamp(&self) -> Option<Stamp> {
        Some((self.source.version()?, self.credentials.version()))
    }

    /// Every eligible proxy, sorted; rebuilt at most every
    /// [`LISTING_MAX_AGE`] so a busy API does not convert every Proxy on
    /// every request, and not at all while the Proxies and credentials
    /// are as when it was built (up to [`LISTING_UNCHANGED_MAX_AGE`]): a
    /// steady fleet costs its requests no walk over every Proxy.
    /// With a refresher running ([`ApiState::refresh_listing`]) a request
    /// never rebuilds it: it takes the listing in force, which the
    /// refresher replaces by the same rule off the requests' path.
    pub(super) fn listing(&self) -> Listing {
        // Read before the source is: a change during a rebuild shows as
        // a new stamp next time.
        let stamp = self.stamp();
        let current = self.held();
        if let Some((at, built, items)) = &current {
            // Kept fresh elsewhere, fresh, or stale while another request
            // rebuilds it: use it. Not while this replica leads with a
            // store that was not told the listing's set (its table was a
            // follower's copy until now): no grant may go without it.
            let told = !self.untold(items);
            if (told && (self.refreshed.load(Ordering::Acquire) || fresh(*at, *built, stamp)))
                || self.rebuilding.swap(true, Ordering::AcqRel)
            {
                return items.clone();
            }
        }
        self.rebuild(current, stamp)
    }

    /// Whether this replica serves leases from a store that does not hold
    /// `items`' eligible set: it just took over, and its table was the
    /// leader's copy (which carries no eligible set). A follower's store
    /// is not told: every copy would undo it, and it grants nothing.
    pub(super) fn untold(&self, items: &Listing) -> bool {
        // An observer (a gateway process) never leads: no lock, no seal
        // check on its connections' path.
        !self.observer
            && self.leases.eligible_generation() != Some(items.generation())
            && (self.forward.leader)() == crate::replica::forward::Leader::Me
    }

    /// Whether a refresher keeps the listing (tests).
    #[cfg(test)]
    pub(super) fn refreshing(&self) -> bool {
        self.refreshed.load(Ordering::Acquire)
    }

    pub(super) fn held(&self) -> Held {
        self.listing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Rebuilds the listing when it is [`due`]; what a refresher calls.
    fn refresh_if_stale(&self) {
        let stamp = self.stamp();
        let current = self.held();
        if let Some((at, built, items)) = &current {
            if (!due(*at, *built, stamp) && !self.untold(items))
                || self.rebuilding.swap(true, Ordering::AcqRel)
            {
                return;
            }
        }
        self.rebuild(current, stamp);
    }

    /// Keeps the listing fresh off the requests' path until `stop`: every
    /// [`REFRESH_EVERY`] it is rebuilt if [`due`], on the blocking pool (a
    /// rebuild walks every Proxy). Requests meanwhile take the listing in
    /// force, never waiting for one: a lease at 10,000 Proxies does not
    /// pay for the walk.
    pub async fn refresh_listing(self, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        let refreshed = || {
            let state = self.clone();
            async move {
                tokio::task::spawn_blocking(move || state.refresh_if_stale())
                    .await
                    .is_ok()
            }
        };
        // The first listing exists before requests stop building their own.
        if !refreshed().await {
            return;
        }
        self.refreshed.store(true, Ordering::Release);
        loop {
            tokio::select! {
                _ = &mut stop => break,
                _ = tokio::time::sleep(REFRESH_EVERY) => {}
            }
            if !refreshed().await {
                break;
            }
        }
        self.refreshed.store(false, Ordering::Release);
    }

    /// The eligible proxies that match `f`.
    pub(super) fn eligible(&self, f: &Filter) -> Vec<ProxyItem> {
        self.listing()
            .iter()
            .filter(|e| f.matches(&e.item))
            .map(|e| e.item.without_password())
            .collect()
    }

    /// The lease store the API grants from.
    pub fn lease_store(&self) -> &Arc<LeaseStore> {
        &self.leases
    }

    /// The listing entry of a lease's proxy, while it is eligible.
    pub(super) fn item_for(&self, lease: &Lease) -> Option<ProxyItem> {
        self.listing().get(&lease.proxy).cloned()
    }
}
