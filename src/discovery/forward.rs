//! Lease calls on a replica that does not lead: forwarded to the leader,
//! whose lease store alone grants capacity, so however many replicas
//! serve, a proxy is granted from one table (docs/architecture.md, "One
//! capacity view"). The decision is pure ([`route`]); [`Forwarder`] is the
//! thin shell that relays one request.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use tracing::{warn, Instrument};

use super::error::ApiError;
use super::middleware::BODY_LIMIT;
use super::state::ApiState;
use crate::provider::error::plain_message;

/// Marks a request a follower forwarded: a replica that gets one and does
/// not lead answers 503 rather than forward it again (no loops).
pub const FORWARDED_HEADER: &str = "x-egress-forwarded";

/// How long a follower waits for the leader (connect and answer) before
/// it answers 503 `leader_unavailable`.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(2);

/// The largest answer relayed from the leader (its answers are small JSON).
const RELAY_LIMIT: usize = 1024 * 1024;

/// The headers of the leader's answer a follower passes on.
const RELAYED: [HeaderName; 4] = [
    header::CONTENT_TYPE,
    header::LOCATION,
    header::RETRY_AFTER,
    header::WWW_AUTHENTICATE,
];

/// Where the lease table is, as this replica last saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leader {
    /// This replica leads (or runs without leader election).
    Me,
    /// Another replica leads; its discovery API's base URL.
    At(String),
    /// No leader is known, or it published no URL.
    Unknown,
}

/// What to do with a lease call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// Serve it from this replica's lease store.
    Local,
    /// Relay it to the leader at this base URL.
    Forward(String),
    /// Answer 503 `leader_unavailable`; the reason is the metric outcome.
    Unavailable(Unavailable),
}

/// Why a follower cannot get a lease call answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// No leader is known (an election is under way).
    NoLeader,
    /// The request was forwarded here, but this replica does not lead.
    NotLeader,
    /// The leader could not be connected to, or its URL is unusable.
    Unreachable,
    /// The leader did not answer within the forward timeout.
    Timeout,
}

impl Unavailable {
    /// The `outcome` label of the forward counter.
    pub fn as_str(self) -> &'static str {
        match self {
            Unavailable::NoLeader => "no_leader",
            Unavailable::NotLeader => "not_leader",
            Unavailable::Unreachable => "unreachable",
            Unavailable::Timeout => "timeout",
        }
    }

    fn message(self) -> &'static str {
        match self {
            Unavailable::NoLeader => {
                "no operator replica leads right now (a leader election is under way); retry after Retry-After seconds"
            }
            Unavailable::NotLeader => {
                "the request was forwarded to a replica that no longer leads; retry after Retry-After seconds"
            }
            Unavailable::Unreachable => {
                "the leading replica, which holds the lease table, cannot be reached; retry after Retry-After seconds"
            }
            Unavailable::Timeout => {
                "the leading replica, which holds the lease table, did not answer in time; retry after Retry-After seconds"
            }
        }
    }
}

/// The decision for a lease call: the leader serves it, a follower
/// forwards it once, and a forwarded call never travels on.
pub fn route(leader: &Leader, forwarded: bool) -> Route {
    match (leader, forwarded) {
        (Leader::Me, _) => Route::Local,
        (Leader::At(url), false) => Route::Forward(url.clone()),
        (Leader::At(_), true) => Route::Unavailable(Unavailable::NotLeader),
        (Leader::Unknown, _) => Route::Unavailable(Unavailable::NoLeader),
    }
}

/// The follower's side: where the leader is, one pooled HTTP client, and
/// the waits.
pub struct Forwarder {
    leader: Arc<dyn Fn() -> Leader + Send + Sync>,
    client: HttpClient<HttpConnector, Body>,
    timeout: Duration,
    retry_after: Duration,
}

impl Forwarder {
    /// A forwarder asking `leader` where the leader is at each call;
    /// `retry_after` is what a 503 tells the caller to wait.
    pub fn new(
        leader: Arc<dyn Fn() -> Leader + Send + Sync>,
        timeout: Duration,
        retry_after: Duration,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        connector.set_nodelay(true);
        let client = HttpClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Forwarder {
            leader,
            client,
            timeout,
            retry_after,
        }
    }

