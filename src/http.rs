//! The small HTTP endpoints every replica serves: `/healthz` (a plain
//! ping), `/readyz` (ready once the Proxy cache has synced; provider health
//! deliberately never makes the operator unready) and Prometheus `/metrics`
//! (HTTPS for authorized scrapers by default, see [`metrics_auth`]), each
//! within [`server::PROBE_LIMITS`] (connection cap, header, body and
//! request timeouts).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::metrics::Exposition;
use crate::metrics_auth;
use crate::server;

/// Whether `/readyz` answers ready: once the Proxy cache has synced for
/// the first time (the discovery API serves from it), and from then on.
#[derive(Clone, Debug, Default)]
pub struct Readiness(
    Arc<AtomicBool>,
    Arc<std::sync::Mutex<std::collections::BTreeMap<&'static str, String>>>,
);

impl Readiness {
    /// Not ready yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The Proxy cache has synced.
    pub fn set_ready(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`Readiness::set_ready`] was called.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Something a reader of `/readyz` should know though the replica
    /// serves (a degraded mode), shown after `ok`.
    pub fn set_detail(&self, detail: &str) {
        self.set_detail_of("lease key", Some(detail.to_string()));
    }

    /// [`Readiness::set_detail`] for one `source` of details, or its
    /// detail gone (`None`); each source's detail is shown, in order.
    pub fn set_detail_of(&self, source: &'static str, detail: Option<String>) {
        let mut all = self.1.lock().unwrap_or_else(|p| p.into_inner());
        match detail {
            Some(d) => all.insert(source, d),
            None => all.remove(source),
        };
    }

    /// The answer to `/readyz`.
    pub fn answer(&self) -> (StatusCode, String) {
        if !self.is_ready() {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "the Proxy cache has not synced yet".to_string(),
            );
        }
        let details = self.1.lock().unwrap_or_else(|p| p.into_inner());
        let mut answer = "ok".to_string();
        for d in details.values() {
            answer.push_str("; ");
            answer.push_str(d);
        }
        (StatusCode::OK, answer)
    }
}

/// Serves `/healthz` (always `ok`) and `/readyz` (503 until `ready`) until
/// `shutdown` resolves.
pub async fn serve_probes(
    addr: SocketAddr,
    ready: Readiness,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let answer = ready.answer();
                async move { answer }
            }),
        );
    let listener = tokio::net::TcpListener::bind(addr).await?;
    server::serve(listener, app, server::PROBE_LIMITS, shutdown).await
}

/// Secure `/metrics`: the TLS settings, and who checks scrape tokens.
pub struct MetricsAuth {
    pub tls: Arc<rustls::ServerConfig>,
    pub reviewer: Arc<metrics_auth::Reviewer>,
}

/// Serves `/metrics` until `shutdown` resolves: over HTTPS to authorized
/// tokens only with `auth`, else over plain HTTP to anyone.
pub async fn serve_metrics(
    addr: SocketAddr,
    metrics: Exposition,
    auth: Option<MetricsAuth>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new().route(
        "/metrics",
        get(move |headers: HeaderMap| {
            let metrics = metrics.clone();
            async move {
                // OpenMetrics for scrapers that ask for it (Prometheus
                // does), the classic text format otherwise.
                let openmetrics = headers
                    .get(header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.contains("application/openmetrics-text"));
                let (body, content_type) = if openmetrics {
                    (
                        metrics.encode(),
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )
                } else {
                    (
                        metrics.encode_prometheus_text(),
                        "text/plain; version=0.0.4; charset=utf-8",
                    )
                };
                match body {
                    Ok(body) => (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], body)
                        .into_response(),
                    Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(addr).await?;
    match auth {
        None => server::serve(listener, app, server::PROBE_LIMITS, shutdown).await,
        Some(auth) => {
            let app = app.layer(axum::middleware::from_fn_with_state(
                auth.reviewer,
                metrics_auth::authorize,
            ));
            let tls = tokio_rustls::TlsAcceptor::from(auth.tls);
            server::serve_tls(listener, app, server::PROBE_LIMITS, tls, shutdown).await
        }
    }
}
