//! Absolute-form requests (`GET http://…`) through an upstream: the
//! client connection keeps one upstream connection while its requests ask
//! the same; hop-by-hop headers stay on their hop.

use std::sync::Arc;

use axum::body::Body;
use http::header::{HeaderName, HeaderValue, PROXY_AUTHORIZATION};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::client::conn::http1 as client_http1;
use hyper_util::rt::TokioIo;
use tracing::{debug, info, warn};

use super::answers::{answer, exhausted, moved, no_upstream};
use super::blame::{self, Failure};
use super::counts::{ClientSlot, Slot};
use super::route::{Ask, Gateway};
use super::upstream::{self, UpstreamError};
use super::username::Wanted;
use super::Upstream;

/// The upstream connection a client connection's plain-http requests
/// reuse while they ask the same.
pub(super) struct Kept {
    client: Arc<str>,
    wanted: Wanted,
    up: Upstream,
    sender: client_http1::SendRequest<Body>,
    _slots: (Slot, ClientSlot),
}

/// Set on an answer whose status banned its upstream for the site.
pub const BANNED: &str = "x-gateway-upstream-banned";

pub(super) type KeptCell = Arc<tokio::sync::Mutex<Option<Kept>>>;

/// Headers that belong to one hop and are not relayed.
const HOP: [&str; 7] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "upgrade",
];

fn strip_hop_headers(h: &mut http::HeaderMap) {
    let listed: Vec<HeaderName> = h
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in listed {
        h.remove(n);
    }
    for n in HOP {
        h.remove(n);
    }
}

/// An absolute-form request (`GET http://…`): relayed on the client
/// connection's upstream connection while it asks the same, otherwise on
/// a new one (a second upstream is tried when the first cannot be
/// reached; a request already sent is never sent again).
pub(super) async fn forward(
    gw: Arc<Gateway>,
    kept: KeptCell,
    ask: Ask,
    req: Request<Incoming>,
) -> Response<Body> {
    let uri = req.uri();
    if uri.scheme().is_none() || uri.authority().is_none() {
        return answer(
            StatusCode::BAD_REQUEST,
            "this is a proxy: send absolute-form requests (GET http://host/path) or CONNECT",
        );
    }
    let site = Gateway::site_of(uri.authority());
    let to = (&ask.client, site.as_deref());
    let mut kept = kept.lock().await;
    let reusable = kept.as_ref().is_some_and(|k| {
        k.client == ask.client
            && k.wanted == ask.wanted
            && !k.sender.is_closed()
            && gw.still_usable(to, &ask.filter, &k.up.key)
    });
    let mut was_moved = false;
    if !reusable {
        *kept = None;
        match open(&gw, &ask, site.as_deref()).await {
            Ok((k, m)) => {
                was_moved = m;
                *kept = Some(k);
            }
            Err(refused) => return refused,
        }
    }
    let Some(k) = kept.as_mut() else {
        return answer(StatusCode::BAD_GATEWAY, "no upstream connection");
    };
    let up_auth = k.up.authorization.clone();
    let (mut parts, body) = req.into_parts();
    strip_hop_headers(&mut parts.headers);
    if let Some(auth) = up_auth.and_then(|a| HeaderValue::from_str(&a).ok()) {
        parts.headers.insert(PROXY_AUTHORIZATION, auth);
    }
    parts.version = http::Version::HTTP_11;
    let sent = k
        .sender
        .send_request(Request::from_parts(parts, Body::new(body)))
        .await;
    let key = k.up.key.clone();
    // Squid's own error page (`X-Squid-Error`) speaks for the upstream,
    // not the site: about the target, relayed and marked so; about the
    // upstream itself, its failure.
    let squid = |r: &Response<Incoming>| {
        r.headers()
            .get("x-squid-error")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let whose = sent.as_ref().ok().and_then(|r| {
        let squid = squid(r);
        let status = r.status().as_u16();
        (status == 407 || squid.is_some()).then(|| blame::of_answer(status, squid.as_deref()))
    });
    match sent {
        Ok(resp) if whose == Some(Failure::Proxy) => {
            let credentials = resp.status() == StatusCode::PROXY_AUTHENTICATION_REQUIRED;
            let (class, what) = match credentials {
                true => (
                    "credentials",
                    "refused the gateway's credentials".to_string(),
                ),
                false => (
                    "refused",
                    format!("failed: {}", squid(&resp).unwrap_or_default()),
                ),
            };
            warn!(upstream = %key, "The upstream proxy {what}");
            gw.metrics.upstream_error(class);
            gw.suspect(&key);
            *kept = None;
            answer(
                StatusCode::BAD_GATEWAY,
                &format!("the upstream proxy {what}"),
            )
        }
        Ok(resp) if whose == Some(Failure::Target) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_headers(&mut parts.headers);
            let r = Failure::Target.mark(Response::from_parts(parts, Body::new(body)));
            moved(r, was_moved)
        }
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_headers(&mut parts.headers);
            let banned = gw.settings.ban_statuses.contains(&parts.status.as_u16());
            if let (true, Some(site)) = (banned, site.as_deref()) {
                // The site refuses this upstream: it cools down for the
                // site, and this connection's next request chooses anew.
                info!(upstream = %key, site, status = parts.status.as_u16(), "A site banned a gateway upstream; cooling it down for the site");
                gw.fleet.cool_down(&ask.client, &key, Some(site));
                gw.metrics.upstream_error("banned");
                parts.headers.insert(
                    HeaderName::from_static(BANNED),
                    HeaderValue::from_static("true"),
                );
                *kept = None;
            }
            moved(Response::from_parts(parts, Body::new(body)), was_moved)
        }
        Err(e) => {
            info!(upstream = %key, error = %e, "A request through the gateway failed upstream");
            gw.metrics.upstream_error("protocol");
            *kept = None;
            answer(
                StatusCode::BAD_GATEWAY,
                &format!("the upstream proxy failed: {e}"),
            )
        }
    }
}

