//! `make bench-lease`: lease acquire + release throughput and latency at
//! 64 concurrent keep-alive connections on loopback, against the real
//! discovery API (bearer auth on, 64 healthy proxies) as the leader, the
//! same calls through a follower replica that forwards them to it, and, in
//! the same run, a bare axum handler doing nothing but answering the same
//! two routes.
//! Each phase runs BENCH_SECS seconds (default 5). BENCH_PROXIES sets the
//! fleet (default 64) and BENCH_LEASES the live leases (one-hour TTL) held
//! on the leader during the load (default 0), e.g. 10000 and 100000 for
//! issue 19's figure; each proxy then takes BENCH_LEASES / BENCH_PROXIES
//! + 1 leases, so the load always finds room. Ignored by `cargo test`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

mod lease_load;

use std::sync::Arc;
use std::time::Duration;

use egress_proxies_operator::api::Proxy;
use egress_proxies_operator::discovery::{serve_on, ApiState, Forwarder, Leader, FORWARD_TIMEOUT};
use egress_proxies_operator::lease::{LeaseConfig, LeaseKey, LeaseStore};
use egress_proxies_operator::operator::Metrics;
use lease_load::{bare_server, fill, load, print, CONNECTIONS};
use serde_json::json;

const TOKEN: &str = "bench-token";

fn proxies(n: usize) -> Vec<Arc<Proxy>> {
    (0..n)
        .map(|i| {
            Arc::new(
                serde_json::from_value(json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                    "metadata": {"name": format!("p{i}"), "namespace": "bench"},
                    "spec": {"provider": "kubernetes", "port": 3128, "attributes": {"geo": "home"}},
                    "status": {"phase": "Ready", "ip": format!("10.0.{}.{}", i / 250, i % 250 + 1),
                        "conditions": [{"type": "Healthy", "status": "True", "reason": "ProbeSucceeded",
                        "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z"}]}}))
                .unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark: run with make bench-lease"]
async fn bench_lease_acquire_release() {
    let secs: u64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5)
        .clamp(1, 60);
    let run_for = Duration::from_secs(secs);
    let fleet: usize = std::env::var("BENCH_PROXIES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(CONNECTIONS)
        .clamp(CONNECTIONS, 100_000);
    let live: usize = std::env::var("BENCH_LEASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
        .min(1_000_000);
    let per_proxy = u32::try_from(live.div_ceil(fleet) + 1).unwrap();

    // The real API.
    let leases = Arc::new(LeaseStore::new(LeaseConfig {
        max_leases_per_proxy: per_proxy,
        default_ttl: Duration::from_secs(300),
        max_ttl: Duration::from_secs(3600),
        cooldown: Duration::from_secs(300),
    }));
    // The replicas' shared key: the follower signs its forwards with it.
    let key = LeaseKey::random();
    let state = ApiState::new(
        Arc::new(proxies(fleet)),
        leases,
        Some(TOKEN),
        &Metrics::new().discovery,
    )
    .with_forwarder(Forwarder::alone().with_key(key.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = listener.local_addr().unwrap();
    let (stop_api, rx) = tokio::sync::oneshot::channel::<()>();
    let api_task = tokio::spawn(serve_on(listener, state, async move {
        let _ = rx.await;
    }));

    // A follower: its own (unused) store, lease calls forwarded to the API
    // above, as a replica that does not lead.
    let leader = Leader::At(format!("http://{api}"));
    let follower_state = ApiState::new(
        Arc::new(proxies(fleet)),
        Arc::new(LeaseStore::new(LeaseConfig {
            max_leases_per_proxy: per_proxy,
            default_ttl: Duration::from_secs(300),
            max_ttl: Duration::from_secs(3600),
            cooldown: Duration::from_secs(300),
        })),
        Some(TOKEN),
        &Metrics::new().discovery,
    )
    .with_forwarder(
        Forwarder::new(
            Arc::new(move || leader.clone()),
            FORWARD_TIMEOUT,
            Duration::from_secs(1),
        )
        .with_key(key),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let follower = listener.local_addr().unwrap();
    let (stop_follower, rx) = tokio::sync::oneshot::channel::<()>();
    let follower_task = tokio::spawn(serve_on(listener, follower_state, async move {
        let _ = rx.await;
    }));

    // A bare axum handler on the same routes.
    let (stop_bare, rx) = tokio::sync::oneshot::channel::<()>();
    let bare_addr = bare_server(rx).await;

    let filled = fill(api, TOKEN, live).await;
    assert_eq!(filled, live, "every live lease is granted");
    println!(
        "{CONNECTIONS} connections, {fleet} healthy proxies, {live} live leases, {secs}s per phase, {} build",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    let b = load(bare_addr, TOKEN, run_for).await;
    print("bare axum handler", &b);
    let a = load(api, TOKEN, run_for).await;
    print("discovery/lease API", &a);
    let f = load(follower, TOKEN, run_for).await;
    print("through a follower", &f);
    println!(
        "lease API throughput is {:.0}% of the bare handler; through a follower {:.0}% of the leader",
        100.0 * a.rate() / b.rate().max(1e-9),
        100.0 * f.rate() / a.rate().max(1e-9)
    );
    let _ = stop_api.send(());
    let _ = stop_bare.send(());
    let _ = stop_follower.send(());
    api_task.await.unwrap().unwrap();
    follower_task.await.unwrap().unwrap();
    assert_eq!(
        a.errors + f.errors,
        0,
        "the lease API must not refuse: a free lease per proxy, at least 64 proxies, 64 connections"
    );
    assert!(a.pairs > 0 && b.pairs > 0 && f.pairs > 0);
}
