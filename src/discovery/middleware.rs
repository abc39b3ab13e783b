//! The outer layer of every route, outermost first: panic recovery, one
//! server span and one `request` log line per request, the route metrics
//! (all in [`observe`]); the whole-request timeout ([`bounded`]); the body
//! cap; bearer auth ([`auth`]).
//!
//! The router applies these with `Router::layer`, which wraps each route
//! after routing, so the matched route pattern (axum's [`MatchedPath`]) is
//! known here: span names and metric labels never carry a lease id, and
//! the request log line names a lease by a short digest of its id
//! ([`loggable_path`]): an id is the bearer's hold on its lease.

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::FutureExt;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_http::HeaderExtractor;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use sha2::Digest as _;
use tracing::{debug, info, warn, Instrument};

use super::error::ApiError;
use super::state::{ApiState, Client, ANONYMOUS};
use crate::lease::LeaseKey;
use crate::replica::forward::{route, Deadline, Forwarder, Route, Unavailable};
use crate::replica::internal::{
    header_text, verify_forward, Forward, ANSWER_HEADER, CLIENT_HEADER, DEADLINE_HEADER,
    FORWARD_HEADER, REQUEST_KEY_HEADER,
};

pub use super::request::BODY_LIMIT;

/// The route label of a request no route matched (404s): one fixed value,
/// so unknown paths cannot grow the label set.
pub const UNMATCHED: &str = "unmatched";

/// `METHOD /route/{pattern}`: the span name and the `route` label. Label
/// values stay bounded: known methods and route patterns only.
pub fn route_label(method: &str, matched: Option<&str>) -> String {
    let m = match method {
        "GET" | "POST" | "DELETE" | "PUT" | "PATCH" | "HEAD" | "OPTIONS" => method,
        _ => "OTHER",
    };
    format!("{m} {}", matched.unwrap_or(UNMATCHED))
}

/// `path` as the request log line shows it: a lease id after
/// `/v1/leases/` becomes `id:` and the first 8 hex digits of its SHA-256,
/// enough to follow one lease through a log and nothing to present.
pub fn loggable_path(path: &str) -> String {
    const LEASES: &str = "/v1/leases/";
    let Some(rest) = path.strip_prefix(LEASES) else {
        return path.to_string();
    };
    let (id, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if id.is_empty() {
        return path.to_string();
    }
    let digest = sha2::Sha256::digest(id.as_bytes());
    let short: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{LEASES}id:{short}{tail}")
}

/// The caller's span named by a W3C `traceparent` (and `tracestate`), as
/// the context to parent the server span on; `None` without a valid one.
/// `baggage` is not read.
pub fn remote_parent(headers: &HeaderMap) -> Option<opentelemetry::Context> {
    let cx = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    cx.has_active_span().then_some(cx)
}

/// Outermost: recover panics (500), one server span named after the route
/// pattern, one `request` log line, the route metrics.
pub(super) async fn observe(State(s): State<ApiState>, req: Request, next: Next) -> Response {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let start = Instant::now();
    let method = req.method().clone();
    let path = loggable_path(req.uri().path());
    let matched = req
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    let route = route_label(method.as_str(), matched);
    let traced = matched != Some("/healthz");
    let span = if traced {
        let span = tracing::info_span!("request", otel.name = %route, otel.kind = "server", http.route = %route, http.response.status_code = tracing::field::Empty, client = tracing::field::Empty);
        if let Some(parent) = remote_parent(req.headers()) {
            let _ = span.set_parent(parent);
        }
        span
    } else {
        tracing::Span::none()
    };
    let resp = match AssertUnwindSafe(next.run(req).instrument(span.clone()))
        .catch_unwind()
        .await
    {
        Ok(r) => r,
        Err(_) => {
            warn!(route = %route, "Handler panicked");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error",
            )
            .into_response()
        }
    };
    let status = resp.status().as_u16();
    let took = start.elapsed();
    // The token's name, never the token: set by `auth` on the answer.
    let client = resp
        .extensions()
        .get::<Client>()
        .map(|c| c.0.clone())
        .unwrap_or_default();
    span.record("http.response.status_code", status);
    span.record("client", &*client);
    s.metrics.observe_request(&route, status, &client, took);
    // One line per request at DEBUG: at thousands of leases a second an
    // INFO line each was a cost of its own. A server error stays at INFO.
    if traced {
        span.in_scope(|| {
            if status >= 500 {
                info!(method = %method, path = %path, status, client = %client, duration = ?took, "request");
            } else {
                debug!(method = %method, path = %path, status, client = %client, duration = ?took, "request");
            }
        });
    }
    resp
}

