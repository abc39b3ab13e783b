//! Not a test: `tests/fuzz-api.sh` runs this ignored test to serve the
//! discovery API (fixed healthy Proxies, bearer token) on FUZZ_ADDR
//! (127.0.0.1 only) for at most FUZZ_SECS seconds while schemathesis fuzzes
//! it from /openapi.json. It stops by itself.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

#[path = "served_api/mod.rs"]
mod served_api;

use std::sync::Arc;
use std::time::Duration;

use egress_proxies_operator::discovery::{serve_on, ApiState};
use egress_proxies_operator::operator::Metrics;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "serves the API for tests/fuzz-api.sh"]
async fn serve_for_fuzzing() {
    let addr: std::net::SocketAddr = std::env::var("FUZZ_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:18090".into())
        .parse()
        .unwrap();
    assert!(addr.ip().is_loopback(), "FUZZ_ADDR must be on loopback");
    let secs: u64 = std::env::var("FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120)
        .min(900);
    let token = std::env::var("FUZZ_TOKEN").unwrap_or_else(|_| "fuzz-token".into());
    let proxies = served_api::ready_proxies(
        4,
        "fuzz",
        json!({"placement": {"zone": "z1"}, "attributes": {"geo": "home"}}),
    );
    let leases = served_api::leases(2);
    let state = ApiState::new(
        Arc::new(proxies),
        leases,
        Some(&token),
        &Metrics::new().discovery,
    );
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    println!("serving on {addr} for at most {secs}s");
    serve_on(
        listener,
        state,
        tokio::time::sleep(Duration::from_secs(secs)),
    )
    .await
    .unwrap();
}
