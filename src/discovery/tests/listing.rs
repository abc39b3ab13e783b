//! The eligible-proxy listing: when it is rebuilt, what it reuses, and
//! the bench routes.

use super::*;

/// A listing rebuilt with the same proxies keeps its generation and tells
/// the lease store nothing (no merge under its lock); once the store's
/// table is replaced (a follower's copy of the leader's), the next request
/// of a leading replica rebuilds it at once and tells it the set again,
/// and a grant finds the proxies.
#[tokio::test]
async fn a_rebuild_of_the_same_set_leaves_the_store_alone_unless_its_table_was_replaced() {
    let source: Vec<Arc<Proxy>> = vec![
        proxy("a", "z1", "True", json!({})),
        proxy("b", "z2", "True", json!({})),
    ];
    let config = LeaseConfig {
        max_leases_per_proxy: 1,
        default_ttl: Duration::from_secs(300),
        max_ttl: Duration::from_secs(3600),
        cooldown: Duration::from_secs(300),
    };
    let leases = Arc::new(LeaseStore::new(config).with_key(shared_key()));
    let mut registry = Registrar::new();
    let discovery = metrics::DiscoveryMetrics::register(&mut registry);
    let state = ApiState::new(Arc::new(source), leases.clone(), None, &discovery);
    let first = state.listing();
    assert_eq!(leases.eligible_generation(), Some(first.generation()));
    tokio::time::sleep(LISTING_MAX_AGE + Duration::from_millis(50)).await;
    let again = state.listing();
    assert!(!Arc::ptr_eq(&first, &again), "rebuilt");
    assert_eq!(
        again.generation(),
        first.generation(),
        "the same set keeps its generation"
    );
    // The leader's table replaces this store's: its eligible set is gone.
    let leader = LeaseStore::new(config).with_key(shared_key());
    assert!(leases
        .replace(&leader.export(), leases.term(), "leader")
        .unwrap());
    assert_eq!(leases.eligible_generation(), None);
    // At once, though the listing is fresh: this replica leads (it runs
    // alone), and no grant may go from a store without the set.
    let after = state.listing();
    assert_ne!(after.generation(), first.generation());
    assert_eq!(leases.eligible_generation(), Some(after.generation()));
    let req = crate::lease::AcquireRequest {
        client: Arc::from("c"),
        ..Default::default()
    };
    let members = after.members(&super::model::Filter::default());
    assert!(
        leases.acquire_among(&members, &req).is_ok(),
        "a grant finds the proxies"
    );
}

#[tokio::test]
async fn the_bench_routes_exist_only_when_asked_for_and_switch_the_probes() {
    let off = Api::start(Some("t0k"), 2).await;
    let (st, v) = off.json("POST", "/bench/leases", json!({})).await;
    assert_eq!(st, 404, "{v}");
    off.stop().await;

    let pause = crate::health::Pause::default();
    let limits = (ClientLimits::default(), crate::server::DISCOVERY_LIMITS);
    let tokens = [("default", "t0k")];
    let with = (None, Some(pause.clone()));
    let api = Api::start_replacing(&tokens, 2, limits, Forwarder::alone(), with).await;
    // Behind the same auth and parsing as a real acquire.
    let (st, _) = api.call("POST", "/bench/leases", None, None).await;
    assert_eq!(st, 401);
    let (st, v) = api.json("POST", "/bench/leases", json!({"ttl": 5})).await;
    assert_eq!(st, 422, "{v}");
    let (st, v) = api
        .json("POST", "/bench/leases", json!({"ttlSeconds": 60}))
        .await;
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["ttlSeconds"], 60);
    let id = v["id"].as_str().unwrap();
    let (st, _) = api
        .call("DELETE", &format!("/bench/leases/{id}"), Some("t0k"), None)
        .await;
    assert_eq!(st, 204);
    // No lease was taken.
    assert_eq!(api.leases.active(), 0);
    let (st, v) = api
        .json("PUT", "/bench/probes", json!({"paused": true}))
        .await;
    assert_eq!(st, 204, "{v}");
    assert!(pause.is_paused());
    let (st, _) = api
        .json("PUT", "/bench/probes", json!({"paused": false}))
        .await;
    assert_eq!(st, 204);
    assert!(!pause.is_paused());
    let (st, v) = api.json("PUT", "/bench/probes", json!({"hold": 1})).await;
    assert_eq!(st, 422, "{v}");
    api.stop().await;
}

/// A Proxy source that counts its changes and how often it was read.
struct Counted {
    proxies: std::sync::Mutex<Vec<Arc<Proxy>>>,
    version: std::sync::atomic::AtomicU64,
    reads: std::sync::atomic::AtomicUsize,
}

