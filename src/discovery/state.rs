//! What every handler shares: the Proxy source, the lease store, the
//! token digest, the API's metrics and the cached listing of eligible
//! proxies.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kube::runtime::reflector::Store;
use tokio::sync::broadcast;

use super::forward::Forwarder;
use super::metrics::DiscoveryMetrics;
use super::model::{item_of, Filter, ProxyItem};
use super::tokens::TokenSet;
use crate::api::Proxy;
use crate::credentials::CredentialsCache;
use crate::lease::{Lease, LeaseStore, ProxyKey};
use crate::proxy_store::Touch;
use crate::tenancy::ExternalNamespaces;

use super::freshness::{due, fresh, Stamp};
pub use super::freshness::{LISTING_MAX_AGE, REFRESH_EVERY};

/// The listing held: when it was built, from what, and itself.
type Held = Option<(Instant, Option<Stamp>, Listing)>;

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

/// The client a request comes from: the name of its token, set by the
/// auth middleware.
#[derive(Debug, Clone)]
pub struct Client(pub Arc<str>);

/// The client name of `DISCOVERY_TOKEN`.
pub const DEFAULT_CLIENT: &str = "default";

/// The one client of an API without tokens.
pub const ANONYMOUS: &str = "anonymous";

pub use super::listing::Listing;
use super::listing::{Entry, ListingData};

/// What every handler shares.
#[derive(Clone)]
pub struct ApiState {
    pub(super) source: Arc<dyn ProxySource>,
    pub(super) leases: Arc<LeaseStore>,
    /// The named tokens in force (replaced when the tokens Secret changes).
    pub(super) tokens: Arc<TokenSet>,
    pub(super) metrics: DiscoveryMetrics,
    listing: Arc<Mutex<Held>>,
    rebuilding: Arc<AtomicBool>,
    /// Whether a refresher keeps the listing fresh (requests then never
    /// rebuild it).
    refreshed: Arc<AtomicBool>,
    /// The generation of the last listing built.
    generations: Arc<AtomicU64>,
    /// Where External Proxies may be offered from.
    external: Arc<ExternalNamespaces>,
    /// The proxies' credentials, handed out with them.
    credentials: Arc<CredentialsCache>,
    /// Where lease calls go when this replica does not lead.
    pub(super) forward: Arc<Forwarder>,
    /// Forwarded acquires answered, by request key (`replay.rs`).
    pub(super) replays: Arc<Mutex<super::replay::Replays>>,
    /// Addresses whose signed calls proved them replicas: they may use
    /// the connections kept for forwards.
    pub(super) peers: crate::server::Trusted,
    /// The followers grants wait for (`replicas.rs`).
    pub(super) replicas: Arc<super::replicas::Replicas>,
    /// Who replaces a proxy a crawler asks to (`replace.rs`); none: the
    /// API replaces nothing.
    pub(super) replacer: Option<Arc<dyn super::replace::Replacer>>,
    /// Each client's recent replaces.
    pub(super) replace_limits: Arc<Mutex<super::replace::ReplaceLimits>>,
    /// The benchmark's probe switch; set: the bench routes are served.
    pub(super) bench: Option<crate::health::Pause>,
    /// The gateway of this process, for session reports; none: no gateway.
    pub(super) gateway: Option<Arc<dyn super::sessions::GatewaySessions>>,
    /// Copies the leader's table without joining the followers grants
    /// wait for: a process that can never lead (the gateway).
    pub(super) observer: bool,
    /// The health engine's hints, when this process runs one (it probes
    /// a failed upstream at once while this replica leads).
    pub(super) hints: Option<crate::health::Hints>,
    /// The source's changes since the listing in force was built.
    changes: Arc<Mutex<Changes>>,
}

/// The source's announced changes not yet in the listing, and when the
/// whole source was last walked.
struct Changes {
    /// `None`: the source announces nothing (every build walks it).
    follow: Option<broadcast::Receiver<Touch>>,
    /// Announced changes the listing has not taken yet.
    touched: BTreeSet<Touched>,
    /// Announced deletes the sweep has not taken yet.
    gone: BTreeSet<Touched>,
    /// The listing, and the sweep, must walk the source: changes were
    /// missed or a relist replaced it (and at the start).
    listing_walk: bool,
    sweep_walk: bool,
    walked: Option<Instant>,
    /// Walks of the whole source so far (the listing's and the sweep's).
    walks: u64,
}