/// A new upstream connection for `ask`: its first choice, or a second
/// upstream when that one cannot be reached. Says whether the session
/// moved.
async fn open(gw: &Gateway, ask: &Ask, site: Option<&str>) -> Result<(Kept, bool), Response<Body>> {
    let Some(client_slot) = gw.admit(&ask.client) else {
        return Err(answer(
            StatusCode::TOO_MANY_REQUESTS,
            "this client holds its cap of gateway connections",
        ));
    };
    let started = std::time::Instant::now();
    let mut failed: Option<UpstreamError> = None;
    let mut avoid = None;
    for _ in 0..2 {
        let chosen = gw
            .choose(
                (&ask.client, site),
                &ask.wanted,
                &ask.filter,
                avoid.as_ref(),
            )
            .map_err(|e| no_upstream(e, failed.take()))?;
        let up: Upstream = chosen.upstream;
        tracing::Span::current().record("upstream", tracing::field::display(&up.key));
        let conn = upstream::dial(&up, gw.settings.upstream_timeout).await;
        let handshake = match conn {
            // An upstream's (or a site's) answer head is bounded as the
            // crawlers' request heads are: hyper's default would buffer
            // about 408 KiB of an unfinished one per kept connection.
            Ok(c) => client_http1::Builder::new()
                .max_buf_size(crate::server::MAX_HEAD)
                .handshake(TokioIo::new(c))
                .await
                .map_err(|e| UpstreamError::Closed(std::io::Error::other(e))),
            Err(e) => Err(e),
        };
        match handshake {
            Ok((sender, driver)) => {
                gw.metrics.set_up(started.elapsed());
                tokio::spawn(async move {
                    if let Err(e) = driver.await {
                        debug!(error = %e, "Gateway upstream connection ended");
                    }
                });
                let kept = Kept {
                    client: ask.client.clone(),
                    wanted: ask.wanted.clone(),
                    _slots: (gw.occupy(&up.key), client_slot),
                    up,
                    sender,
                };
                return Ok((kept, chosen.moved || failed.is_some()));
            }
            Err(e) => {
                gw.failed(&up.key, &e);
                avoid = Some(up.key);
                failed = Some(e);
            }
        }
    }
    Err(exhausted(failed))
}