thread_local! {
    /// Set while a test's request runs on this thread.
    static IN_REQUEST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Reads of a [`Counted`] source made by a request (see [`IN_REQUEST`]).
static READ_BY_REQUESTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl ProxySource for Counted {
    fn proxies(&self) -> Vec<Arc<Proxy>> {
        if IN_REQUEST.with(|r| r.get()) {
            READ_BY_REQUESTS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.proxies.lock().unwrap().clone()
    }
    fn version(&self) -> Option<u64> {
        Some(self.version.load(std::sync::atomic::Ordering::SeqCst))
    }
}

/// A state over a [`Counted`] source holding the Proxy `a`, version 1.
fn counted_state() -> (Arc<Counted>, ApiState) {
    let source = Arc::new(Counted {
        proxies: std::sync::Mutex::new(vec![proxy("a", "z1", "True", json!({}))]),
        version: 1.into(),
        reads: 0.into(),
    });
    let api = state_over(source.clone());
    (source, api)
}

/// An open API's state over `source`, four leases a proxy.
fn state_over(source: Arc<dyn ProxySource>) -> ApiState {
    let leases = Arc::new(LeaseStore::new(LeaseConfig {
        max_leases_per_proxy: 4,
        default_ttl: Duration::from_secs(60),
        max_ttl: Duration::from_secs(600),
        cooldown: Duration::from_secs(60),
    }));
    let mut registry = Registrar::new();
    let discovery = metrics::DiscoveryMetrics::register(&mut registry);
    ApiState::new(source, leases, None, &discovery)
}

#[tokio::test]
async fn a_steady_fleet_is_not_listed_again_and_a_change_is() {
    let (source, api) = counted_state();
    let reads = || source.reads.load(std::sync::atomic::Ordering::SeqCst);
    let names = |l: &state::Listing| l.iter().map(|e| e.key.name.clone()).collect::<Vec<_>>();

    assert_eq!(names(&api.listing()), ["a"]);
    assert_eq!(reads(), 1, "the first request lists the Proxies");
    tokio::time::sleep(LISTING_MAX_AGE * 2).await;
    assert_eq!(names(&api.listing()), ["a"]);
    assert_eq!(
        reads(),
        1,
        "nothing changed: past the listing's age, no Proxy is read again"
    );
    let mut seen = None;
    api.forget_deleted(&mut seen);
    api.forget_deleted(&mut seen);
    assert_eq!(
        reads(),
        2,
        "the sweep walks the Proxies once, not again while they stand still"
    );

    source
        .proxies
        .lock()
        .unwrap()
        .push(proxy("b", "z1", "True", json!({})));
    source
        .version
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        names(&api.listing()),
        ["a", "b"],
        "a change is listed once the listing is past its age"
    );
    assert_eq!(reads(), 3);
    api.forget_deleted(&mut seen);
    assert_eq!(reads(), 4, "and the sweep looks again");
}

#[tokio::test]
async fn a_rebuild_reuses_the_entries_of_unchanged_proxies_only() {
    let (source, api) = counted_state();
    let with_rv = |name: &str, zone: &str, rv: Option<&str>| {
        let mut p = (*proxy(name, zone, "True", json!({}))).clone();
        p.metadata.resource_version = rv.map(String::from);
        Arc::new(p)
    };
    *source.proxies.lock().unwrap() = vec![
        with_rv("a", "z1", Some("1")),
        with_rv("b", "z1", Some("2")),
        with_rv("c", "z1", None),
    ];
    source
        .version
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let before = api.listing();
    assert_eq!(before.len(), 3);

    // b changes (a new resourceVersion); a and c do not.
    source.proxies.lock().unwrap()[1] = with_rv("b", "z2", Some("3"));
    source
        .version
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(LISTING_MAX_AGE * 2).await;
    let after = api.listing();
    assert!(!Arc::ptr_eq(&before, &after), "a new listing was built");
    assert!(
        Arc::ptr_eq(&before[0], &after[0]),
        "a's entry is the one already made"
    );
    assert!(!Arc::ptr_eq(&before[1], &after[1]), "b's is made again");
    assert_eq!(after[1].item.zone.as_deref(), Some("z2"), "with its change");
    assert!(
        !Arc::ptr_eq(&before[2], &after[2]),
        "a Proxy without a resourceVersion is never taken as unchanged"
    );
}

/// With its refresher running (as `serve` runs it), no request walks the
/// Proxies: a change reaches the listing requests take within the
/// listing's age, rebuilt off their path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_refresher_running_no_request_rebuilds_the_listing() {
    let (source, api) = counted_state();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let refresher = tokio::spawn(api.clone().refresh_listing(async move {
        let _ = rx.await;
    }));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !api.refreshing() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the refresher never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let names = |l: &state::Listing| l.iter().map(|e| e.key.name.clone()).collect::<Vec<_>>();
    let request = || {
        IN_REQUEST.with(|r| r.set(true));
        let l = api.listing();
        IN_REQUEST.with(|r| r.set(false));
        names(&l)
    };
    assert_eq!(request(), ["a"]);
    source
        .proxies
        .lock()
        .unwrap()
        .push(proxy("b", "z1", "True", json!({})));
    source
        .version
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let deadline = tokio::time::Instant::now() + LISTING_MAX_AGE * 4;
    while request() != ["a", "b"] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the change never reached the listing"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        READ_BY_REQUESTS.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a request walked the Proxies"
    );
    let _ = tx.send(());
    refresher.await.unwrap();
    assert!(!api.refreshing(), "stopped: requests build their own again");
}