/// A whole request within `limit`, else `408 request_timeout`. Inside
/// [`observe`], so a timed-out request is logged and counted like any other
/// answer.
pub(super) async fn bounded(State(limit): State<Duration>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!(
                "the request was not answered within {}s (a body that arrives too slowly, or a busy server); retry",
                limit.as_secs_f64()
            ),
        )
        .into_response(),
    }
}

/// Paths served without a token: liveness and the API's description.
fn exempt(path: &str) -> bool {
    path == "/healthz" || path == "/openapi.json"
}

/// Bearer auth against the configured tokens (401 otherwise), when any is
/// set; the request carries the [`Client`] named by its token.
pub(super) async fn auth(State(s): State<ApiState>, req: Request, next: Next) -> Response {
    if req.headers().contains_key(FORWARD_HEADER) {
        return forwarded(&s, req, next).await;
    }
    if !s.tokens.required() {
        return with_client(req, Client(ANONYMOUS.into()), next).await;
    }
    if exempt(req.uri().path()) {
        return next.run(req).await;
    }
    let given = bearer(req.headers()).unwrap_or("");
    if let Some(name) = s.tokens.client_of(given) {
        with_client(req, Client(name), next).await
    } else {
        let mut resp = ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token",
        )
        .into_response();
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        resp
    }
}

/// A call another replica forwarded: it authenticated the crawler itself
/// and signed the call for that client with the shared key; this replica
/// checks the signature (never a crawler's token) and serves it as that
/// client's. A refused signature is 401 with the reason, for the follower
/// to report.
async fn forwarded(s: &ApiState, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, BODY_LIMIT).await else {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("request body exceeds {BODY_LIMIT} bytes"),
        )
        .into_response();
    };
    let h = |name: &str| header_text(&parts.headers, name);
    let client = h(CLIENT_HEADER);
    let f = Forward {
        method: parts.method.as_str(),
        path: parts.uri.path_and_query().map_or("/", |p| p.as_str()),
        client,
        request_key: h(REQUEST_KEY_HEADER),
        deadline_ms: h(DEADLINE_HEADER),
        body: &body,
    };
    let now = chrono::Utc::now().timestamp_millis();
    let signed = h(FORWARD_HEADER);
    // A gateway's key is tried only when the lease key does not match.
    let caller = match verify_forward(s.forward.key.as_ref(), signed, &f, now) {
        Ok(()) => Ok(super::feed::Replica { gateway: false }),
        Err(e) => match s.forward.gateway_key.as_ref() {
            Some(g) if verify_forward(Some(g), signed, &f, now).is_ok() => {
                Ok(super::feed::Replica { gateway: true })
            }
            _ => Err(e),
        },
    };
    let caller = match caller {
        Ok(c) => c,
        Err(e) => {
            warn!(reason = %e, "Refused a forwarded lease call");
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                format!("forwarded call refused: {e}"),
            )
            .into_response();
        }
    };
    if let Some(peer) = parts.extensions.get::<crate::server::Peer>() {
        s.peers.trust(peer.0);
    }
    let client = Client(client.into());
    let ask = signed.to_string();
    let mut req = Request::from_parts(parts, Body::from(body));
    req.extensions_mut().insert(caller);
    let resp = with_client(req, client, next).await;
    // Sealed with the key the call was signed with.
    let key = match caller.gateway {
        true => s.forward.gateway_key.as_ref(),
        false => s.forward.key.as_ref(),
    };
    seal_answer(key, &ask, resp).await
}

