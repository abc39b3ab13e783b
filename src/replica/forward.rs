//! Lease calls on a replica that does not lead: forwarded to the leader,
//! whose lease store alone grants capacity, so however many replicas
//! serve, a proxy is granted from one table (docs/architecture.md, "One
//! capacity view"). The decision is pure ([`route`]); [`Forwarder`] is the
//! thin shell that relays one request.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::Response;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use tracing::warn;

use super::internal::{
    answer_checks, sign_forward, Forward, CLIENT_HEADER, DEADLINE_HEADER, FORWARD_HEADER,
    REQUEST_KEY_HEADER,
};
use crate::lease::LeaseKey;
use crate::provider::error::plain_message;

/// What the follower keeps of its wait for the leader to use itself: the
/// leader's deadline ends this much before the follower gives up, so a
/// lease is never granted after the follower answered 503.
const DEADLINE_MARGIN: Duration = Duration::from_millis(500);

/// The test hook that holds every forwarded call this long (milliseconds)
/// before the leader serves it: a slow leader on demand.
pub const HOLD_ENV: &str = "PROXY_OPERATOR_TEST_HOLD_FORWARDED_MS";

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
    /// The election Lease names a URL without a seal of this installation
    /// (forged, or another installation's): nothing is sent to it.
    Unverified,
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
    /// The Lease names a URL that is not sealed with the shared key.
    Unverified,
    /// The leader refused this replica's forward signature (the replicas
    /// sign with different lease keys).
    Refused,
    /// The answer did not carry the leader's seal for this call: not
    /// relayed to the crawler.
    Unsealed,
}

impl Unavailable {
    /// The `outcome` label of the forward counter.
    pub fn as_str(self) -> &'static str {
        match self {
            Unavailable::NoLeader => "no_leader",
            Unavailable::NotLeader => "not_leader",
            Unavailable::Unreachable => "unreachable",
            Unavailable::Timeout => "timeout",
            Unavailable::Unverified => "unverified",
            Unavailable::Refused => "refused",
            Unavailable::Unsealed => "unsealed",
        }
    }

    /// What a 503 tells the caller, in plain words.
    pub fn message(self) -> &'static str {
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
            Unavailable::Unverified => {
                "the leader election Lease names a discovery URL that no replica of this installation sealed; nothing is forwarded to it; retry after Retry-After seconds"
            }
            Unavailable::Refused => {
                "the leading replica refused this replica's forward signature (do the replicas share the lease key Secret?); retry after Retry-After seconds"
            }
            Unavailable::Unsealed => {
                "the answer from the leader's address did not carry its seal for this call, so it was not passed on; retry after Retry-After seconds"
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
        (Leader::Unverified, _) => Route::Unavailable(Unavailable::Unverified),
    }
}

