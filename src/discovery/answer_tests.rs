//! The leader's seal on its answers (issue 52): a follower takes a copy
//! of the leader's table only when the answer is sealed, with the shared
//! key, for the very call it sent. A stand-in at the leader's address
//! answers a well-formed table each way; the one sealed right is the
//! negative control (the follower's check is what refuses the others).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use axum::response::IntoResponse;

use super::feed::FEED_PATH;
use super::*;
use crate::lease::{LeaseConfig, LeaseKey, LeaseStore};
use crate::metrics::Registrar;
use crate::replica::copy::ask_leader;
use crate::replica::internal::{seal_answer, ANSWER_HEADER, FORWARD_HEADER};

fn key(b: u8) -> LeaseKey {
    LeaseKey::from_bytes(&[b; crate::lease::signed::KEY_LEN]).unwrap()
}

/// A follower signing its calls with `key`.
fn follower(key: LeaseKey) -> ApiState {
    let leases = Arc::new(LeaseStore::new(LeaseConfig {
        max_leases_per_proxy: 1,
        default_ttl: Duration::from_secs(60),
        max_ttl: Duration::from_secs(600),
        cooldown: Duration::from_secs(60),
    }));
    let mut registry = Registrar::new();
    let metrics = metrics::DiscoveryMetrics::register(&mut registry);
    let forwarder = Forwarder::new(
        Arc::new(|| Leader::Unknown),
        FORWARD_TIMEOUT,
        Duration::from_secs(1),
    )
    .with_key(key);
    ApiState::with_clients(
        Arc::new(Vec::<Arc<crate::api::Proxy>>::new()),
        leases,
        &[],
        &metrics,
    )
    .with_forwarder(forwarder)
}

/// How the stand-in seals what it answers.
#[derive(Clone)]
enum Sealing {
    None,
    /// With this key, for the call it answers.
    For(LeaseKey),
    /// With this key, for another call (an answer recorded earlier).
    Replayed(LeaseKey),
}

const TABLE: &str = r#"{"version": 7, "feed": "forged", "state": {}}"#;

/// The stand-in at the leader's address; its base URL.
async fn stand_in(sealing: Sealing) -> String {
    let answer = move |headers: HeaderMap| {
        let sealing = sealing.clone();
        async move {
            let ask = headers
                .get(FORWARD_HEADER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let seal = match &sealing {
                Sealing::None => String::new(),
                Sealing::For(k) => seal_answer(k, ask, 200, TABLE.as_bytes()),
                Sealing::Replayed(k) => seal_answer(k, "v1.1.earlier", 200, TABLE.as_bytes()),
            };
            ([(ANSWER_HEADER, seal)], TABLE).into_response()
        }
    };
    let app = axum::Router::new().fallback(answer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn a_copy_is_taken_only_when_the_leader_sealed_it_for_this_very_call() {
    let shared = key(9);
    let s = follower(shared.clone());
    let ask = |base: String| {
        let s = s.clone();
        async move { ask_leader::<serde_json::Value>(&s.forward, &base, FEED_PATH, 1 << 20).await }
    };
    for (name, sealing) in [
        ("unsealed", Sealing::None),
        ("sealed by another installation", Sealing::For(key(3))),
        (
            "an earlier call's answer",
            Sealing::Replayed(shared.clone()),
        ),
    ] {
        let got = ask(stand_in(sealing).await).await;
        let e = got.expect_err(name);
        assert!(e.contains("without the leader's seal"), "{name}: {e}");
    }
    // The negative control: sealed right, the same table is taken.
    let got = ask(stand_in(Sealing::For(shared)).await).await.unwrap();
    assert_eq!(got.unwrap()["feed"], "forged");
}
