//! The answers the gateway gives a crawler, each marked with whose
//! failure it is (`blame`): its own refusals, the upstream's answer about
//! the target relayed, and the marks a session's move adds. Every layer
//! of a request (sign-in, choice, connect, relay) answers through here.

use axum::body::Body;
use http::header::{HeaderName, HeaderValue, PROXY_AUTHENTICATE};
use http::{Response, StatusCode};

use super::blame::Failure;
use super::upstream::{TargetAnswer, UpstreamError};

/// Set on an answer whose session moved to another upstream.
pub const SESSION_MOVED: &str = "x-gateway-session-moved";

/// The realm of the gateway's `407`s.
const REALM: &str = "Basic realm=\"egress-proxies-operator gateway\"";

/// A refusal of the gateway's own: `status` with `reason` as its body,
/// marked with whose failure the status stands for.
pub(super) fn answer(status: StatusCode, reason: &str) -> Response<Body> {
    let mut r = Response::new(Body::from(format!("{reason}\n")));
    *r.status_mut() = status;
    let whose = match status {
        StatusCode::BAD_GATEWAY => Failure::Proxy,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => Failure::Gateway,
        _ => Failure::Client,
    };
    let mut r = whose.mark(r);
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if status == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
        r.headers_mut()
            .insert(PROXY_AUTHENTICATE, HeaderValue::from_static(REALM));
    }
    r
}

/// The answer when no upstream is left to try: `503` with a Retry-After
/// when none was usable, `502` naming the last upstream failure.
pub(super) fn no_upstream(
    err: super::route::NoUpstream,
    failed: Option<UpstreamError>,
) -> Response<Body> {
    match failed {
        Some(e) => answer(StatusCode::BAD_GATEWAY, &e.to_string()),
        None => {
            let mut r = answer(StatusCode::SERVICE_UNAVAILABLE, &err.to_string());
            r.headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from_static("5"));
            r
        }
    }
}

/// `r`, saying the session moved to another upstream when it did.
pub(super) fn moved(mut r: Response<Body>, moved: bool) -> Response<Body> {
    if moved {
        r.headers_mut().insert(
            HeaderName::from_static(SESSION_MOVED),
            HeaderValue::from_static("true"),
        );
    }
    r
}

/// The upstream's answer about the target, as the crawler gets it.
pub(super) fn relay_refusal(refused: TargetAnswer) -> Response<Body> {
    let mut r = Response::new(Body::from(refused.body));
    *r.status_mut() = StatusCode::from_u16(refused.status).unwrap_or(StatusCode::BAD_GATEWAY);
    r.headers_mut().extend(refused.headers);
    Failure::Target.mark(r)
}

/// The `502` once every upstream tried failed, naming the last failure.
pub(super) fn exhausted(failed: Option<UpstreamError>) -> Response<Body> {
    let e = failed.map_or_else(|| "no upstream".to_string(), |e| e.to_string());
    answer(StatusCode::BAD_GATEWAY, &e)
}
