//! `make bench-lease`: lease acquire + release throughput and latency at
//! 64 concurrent keep-alive connections on loopback, against the real
//! discovery API (bearer auth on, 64 healthy proxies) as the leader, the
//! same calls through a follower replica that forwards them to it, and, in
//! the same run, a bare axum handler doing nothing but answering the same
//! two routes.
//! Each phase runs BENCH_SECS seconds (default 5). Ignored by `cargo test`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::routing::{delete, post};
use axum::{Json, Router};
use egress_proxies_operator::api::Proxy;
use egress_proxies_operator::discovery::{serve_on, ApiState, Forwarder, Leader, FORWARD_TIMEOUT};
use egress_proxies_operator::lease::{LeaseConfig, LeaseStore};
use egress_proxies_operator::operator::Metrics;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{json, Value};

const CONNECTIONS: usize = 64;
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

struct Figures {
    pairs: usize,
    errors: usize,
    secs: f64,
    p50: Duration,
    p99: Duration,
}

async fn load(addr: SocketAddr, run_for: Duration) -> Figures {
    let deadline = Instant::now() + run_for;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            stream.set_nodelay(true).unwrap();
            let (mut send, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .unwrap();
            let driver = tokio::spawn(conn);
            let mut lat = Vec::new();
            let mut errors = 0;
            while Instant::now() < deadline {
                let t = Instant::now();
                let req = hyper::Request::post("/v1/leases")
                    .header("host", "bench")
                    .header("authorization", format!("Bearer {TOKEN}"))
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from_static(b"{\"ttlSeconds\":60}")))
                    .unwrap();
                let Ok(resp) = send.send_request(req).await else {
                    errors += 1;
                    break;
                };
                let ok = resp.status() == 201;
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                let id = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|v| v["id"].as_str().map(String::from));
                let (true, Some(id)) = (ok, id) else {
                    errors += 1;
                    continue;
                };
                let req = hyper::Request::delete(format!("/v1/leases/{id}"))
                    .header("host", "bench")
                    .header("authorization", format!("Bearer {TOKEN}"))
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                let Ok(resp) = send.send_request(req).await else {
                    errors += 1;
                    break;
                };
                let ok = resp.status() == 204;
                let _ = resp.into_body().collect().await;
                if ok {
                    lat.push(t.elapsed());
                } else {
                    errors += 1;
                }
            }
            drop(send);
            let _ = driver.await;
            (lat, errors)
        }));
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await.unwrap();
        all.extend(l);
        errors += e;
    }
    let secs = start.elapsed().as_secs_f64();
    all.sort();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Figures {
        pairs: all.len(),
        errors,
        secs,
        p50: pct(0.50),
        p99: pct(0.99),
    }
}

fn print(name: &str, f: &Figures) {
    println!(
        "{name:<22} {:>9.0} acquire+release/s  p50 {:>8.3} ms  p99 {:>8.3} ms  ({} pairs, {} errors, {:.1}s)",
        f.pairs as f64 / f.secs,
        f.p50.as_secs_f64() * 1e3,
        f.p99.as_secs_f64() * 1e3,
        f.pairs,
        f.errors,
        f.secs
    );
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

    // The real API.
    let leases = Arc::new(LeaseStore::new(LeaseConfig {
        max_leases_per_proxy: 1,
        default_ttl: Duration::from_secs(300),
        max_ttl: Duration::from_secs(3600),
        cooldown: Duration::from_secs(300),
    }));
    let state = ApiState::new(
        Arc::new(proxies(fleet)),
        leases,
        Some(TOKEN),
        &Metrics::new().discovery,
    );
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
            max_leases_per_proxy: 1,
            default_ttl: Duration::from_secs(300),
            max_ttl: Duration::from_secs(3600),
            cooldown: Duration::from_secs(300),
        })),
        Some(TOKEN),
        &Metrics::new().discovery,
    )
    .with_forwarder(Forwarder::new(
        Arc::new(move || leader.clone()),
        FORWARD_TIMEOUT,
        Duration::from_secs(1),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let follower = listener.local_addr().unwrap();
    let (stop_follower, rx) = tokio::sync::oneshot::channel::<()>();
    let follower_task = tokio::spawn(serve_on(listener, follower_state, async move {
        let _ = rx.await;
    }));

    // A bare axum handler on the same routes.
    let bare = Router::new()
        .route(
            "/v1/leases",
            post(|| async {
                (
                    StatusCode::CREATED,
                    Json(json!({"id": "l-bare", "proxy": {"ip": "10.0.0.1", "port": 3128}})),
                )
            }),
        )
        .route(
            "/v1/leases/{id}",
            delete(|| async { StatusCode::NO_CONTENT }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let bare_addr = listener.local_addr().unwrap();
    let (stop_bare, rx) = tokio::sync::oneshot::channel::<()>();
    let bare_task = tokio::spawn(async move {
        axum::serve(listener, bare)
            .with_graceful_shutdown(async move {
                let _ = rx.await;
            })
            .await
    });

    println!(
        "{CONNECTIONS} connections, {fleet} healthy proxies, {secs}s per phase, {} build",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    let b = load(bare_addr, run_for).await;
    print("bare axum handler", &b);
    let a = load(api, run_for).await;
    print("discovery/lease API", &a);
    let f = load(follower, run_for).await;
    print("through a follower", &f);
    let rate = |x: &Figures| x.pairs as f64 / x.secs;
    println!(
        "lease API throughput is {:.0}% of the bare handler; through a follower {:.0}% of the leader",
        100.0 * rate(&a) / rate(&b).max(1e-9),
        100.0 * rate(&f) / rate(&a).max(1e-9)
    );
    let _ = stop_api.send(());
    let _ = stop_bare.send(());
    let _ = stop_follower.send(());
    api_task.await.unwrap().unwrap();
    bare_task.await.unwrap().unwrap();
    follower_task.await.unwrap().unwrap();
    assert_eq!(
        a.errors + f.errors,
        0,
        "the lease API must not refuse: 64 proxies, 64 connections"
    );
    assert!(a.pairs > 0 && b.pairs > 0 && f.pairs > 0);
}
