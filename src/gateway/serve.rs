//! The gateway's HTTP/1.1 front: authenticate the crawler, choose its
//! upstream, then relay a `CONNECT` tunnel or an absolute-form request
//! through it. Every refusal is a short plain-text reason with its status.

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use http::header::{HeaderValue, PROXY_AUTHORIZATION};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, info_span, warn, Instrument};

use super::admission::{Admission, Bounds, Places, SigningIn};
use super::answers::{answer, exhausted, moved, no_upstream, relay_refusal};
use super::blame::Failure;
use super::metrics::RequestLabels;
use super::route::{Ask, Gateway};
use super::upstream::{self, Opened, UpstreamError};
use super::username::{self, Wanted};
use crate::discovery::Filter;

/// How often expired sessions are forgotten.
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// Serves the gateway on `listener` until `stop` resolves, then drains:
/// no new connection is taken, an idle kept-alive one is closed, and
/// requests and tunnels in flight get up to the drain timeout to end.
pub async fn serve(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    stop: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let admission = Admission::new(Bounds {
        max_connections: gateway.settings.max_connections,
        max_per_address: gateway.settings.max_per_address,
    });
    let (closing, closed) = tokio::sync::watch::channel(false);
    let mut sweep = tokio::time::interval(SWEEP_EVERY);
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut stop => break,
            _ = sweep.tick() => {
                gateway.sweep();
                admission.sweep();
                continue;
            }
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors, say: wait instead of spinning.
                    debug!(error = %e, "Gateway accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let places = match admission.admit(peer.ip()) {
            Ok(p) => p,
            Err(why) => {
                debug!(%peer, reason = why.word(), "Gateway closing a new connection");
                gateway.metrics.connection_refused(why.word());
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (gw, closed) = (gateway.clone(), closed.clone());
        let (admission, ip) = (admission.clone(), peer.ip());
        tokio::spawn(async move {
            let Some(signing_in) = admission
                .signing_in(ip, gw.settings.header_read_timeout)
                .await
            else {
                debug!(%ip, "No sign-in place came free in time; closing the connection unread");
                gw.metrics.connection_refused("sign_in_wait");
                return;
            };
            let conn = Arc::new(Conn {
                ip,
                admission,
                places: Mutex::new(Some(places)),
                signing_in: Mutex::new(Some(signing_in)),
            });
            connection(gw, stream, conn, closed).await;
        });
    }
    drop(listener);
    let _ = closing.send(true);
    drain(&gateway, || admission.open()).await;
    Ok(())
}

/// One client connection's standing: its address, its places in the
/// counts (moved into its tunnel, if it opens one), and its sign-in
/// places until its first signed-in request.
pub(super) struct Conn {
    ip: std::net::IpAddr,
    admission: Arc<Admission>,
    places: Mutex<Option<Places>>,
    signing_in: Mutex<Option<SigningIn>>,
}

impl Conn {
    /// The connection's places, taken by the tunnel it became.
    fn take_places(&self) -> Option<Places> {
        self.places.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// A request of it signed in: its sign-in places go back.
    fn signed_in(&self) {
        drop(
            self.signing_in
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
    }
}

/// Waits until no client connection (`connections()`) and no upstream
/// connection (a tunnel's, a kept one's) is open, or the drain timeout.
async fn drain(gw: &Gateway, connections: impl Fn() -> usize) {
    let open = || connections() + gw.upstream_connections();
    if open() == 0 {
        return;
    }
    let limit = gw.settings.drain_timeout;
    info!(open = open(), limit = ?limit, "Gateway stopping: no new connections; waiting for those open to end");
    let deadline = tokio::time::Instant::now() + limit;
    while open() > 0 {
        if tokio::time::Instant::now() >= deadline {
            warn!(
                open = open(),
                "Gateway drain timeout: the connections still open are cut"
            );
            return;
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
    info!("Gateway drained: every connection ended");
}

/// How often a draining gateway looks whether its connections ended.
const DRAIN_POLL: Duration = Duration::from_millis(100);

use super::forward::forward;
pub(super) use super::forward::KeptCell;

async fn connection(
    gw: Arc<Gateway>,
    stream: TcpStream,
    conn: Arc<Conn>,
    mut closing: tokio::sync::watch::Receiver<bool>,
) {
    let kept: KeptCell = Arc::default();
    let timeout = gw.settings.header_read_timeout;
    let service = service_fn(move |req| {
        let (gw, kept, conn) = (gw.clone(), kept.clone(), conn.clone());
        async move { Ok::<_, Infallible>(handle(gw, kept, conn, req).await) }
    });
    let served = crate::server::http1_server(timeout)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(served);
    let ended = tokio::select! {
        r = served.as_mut() => r,
        // Stopping: a request in flight finishes (a CONNECT's tunnel goes
        // on by itself), then the connection closes instead of waiting
        // for the client's next request.
        () = async {
            let _ = closing.wait_for(|c| *c).await;
        } => {
            served.as_mut().graceful_shutdown();
            served.await
        }
    };
    if let Err(e) = ended {
        debug!(error = %e, "Gateway connection ended");
    }
}

/// The client, what its username asks and its compiled filter; or why
/// not (the body of a `407`).
fn authenticate<B>(gw: &Gateway, req: &Request<B>) -> Result<(Arc<str>, Wanted, Filter), String> {
    let Some(header) = req.headers().get(PROXY_AUTHORIZATION) else {
        return Err(
            "proxy credentials required: the username is your client name (with \
             optional -<key>-<value> parameters), the password your discovery token"
                .to_string(),
        );
    };
    let basic = header
        .to_str()
        .ok()
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("basic"))
        .and_then(|(_, b64)| data_encoding::BASE64.decode(b64.trim().as_bytes()).ok())
        .and_then(|raw| String::from_utf8(raw).ok());
    let Some((user, token)) = basic.as_deref().and_then(|b| b.split_once(':')) else {
        return Err("the proxy credentials must be Basic username:password".to_string());
    };
    let Some(client) = gw.fleet.client_of(token) else {
        return Err("the password is not a discovery token in force".to_string());
    };
    let wanted = username::parse(user, &client, gw.settings.max_session_ttl)
        .map_err(|why| format!("bad username: {why}"))?;
    let filter =
        Filter::new(wanted.filters.clone()).map_err(|why| format!("bad username: {why}"))?;
    Ok((client, wanted, filter))
}

async fn handle(
    gw: Arc<Gateway>,
    kept: KeptCell,
    conn: Arc<Conn>,
    req: Request<Incoming>,
) -> Response<Body> {
    let kind = if req.method() == Method::CONNECT {
        "connect"
    } else {
        "http"
    };
    let (client, wanted, filter) = match authenticate(&gw, &req) {
        Ok(a) => a,
        Err(why) => {
            gw.metrics.request(RequestLabels {
                client: "none".to_string(),
                kind,
                pool: String::new(),
                result: "unauthenticated",
            });
            // A failed sign-in costs its address, and its connection:
            // guesses cannot be made on a kept connection, nor can one
            // hold a place after being refused.
            conn.admission.failed_sign_in(conn.ip);
            let mut r = answer(StatusCode::PROXY_AUTHENTICATION_REQUIRED, &why);
            r.headers_mut()
                .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
            return r;
        }
    };
    conn.signed_in();
    // Sampled: a span for each of hundreds of connections a second would
    // cost more than their relay.
    let span = match gw.traced() {
        true => info_span!(
            "gateway.request",
            client = %client,
            method = %req.method(),
            session = wanted.session.as_deref().unwrap_or(""),
            upstream = tracing::field::Empty,
        ),
        false => tracing::Span::none(),
    };
    let pool = wanted.filters.pool.clone();
    let ask = Ask {
        client: client.clone(),
        wanted,
        filter,
    };
    let answer = if kind == "connect" {
        connect(gw.clone(), ask, &conn, req).instrument(span).await
    } else {
        forward(gw.clone(), kept, ask, req).instrument(span).await
    };
    let result = result_of(&answer);
    gw.metrics.request(RequestLabels {
        client: client.to_string(),
        kind,
        pool: pool.filter(|_| result == "ok").unwrap_or_default(),
        result,
    });
    answer
}

/// The metrics' result of an answer: its failure's, as [`answer`] or the
/// relay marked it; an unmarked answer is the target's own, relayed.
fn result_of<B>(r: &Response<B>) -> &'static str {
    let Some(whose) = r.extensions().get::<Failure>() else {
        return "ok";
    };
    match (whose, r.status()) {
        (Failure::Target, _) => "target_failed",
        (_, StatusCode::BAD_REQUEST) => "bad_request",
        (_, StatusCode::PROXY_AUTHENTICATION_REQUIRED) => "unauthenticated",
        (_, StatusCode::TOO_MANY_REQUESTS) => "client_limit",
        (_, StatusCode::SERVICE_UNAVAILABLE) => "no_upstream",
        _ => "upstream_failed",
    }
}

/// A `CONNECT`: a tunnel through the first upstream that grants one (a
/// second is tried when the first fails), then the relay.
async fn connect(
    gw: Arc<Gateway>,
    ask: Ask,
    client_conn: &Conn,
    req: Request<Incoming>,
) -> Response<Body> {
    let Some(authority) = req.uri().authority().map(|a| a.to_string()) else {
        return answer(StatusCode::BAD_REQUEST, "CONNECT needs host:port");
    };
    let Some(client_slot) = gw.admit(&ask.client) else {
        return answer(
            StatusCode::TOO_MANY_REQUESTS,
            "this client holds its cap of gateway connections",
        );
    };
    let started = std::time::Instant::now();
    let site = Gateway::site_of(req.uri().authority());
    let mut failed: Option<UpstreamError> = None;
    let mut avoid = None;
    for _ in 0..2 {
        let to = (&ask.client, site.as_deref());
        let chosen = match gw.choose(to, &ask.wanted, &ask.filter, avoid.as_ref()) {
            Ok(c) => c,
            Err(e) => return no_upstream(e, failed),
        };
        let up = chosen.upstream;
        tracing::Span::current().record("upstream", tracing::field::display(&up.key));
        match upstream::tunnel(&up, &authority, gw.settings.upstream_timeout).await {
            Ok(Opened::Target(refused)) => {
                // The site's failure, the same through any upstream: told
                // to the crawler as the upstream said it, and the upstream
                // (and the session on it) left as they are.
                debug!(upstream = %up.key, status = refused.status, "The target refused a gateway tunnel");
                gw.metrics.set_up(started.elapsed());
                return moved(relay_refusal(refused), chosen.moved || failed.is_some());
            }
            Ok(Opened::Tunnel(conn, early)) => {
                gw.metrics.set_up(started.elapsed());
                let slot = gw.occupy(&up.key);
                let key = up.key.clone();
                let gw = gw.clone();
                let places = client_conn.take_places();
                tokio::spawn(async move {
                    let _held = (slot, client_slot, places);
                    relay_upgraded(&gw, req, conn, early, &key).await;
                });
                return moved(
                    Response::new(Body::empty()),
                    chosen.moved || failed.is_some(),
                );
            }
            Err(e) => {
                gw.failed(&up.key, &e);
                avoid = Some(up.key);
                failed = Some(e);
            }
        }
    }
    exhausted(failed)
}

/// Waits for the client's side of the tunnel (after the `200` is sent),
/// then relays.
async fn relay_upgraded(
    gw: &Gateway,
    req: Request<Incoming>,
    conn: TcpStream,
    early: bytes::Bytes,
    key: &crate::lease::ProxyKey,
) {
    let upgraded = match hyper::upgrade::on(req).await {
        Ok(u) => u,
        Err(e) => {
            debug!(error = %e, "The client left before its tunnel opened");
            return;
        }
    };
    // The front serves plain TCP streams only, so this is what it holds.
    let Ok(parts) = upgraded.downcast::<TokioIo<TcpStream>>() else {
        warn!("A gateway tunnel was not over TCP; closed");
        return;
    };
    let client = parts.io.into_inner();
    // The client's bytes past its CONNECT are a slice of hyper's read
    // buffer (8 KiB): copied out, so the buffer is not held for the
    // tunnel's whole life.
    let sent = bytes::Bytes::copy_from_slice(&parts.read_buf);
    drop(parts.read_buf);
    let (idle, opened) = (gw.settings.idle_timeout, std::time::Instant::now());
    gw.metrics.tunnel_opened();
    let (moved, err) = super::tunnel::relay(client, conn, (sent, early), idle).await;
    gw.metrics
        .tunnel_closed(opened.elapsed(), moved.up, moved.down);
    match err {
        None => debug!(upstream = %key, up = moved.up, down = moved.down, "Gateway tunnel closed"),
        Some(e) => {
            debug!(upstream = %key, up = moved.up, down = moved.down, error = %e, "Gateway tunnel ended")
        }
    }
}