impl Changes {
    /// Takes what the source announced since the last call.
    fn drain(&mut self) {
        while let Some(rx) = self.follow.as_mut() {
            match rx.try_recv() {
                Ok(Touch::One(r)) => {
                    self.touched
                        .insert((r.namespace.unwrap_or_default(), r.name));
                }
                Ok(Touch::Gone(r)) => {
                    let at = (r.namespace.unwrap_or_default(), r.name);
                    self.touched.insert(at.clone());
                    self.gone.insert(at);
                }
                Ok(Touch::All) | Err(broadcast::error::TryRecvError::Lagged(_)) => {
                    self.listing_walk = true;
                    self.sweep_walk = true;
                }
                Err(broadcast::error::TryRecvError::Empty) => break,
                Err(broadcast::error::TryRecvError::Closed) => self.follow = None,
            }
        }
    }
}

/// What a rebuild starts from.
enum Since {
    /// Every Proxy: the first build, a relist, missed changes, changed
    /// credentials, a source that announces nothing, or the safety net.
    Walk,
    /// The Proxies changed since the listing in force, sorted.
    Touched(BTreeSet<Touched>),
}

/// A Proxy an event named: (namespace, name).
type Touched = (String, String);

/// How often a listing patched from events is built from every Proxy
/// anyway: what no event announces (a credentials lookup that changes by
/// itself when this process's write stops outranking the watch) is in
/// the listing within this.
pub const LISTING_WALK_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl ApiState {
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
            replicas: Arc::new(super::replicas::Replicas::new(l2, "local")),
            replacer: None,
            replace_limits: Arc::default(),
            bench: None,
            gateway: None,
            observer: false,
            hints: None,
            changes: Arc::new(Mutex::new(Changes {
                // Subscribed before the first build: nothing changed after
                // it is missed.
                follow: source.follow(),
                touched: BTreeSet::new(),
                gone: BTreeSet::new(),
                listing_walk: true,
                sweep_walk: true,
                walked: None,
                walks: 0,
            })),
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
    pub fn with_gateway(mut self, gateway: Arc<dyn super::sessions::GatewaySessions>) -> Self {
        self.gateway = Some(gateway);
        self
    }

    /// Replaces the proxies crawlers ask to through `replacer`.
    pub fn with_replacer(mut self, replacer: Arc<dyn super::replace::Replacer>) -> Self {
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
    pub fn with_replicas(mut self, replicas: Arc<super::replicas::Replicas>) -> Self {
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
    fn untold(&self, items: &Listing) -> bool {
        // An observer (a gateway process) never leads: no lock, no seal
        // check on its connections' path.
        !self.observer
            && self.leases.eligible_generation() != Some(items.generation())
            && (self.forward.leader)() == super::forward::Leader::Me
    }

    /// Whether a refresher keeps the listing (tests).
    #[cfg(test)]
    pub(super) fn refreshing(&self) -> bool {
        self.refreshed.load(Ordering::Acquire)
    }

    fn held(&self) -> Held {
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

    /// A new listing from the source, under the rebuild flag (taken by the
    /// caller when `current` exists).
    fn rebuild(&self, current: Held, stamp: Option<Stamp>) -> Listing {
        // Built outside the lock so readers never wait for a rebuild; the
        // flag is cleared however this ends.
        struct Clear<'a>(&'a AtomicBool);
        impl Drop for Clear<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _clear = Clear(&self.rebuilding);
        let fresh = self.generations.fetch_add(1, Ordering::AcqRel) + 1;
        let previous = current.as_ref().map(|(_, _, l)| l);
        let credentials = self.credentials.version();
        // Patched where the announced changes fall while the credentials
        // are as the listing in force was stamped with.
        let built_with = current.as_ref().and_then(|(_, s, _)| *s).map(|s| s.1);
        let since = self.since(previous.is_some() && built_with == Some(credentials));
        let items = match (since, previous) {
            (Since::Touched(touched), Some(l)) => self.patched(l, touched, credentials),
            _ => self.walked(previous, credentials),
        };
        // The same proxies as the listing it replaces (a rebuild under
        // this request's flag, so no other rebuild ran since): the store
        // already holds that set under its generation, which the new
        // listing keeps, and nothing is merged under the store's lock.
        let same = current.as_ref().map(|(_, _, l)| l).filter(|l| {
            l.len() == items.len()
                && l.iter().zip(&items).all(|(a, b)| a.key == b.key)
                // Not when the store's table was replaced since (a
                // follower's copy): it must be told the set again.
                && self.leases.eligible_generation() == Some(l.generation())
        });
        let generation = match same {
            Some(l) => l.generation(),
            None => {
                // Keys are unique (namespace/name), so the sorted keys are
                // the store's form of the set. Told before the listing is
                // published: a request holding an older listing is then
                // checked against it.
                self.leases
                    .set_eligible(fresh, items.iter().map(|e| e.key.clone()).collect());
                fresh
            }
        };
        let items = Arc::new(ListingData::new(generation, items));
        let mut held = self.listing.lock().unwrap_or_else(|p| p.into_inner());
        // Two first builds may race: the newer listing stays (a rebuild of
        // the same set keeps the generation it replaces).
        if held
            .as_ref()
            .is_none_or(|(_, _, l)| l.generation() <= generation)
        {
            *held = Some((Instant::now(), stamp, items.clone()));
        }
        items
    }

    /// What this rebuild starts from, taking the changes announced since
    /// the last; `patchable`: a listing in force that only Proxy changes
    /// made stale.
    fn since(&self, patchable: bool) -> Since {
        let mut c = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        c.drain();
        let touched = std::mem::take(&mut c.touched);
        let walk = !patchable
            || c.listing_walk
            || c.follow.is_none()
            || c.walked.is_none_or(|at| at.elapsed() >= LISTING_WALK_EVERY);
        if walk {
            // The walk shows what the drained changes announced.
            c.listing_walk = false;
            c.walked = Some(Instant::now());
            c.walks += 1;
            Since::Walk
        } else {
            Since::Touched(touched)
        }
    }

    /// Walks of the whole source so far (tests).
    #[cfg(test)]
    pub(super) fn walks(&self) -> u64 {
        self.changes.lock().unwrap_or_else(|p| p.into_inner()).walks
    }

    /// The entry of `p` made from `credentials`: `previous`'s while its
    /// Proxy and the credentials are as when it was made.
    fn entry_of(
        &self,
        p: &Proxy,
        previous: Option<&ListingData>,
        credentials: u64,
    ) -> Option<Arc<Entry>> {
        let rv = p.metadata.resource_version.as_deref();
        let kept = previous.and_then(|l| {
            let ns = p.metadata.namespace.as_deref().unwrap_or_default();
            let name = p.metadata.name.as_deref().unwrap_or_default();
            l.entry(ns, name).filter(|e| e.made_from(rv, credentials))
        });
        match kept {
            Some(e) => Some(e.clone()),
            None => item_of(p, &self.external, &self.credentials)
                .map(|i| Arc::new(Entry::new(i, rv, credentials))),
        }
    }

    /// The listing's entries from every Proxy of the source, sorted. An
    /// entry whose Proxy and credentials are as when the listing in force
    /// made it is reused as it is: a rebuild during churn makes only the
    /// entries of the Proxies that changed.
    fn walked(&self, previous: Option<&Listing>, credentials: u64) -> Vec<Arc<Entry>> {
        let mut items: Vec<Arc<Entry>> = self
            .source
            .proxies()
            .iter()
            .filter_map(|p| self.entry_of(p, previous.map(|l| &**l), credentials))
            .collect();
        items.sort_by(|a, b| a.key.cmp(&b.key));
        items
    }

    /// `previous`'s entries with those of the `touched` Proxies (sorted)
    /// made again from the source as it is now: a merge of two sorted
    /// runs, no walk of the source, no sort.
    fn patched(
        &self,
        previous: &ListingData,
        touched: BTreeSet<Touched>,
        credentials: u64,
    ) -> Vec<Arc<Entry>> {
        let made: Vec<(Touched, Option<Arc<Entry>>)> = touched
            .into_iter()
            .map(|(ns, name)| {
                let entry = self
                    .source
                    .get(&ns, &name)
                    .and_then(|p| self.entry_of(&p, Some(previous), credentials));
                ((ns, name), entry)
            })
            .collect();
        let mut items = Vec::with_capacity(previous.len() + made.len());
        let mut made = made.into_iter().peekable();
        for e in previous.iter() {
            let at = (e.key.namespace.as_str(), e.key.name.as_str());
            // The touched Proxies up to this entry: theirs (or none)
            // stand; one at this entry replaces it.
            let mut replaced = false;
            while let Some(((ns, name), _)) = made.peek() {
                let order = (ns.as_str(), name.as_str()).cmp(&at);
                if order == std::cmp::Ordering::Greater {
                    break;
                }
                replaced = order == std::cmp::Ordering::Equal;
                items.extend(made.next().and_then(|(_, entry)| entry));
                if replaced {
                    break;
                }
            }
            if !replaced {
                items.push(e.clone());
            }
        }
        items.extend(made.filter_map(|(_, entry)| entry));
        items
    }

    /// The eligible proxies that match `f`.
    pub(super) fn eligible(&self, f: &Filter) -> Vec<ProxyItem> {
        self.listing()
            .iter()
            .filter(|e| f.matches(&e.item))
            .map(|e| e.item.clone())
            .collect()
    }

    /// The listing of eligible proxies in force (the gateway's
    /// upstreams): a new one, another `Arc`, each time it is rebuilt.
    pub fn current_listing(&self) -> Listing {
        self.listing()
    }

    /// The client a token names, as the API's bearer auth finds it.
    pub fn client_of_token(&self, token: &str) -> Option<Arc<str>> {
        self.tokens.client_of(token)
    }

    /// The lease store the API grants from.
    pub fn lease_store(&self) -> &Arc<LeaseStore> {
        &self.leases
    }

    /// The listing entry of a lease's proxy, while it is eligible.
    pub(super) fn item_for(&self, lease: &Lease) -> Option<ProxyItem> {
        self.listing().get(&lease.proxy).cloned()
    }

    /// Makes the lease store forget the sticky keys and cooldowns of
    /// deleted Proxies, when the source changed since `seen` (updated) or
    /// does not count its changes: no walk over every Proxy, under the
    /// store's lock, while the fleet stands still.
    /// A source that announces its changes is walked only the first time,
    /// after a relist or missed changes: otherwise the announced deletes
    /// are forgotten one by one.
    pub(crate) fn forget_deleted(&self, seen: &mut Option<u64>) {
        let version = self.source.version();
        if version.is_some() && version == *seen {
            return;
        }
        // Read before the walk: a change during it is seen next time.
        *seen = version;
        let gone = {
            let mut c = self.changes.lock().unwrap_or_else(|p| p.into_inner());
            c.drain();
            let gone = std::mem::take(&mut c.gone);
            if c.sweep_walk || c.follow.is_none() {
                c.sweep_walk = false;
                c.walks += 1;
                None
            } else {
                Some(gone)
            }
        };
        let Some(gone) = gone else {
            self.leases.retain_proxies(&self.present());
            return;
        };
        // Made again since its delete: not gone.
        let gone: std::collections::HashSet<ProxyKey> = gone
            .into_iter()
            .filter(|(ns, name)| self.source.get(ns, name).is_none())
            .map(|(namespace, name)| ProxyKey { namespace, name })
            .collect();
        if !gone.is_empty() {
            self.leases.forget_proxies(&gone);
        }
    }

    /// Every Proxy the source knows, as lease-store keys (the sweep
    /// forgets the leases and cooldowns of the others).
    pub(super) fn present(&self) -> std::collections::HashSet<ProxyKey> {
        self.source
            .proxies()
            .iter()
            .map(|p| ProxyKey {
                namespace: kube::ResourceExt::namespace(p.as_ref()).unwrap_or_default(),
                name: kube::ResourceExt::name_any(p.as_ref()),
            })
            .collect()
    }
}