/// A source that announces its changes (the Proxy store) has its listing
/// patched where they fall: a changed Proxy, one no longer healthy, a
/// deleted one and a new one reach the listing, the other entries stay
/// the ones already made, and the store is walked only for the first
/// listing and after a relist; the sweep likewise forgets the cooldowns
/// of the deleted Proxies it is told of.
#[tokio::test]
async fn a_listing_follows_the_stores_events_without_a_walk() {
    use kube::runtime::watcher::Event;
    let at = |name: &str, zone: &str, healthy: &str, rv: &str| {
        let mut p = (*proxy(name, zone, healthy, json!({}))).clone();
        p.metadata.resource_version = Some(rv.into());
        p
    };
    let (store, mut fill) = crate::proxy_store::ProxyStore::by_hand();
    fill.list([
        at("b", "z1", "True", "1"),
        at("d", "z1", "True", "2"),
        at("f", "z1", "True", "3"),
        at("h", "z1", "True", "4"),
    ]);
    let api = state_over(Arc::new(store));
    let names = |l: &state::Listing| {
        l.iter()
            .map(|e| format!("{}:{}", e.key.name, e.item.zone.as_deref().unwrap_or("")))
            .collect::<Vec<_>>()
    };
    let first = api.listing();
    assert_eq!(names(&first), ["b:z1", "d:z1", "f:z1", "h:z1"]);
    assert_eq!(api.walks(), 1);

    // Before b, between d and f, at the end; d moves, f turns unhealthy,
    // h is deleted.
    for ev in [
        Event::Apply(at("a", "z1", "True", "5")),
        Event::Apply(at("e", "z1", "True", "6")),
        Event::Apply(at("i", "z1", "True", "7")),
        Event::Apply(at("d", "z2", "True", "8")),
        Event::Apply(at("f", "z1", "False", "9")),
        Event::Delete(at("h", "z1", "True", "4")),
    ] {
        fill.apply(ev);
    }
    tokio::time::sleep(LISTING_MAX_AGE * 2).await;
    let patched = api.listing();
    assert_eq!(
        names(&patched),
        ["a:z1", "b:z1", "d:z2", "e:z1", "i:z1"],
        "every change in its place"
    );
    assert_eq!(api.walks(), 1, "patched, not walked");
    assert!(
        Arc::ptr_eq(&first[0], &patched[1]),
        "b's entry is the one already made"
    );
    let keys: Vec<_> = patched.iter().map(|e| e.key.clone()).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "still sorted for its binary searches");
    assert!(patched.get(&test_proxy_key("e")).is_some());

    // The sweep walks the store once, then forgets the cooldowns of the
    // Proxies whose deletes it was told of, and of no other.
    let mut seen = None;
    api.forget_deleted(&mut seen);
    assert_eq!(api.walks(), 2, "the sweep's first look walks");
    let me: Arc<str> = "default".into();
    for name in ["a", "b", "e"] {
        api.cool_down(&test_proxy_key(name), &me, None).await;
    }
    let cooling = |name: &str| {
        !api.lease_store()
            .lets_gateway_use("default", &test_proxy_key(name), None)
    };
    assert!(cooling("a") && cooling("b") && cooling("e"));
    fill.apply(Event::Delete(at("e", "z1", "True", "6")));
    fill.apply(Event::Delete(at("b", "z1", "True", "1")));
    // b is made again before the sweep: it keeps its cooldown.
    fill.apply(Event::Apply(at("b", "z1", "True", "11")));
    api.forget_deleted(&mut seen);
    assert!(!cooling("e"), "e's cooldown is forgotten");
    assert!(cooling("a") && cooling("b"), "a's and b's stay");
    assert_eq!(api.walks(), 2, "told, not walked");

    // A relist (the watch restarted) is walked.
    fill.list([at("a", "z3", "True", "10")]);
    tokio::time::sleep(LISTING_MAX_AGE * 2).await;
    assert_eq!(names(&api.listing()), ["a:z3"]);
    assert_eq!(api.walks(), 3, "a relist is walked");
    api.forget_deleted(&mut seen);
    assert_eq!(api.walks(), 4, "by the sweep too");
    assert!(cooling("a") && !cooling("b"), "b is gone in the relist");
}
