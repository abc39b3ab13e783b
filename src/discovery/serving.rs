//! The router (routes, then the middleware around each of them) and the
//! server: graceful shutdown, with the lease sweeper alongside.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::http::header;
use axum::middleware;
use axum::routing::{get, post};
use axum::Router;
use tracing::warn;

use super::handlers::*;
use super::middleware::{auth, bounded, forward, observe, BODY_LIMIT};
use super::openapi::openapi_json;
use super::state::ApiState;
use crate::server::{Limits, DISCOVERY_LIMITS};

/// How often expired leases are swept.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The API's router; a request taking longer than `request_timeout` is
/// answered `408 request_timeout`.
pub fn router(state: ApiState, request_timeout: Option<Duration>) -> Router {
    let doc = openapi_json(state.leases.config().max_ttl);
    let bench = match state.bench {
        Some(_) => super::bench::routes(),
        None => Router::new(),
    };
    let router = Router::new()
        .route("/healthz", get(healthz))
        .route(
            "/openapi.json",
            get(move || {
                let doc = doc.clone();
                async move { ([(header::CONTENT_TYPE, "application/json")], doc) }
            }),
        )
        .route("/v1/proxies", get(list_proxies))
        // Not forwarded: the session lives in this replica's gateway.
        .route(
            "/v1/sessions/{session}/report",
            post(super::sessions::report_session),
        )
        // Replicas only (a signed call): the leader's table for warm
        // followers. Not in the OpenAPI document: not for crawlers.
        .route(super::feed::FEED_PATH, get(super::feed::lease_state))
        // Replicas only: the upstreams' credentials for gateway processes.
        .route(
            super::credentials_feed::CREDENTIALS_PATH,
            get(super::credentials_feed::upstream_credentials),
        )
        // Replicas only: what a gateway replica tells the leader.
        .route(
            crate::replica::to_leader::COOLDOWNS_PATH,
            post(super::to_leader::take_cooldown),
        )
        .route(
            crate::replica::to_leader::FAILED_PATH,
            post(super::to_leader::take_failed),
        )
        // Only these go to the leader's lease store; the listing is the
        // same watch cache on every replica.
        .merge(
            Router::new()
                .route("/v1/leases", post(acquire))
                .route("/v1/leases/{id}", get(get_lease).delete(release))
                .route("/v1/leases/{id}/renew", post(renew))
                .route("/v1/leases/{id}/report", post(report))
                .route("/v1/leases/{id}/replace", post(super::replace::replace))
                .route_layer(middleware::from_fn_with_state(state.clone(), forward)),
        )
        .merge(bench)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // `layer` wraps every route and the fallback after routing, so
        // `observe` sees the matched route pattern (none for the fallback).
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(DefaultBodyLimit::max(BODY_LIMIT));
    let router = match request_timeout {
        Some(limit) => router.layer(middleware::from_fn_with_state(limit, bounded)),
        None => router,
    };
    router
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}

/// Sweeps expired leases every second, and forgets deleted Proxies when
/// the Proxies changed.
pub async fn sweep(state: ApiState, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    let mut seen = None;
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tick.tick() => {
                let n = state.leases.sweep();
                state.metrics.lease_event("expired", n as u64);
                state.forget_deleted(&mut seen);
            }
        }
    }
}

/// Serves the API on `addr` within `limits` until `shutdown` resolves
/// (graceful), with the lease sweeper alongside.
pub async fn serve(
    addr: SocketAddr,
    state: ApiState,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    serve_within(listener, state, limits, shutdown).await
}

/// As [`serve`], on a bound listener (tests bind port 0).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    state: ApiState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_within(listener, state, DISCOVERY_LIMITS, shutdown).await
}

/// As [`serve_on`], within given connection limits (tests shorten them).
pub async fn serve_within(
    listener: tokio::net::TcpListener,
    state: ApiState,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if !state.authenticated() {
        warn!(
            "DISCOVERY_TOKEN is not set and --allow-unauthenticated-discovery is given: the discovery and lease API serves WITHOUT authentication"
        );
    }
    let (tx, rx) = tokio::sync::watch::channel(false);
    // The background work beside the server, each stopped with it.
    let stopped = || {
        let mut rx = rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let sweeper = tokio::spawn(sweep(state.clone(), stopped()));
    let follower = tokio::spawn(crate::replica::copy::follow(state.copier(), stopped()));
    let deliverer = tokio::spawn(crate::replica::to_leader::deliver(
        state.teller(),
        stopped(),
    ));
    let credentials = tokio::spawn(crate::replica::credentials_copy::follow_credentials(
        (state.forward.clone(), state.credentials.clone()),
        state.observer,
        stopped(),
    ));
    let refresher = tokio::spawn(state.clone().refresh_listing(stopped()));
    // The router bounds each request itself (its JSON 408 is logged and
    // counted); the accept loop keeps the connection bounds.
    let peers = state.peers.clone();
    let app = router(state, limits.request_timeout);
    let server_limits = Limits {
        request_timeout: None,
        ..limits
    };
    let res = crate::server::serve_trusting(listener, app, server_limits, peers, async move {
        shutdown.await;
        let _ = tx.send(true);
    })
    .await;
    drop(rx);
    let _ = sweeper.await;
    let _ = follower.await;
    let _ = deliverer.await;
    let _ = credentials.await;
    let _ = refresher.await;
    res
}