/// The answers to another replica's calls carry [`ANSWER_HEADER`]. The
/// largest is a lease table; a body past [`ANSWER_LIMIT`] is refused.
async fn seal_answer(key: Option<&LeaseKey>, ask: &str, resp: Response) -> Response {
    let Some(key) = key else {
        return resp;
    };
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, ANSWER_LIMIT).await else {
        return ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the answer to a replica exceeds its limit",
        )
        .into_response();
    };
    let seal = crate::replica::internal::seal_answer(key, ask, parts.status.as_u16(), &bytes);
    if let Ok(v) = header::HeaderValue::from_str(&seal) {
        parts.headers.insert(ANSWER_HEADER, v);
    }
    Response::from_parts(parts, Body::from(bytes))
}

/// The largest answer sealed for a replica: a lease table as large as any
/// follower takes.
const ANSWER_LIMIT: usize = crate::lease::wire::CEILING;

/// Runs `req` as `client`'s, and names the client on the answer for the
/// request log line and span.
async fn with_client(mut req: Request, client: Client, next: Next) -> Response {
    req.extensions_mut().insert(client.clone());
    let mut resp = next.run(req).await;
    resp.extensions_mut().insert(client);
    resp
}

/// 503 `leader_unavailable`, saying why and when to ask again.
fn leader_unavailable(f: &Forwarder, why: Unavailable) -> Response {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "leader_unavailable",
        why.message(),
    )
    .retry_after(f.retry_after().max(std::time::Duration::from_secs(1)))
    .into_response()
}

fn bearer(h: &HeaderMap) -> Option<&str> {
    let v = h.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
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
pub(super) async fn forward(State(s): State<ApiState>, mut req: Request, next: Next) -> Response {
    let arrived = tokio::time::Instant::now();
    let forwarded = req.headers().contains_key(FORWARD_HEADER);
    let f = &s.forward;
    let outcome = match route(&(f.leader)(), forwarded) {
        Route::Local if forwarded => {
            let budget = req
                .headers()
                .get(DEADLINE_HEADER)
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .map(Duration::from_millis);
            if let Some(budget) = budget {
                req.extensions_mut().insert(Deadline(arrived + budget));
            }
            if let Some(hold) = f.hold {
                // A stalled leader (CPU starved, a lock held long): the
                // call goes on after the stall in the same poll, however
                // the follower's connection fared meanwhile.
                tokio::task::block_in_place(|| std::thread::sleep(hold));
            }
            return next.run(req).await;
        }
        Route::Local => return next.run(req).await,
        Route::Unavailable(why) => Err(why),
        Route::Forward(base) => {
            let client = req
                .extensions()
                .get::<Client>()
                .map(|c| c.0.clone())
                .unwrap_or_else(|| ANONYMOUS.into());
            // Read here, so an oversized body is this replica's 413 and
            // not counted as forwarded.
            let (parts, body) = req.into_parts();
            let Ok(body) = axum::body::to_bytes(body, BODY_LIMIT).await else {
                return too_large();
            };
            let span = tracing::info_span!("forward", otel.kind = "client", leader = %base);
            f.relay(&base, parts, body, &client).instrument(span).await
        }
    };
    match outcome {
        Ok(resp) => {
            s.metrics.forwarded("relayed");
            resp
        }
        Err(why) => {
            s.metrics.forwarded(why.as_str());
            leader_unavailable(f, why)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::loggable_path;

    #[test]
    fn lease_ids_are_logged_as_a_short_digest() {
        let id = "v1.AAECAwQFBgcICQoLDA0ODw.secret-tag";
        for (path, kept) in [
            (format!("/v1/leases/{id}"), "/v1/leases/id:"),
            (format!("/v1/leases/{id}/renew"), "/v1/leases/id:"),
            (format!("/v1/leases/{id}/report"), "/v1/leases/id:"),
        ] {
            let shown = loggable_path(&path);
            assert!(shown.starts_with(kept), "{shown}");
            assert!(
                !shown.contains("secret-tag") && !shown.contains("AAECAw"),
                "{shown}"
            );
            assert_eq!(
                shown.len(),
                kept.len() + 8 + path.len() - "/v1/leases/".len() - id.len()
            );
        }
        // The same id, the same digest: one lease can be followed.
        assert_eq!(
            loggable_path(&format!("/v1/leases/{id}")),
            loggable_path(&format!("/v1/leases/{id}/renew")).trim_end_matches("/renew")
        );
        for plain in ["/v1/leases", "/v1/leases/", "/v1/proxies", "/healthz"] {
            assert_eq!(loggable_path(plain), plain);
        }
    }
}