/// The follower's side: where the leader is, one pooled HTTP client, and
/// the waits.
pub struct Forwarder {
    pub(crate) leader: Arc<dyn Fn() -> Leader + Send + Sync>,
    pub(crate) client: HttpClient<HttpConnector, Body>,
    timeout: Duration,
    retry_after: Duration,
    /// Signs forwards and checks those that arrive; `None`: none are sent
    /// signed or taken (a replica without an election).
    pub(crate) key: Option<LeaseKey>,
    /// A manager's: checks the calls gateway processes sign with the
    /// gateway key (replica calls, never a full replica's).
    pub(crate) gateway_key: Option<LeaseKey>,
    /// The test hook's hold ([`HOLD_ENV`]).
    pub(crate) hold: Option<Duration>,
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
        let hold = std::env::var(HOLD_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis);
        Forwarder {
            leader,
            client,
            timeout,
            retry_after,
            key: None,
            gateway_key: None,
            hold,
        }
    }

    /// Signs and checks forwards with `key`, the shared lease key.
    pub fn with_key(self, key: LeaseKey) -> Self {
        Forwarder {
            key: Some(key),
            ..self
        }
    }

    /// Also takes calls signed with `key`, the gateway key, as a
    /// gateway's.
    pub fn with_gateway_key(self, key: Option<LeaseKey>) -> Self {
        Forwarder {
            gateway_key: key,
            ..self
        }
    }

    /// A replica that always leads (no leader election).
    pub fn alone() -> Self {
        Self::new(Arc::new(|| Leader::Me), FORWARD_TIMEOUT, Duration::ZERO)
    }

    /// How long a 503 tells the caller to wait.
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// Relays `req` of `client` to the leader at `base` and its answer
    /// back: signed for that client, never with the crawler's token; a
    /// call whose answer is lost in transit is sent once more with the
    /// same request key (the leader answers it with the same lease), while
    /// the leader's deadline still ends before this replica gives up.
    pub(crate) async fn relay(
        &self,
        base: &str,
        parts: axum::http::request::Parts,
        body: Bytes,
        client: &str,
    ) -> Result<Response, Unavailable> {
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let uri: Uri = format!("{}{path}", base.trim_end_matches('/'))
            .parse()
            .map_err(|_| Unavailable::Unreachable)?;
        let started = tokio::time::Instant::now();
        let request_key = crate::lease::random_id();
        let attempt = |budget: Duration| {
            let deadline_ms = budget.as_millis().to_string();
            let f = Forward {
                method: parts.method.as_str(),
                path,
                client,
                request_key: &request_key,
                deadline_ms: &deadline_ms,
                body: &body,
            };
            let mut out = Request::builder()
                .method(parts.method.clone())
                .uri(uri.clone());
            let mut signed = String::new();
            if let Some(h) = out.headers_mut() {
                copy(&parts.headers, h, &[header::CONTENT_TYPE]);
                if let Some(key) = &self.key {
                    signed = sign_forward(key, &f, chrono::Utc::now().timestamp_millis());
                    h.extend(header_values([
                        (FORWARD_HEADER, signed.as_str()),
                        (CLIENT_HEADER, client),
                        (REQUEST_KEY_HEADER, request_key.as_str()),
                        (DEADLINE_HEADER, deadline_ms.as_str()),
                    ]));
                }
                inject_trace_context(h);
            }
            out.body(Body::from(body.clone())).map(|r| (r, signed))
        };
        let mut sent = 0;
        let answer = loop {
            sent += 1;
            let left = self.timeout.saturating_sub(started.elapsed());
            let budget = left.saturating_sub(DEADLINE_MARGIN);
            let (out, signed) = attempt(budget).map_err(|_| Unavailable::Unreachable)?;
            match tokio::time::timeout(left, self.exchange(base, out)).await {
                Err(_) => return Err(Unavailable::Timeout),
                Ok(Ok(answer)) => break (answer, signed),
                Ok(Err(why)) if sent > 1 || budget.is_zero() => return Err(why),
                Ok(Err(_)) => continue,
            }
        };
        let ((parts, bytes), signed) = answer;
        if parts.status == StatusCode::UNAUTHORIZED {
            warn!(leader = %base, "The leader refused this replica's forward signature");
            return Err(Unavailable::Refused);
        }
        if let Some(key) = &self.key {
            if !answer_checks(
                key,
                &signed,
                (parts.status.as_u16(), &parts.headers, &bytes),
            ) {
                warn!(leader = %base, status = %parts.status, "An answer from the leader's address lacks its seal for the call; not relayed");
                return Err(Unavailable::Unsealed);
            }
        }
        let mut resp = Response::new(Body::from(bytes));
        *resp.status_mut() = parts.status;
        copy(&parts.headers, resp.headers_mut(), &RELAYED);
        Ok(resp)
    }

    /// One request to the leader and its whole answer.
    async fn exchange(
        &self,
        base: &str,
        out: Request,
    ) -> Result<(axum::http::response::Parts, Bytes), Unavailable> {
        let resp = self.client.request(out).await.map_err(|e| {
            warn!(leader = %base, error = %plain_message(&e), "Cannot forward a lease call to the leader");
            Unavailable::Unreachable
        })?;
        let (parts, body) = resp.into_parts();
        let bytes: Bytes = axum::body::to_bytes(Body::new(body), RELAY_LIMIT)
            .await
            .map_err(|_| Unavailable::Unreachable)?;
        Ok((parts, bytes))
    }
}

/// Header pairs, those whose value is not a valid header value left out
/// (a client name is a Kubernetes-style name, always valid).
fn header_values<'a>(
    pairs: impl IntoIterator<Item = (&'static str, &'a str)> + 'a,
) -> impl Iterator<Item = (Option<HeaderName>, HeaderValue)> + 'a {
    pairs.into_iter().filter_map(|(name, value)| {
        let v = HeaderValue::from_str(value).ok()?;
        Some((Some(HeaderName::from_static(name)), v))
    })
}

/// When a forwarded call must be answered by: its arrival plus the budget
/// the follower gave.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline(pub(crate) tokio::time::Instant);

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