    /// A replica that always leads (no leader election).
    pub fn alone() -> Self {
        Self::new(Arc::new(|| Leader::Me), FORWARD_TIMEOUT, Duration::ZERO)
    }

    fn unavailable(&self, why: Unavailable) -> Response {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "leader_unavailable",
            why.message(),
        )
        .retry_after(self.retry_after.max(Duration::from_secs(1)))
        .into_response()
    }

    /// Relays `req` to the leader at `base` and its answer back.
    async fn relay(
        &self,
        base: &str,
        parts: axum::http::request::Parts,
        body: Bytes,
    ) -> Result<Response, Unavailable> {
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let uri: Uri = format!("{}{path}", base.trim_end_matches('/'))
            .parse()
            .map_err(|_| Unavailable::Unreachable)?;
        let mut out = Request::builder().method(parts.method).uri(uri);
        if let Some(h) = out.headers_mut() {
            copy(
                &parts.headers,
                h,
                &[header::AUTHORIZATION, header::CONTENT_TYPE],
            );
            h.insert(FORWARDED_HEADER, HeaderValue::from_static("1"));
            inject_trace_context(h);
        }
        let out = out
            .body(Body::from(body))
            .map_err(|_| Unavailable::Unreachable)?;
        let answer = async {
            let resp = self.client.request(out).await.map_err(|e| {
                warn!(leader = %base, error = %plain_message(&e), "Cannot forward a lease call to the leader");
                Unavailable::Unreachable
            })?;
            let (parts, body) = resp.into_parts();
            let bytes: Bytes = axum::body::to_bytes(Body::new(body), RELAY_LIMIT)
                .await
                .map_err(|_| Unavailable::Unreachable)?;
            Ok::<_, Unavailable>((parts, bytes))
        };
        let (parts, bytes) = tokio::time::timeout(self.timeout, answer)
            .await
            .map_err(|_| Unavailable::Timeout)??;
        let mut resp = Response::new(Body::from(bytes));
        *resp.status_mut() = parts.status;
        copy(&parts.headers, resp.headers_mut(), &RELAYED);
        Ok(resp)
    }
}

/// `from`'s values of `names`, copied into `to`.
fn copy(from: &HeaderMap, to: &mut HeaderMap, names: &[HeaderName]) {
    for name in names {
        if let Some(v) = from.get(name) {
            to.insert(name.clone(), v.clone());
        }
    }
}

/// The forward span's context as `traceparent`, so the leader's server
/// span joins the caller's trace.
fn inject_trace_context(headers: &mut HeaderMap) {
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry_http::HeaderInjector;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let cx = tracing::Span::current().context();
    opentelemetry_sdk::propagation::TraceContextPropagator::new()
        .inject_context(&cx, &mut HeaderInjector(headers));
}

fn too_large() -> Response {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!("request body exceeds {BODY_LIMIT} bytes"),
    )
    .into_response()
}

/// Around the lease routes: served here when this replica leads, relayed
/// to the leader otherwise, 503 `leader_unavailable` with `Retry-After`
/// when the leader is not known or not reached, never a grant this
/// replica could not back.
pub(super) async fn forward(State(s): State<ApiState>, req: Request, next: Next) -> Response {
    let forwarded = req.headers().contains_key(FORWARDED_HEADER);
    let f = &s.forward;
    let outcome = match route(&(f.leader)(), forwarded) {
        Route::Local => return next.run(req).await,
        Route::Unavailable(why) => Err(why),
        Route::Forward(base) => {
            // Read here, so an oversized body is this replica's 413 and
            // not counted as forwarded.
            let (parts, body) = req.into_parts();
            let Ok(body) = axum::body::to_bytes(body, BODY_LIMIT).await else {
                return too_large();
            };
            let span = tracing::info_span!("forward", otel.kind = "client", leader = %base);
            f.relay(&base, parts, body).instrument(span).await
        }
    };
    match outcome {
        Ok(resp) => {
            s.metrics.forwarded("relayed");
            resp
        }
        Err(why) => {
            s.metrics.forwarded(why.as_str());
            f.unavailable(why)
        }
    }
}
