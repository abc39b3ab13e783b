//! The accept loop every HTTP server of the operator runs (the discovery
//! API, the probe and metrics servers): a cap on open connections, hyper's
//! timer-backed header-read timeout (which also closes a connection that
//! waits idle for its next request), tower-http's request-body timeout and
//! a whole-request timeout (unless the app bounds its requests itself),
//! and a bounded request head ([`MAX_HEAD`], [`MAX_HEADERS`]: past them
//! hyper answers 431 and closes). A half-sent or idle connection therefore
//! holds a slot for a bounded time and a bounded buffer, and the number of
//! slots is bounded, so no client can grow the process's memory by opening
//! connections (`edge_budget` adds the worst case up). The metrics server
//! may run it over TLS.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tower_http::timeout::RequestBodyTimeout;
use tracing::debug;

/// The bounds of one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once; one more is closed as soon as it is
    /// accepted.
    pub max_connections: usize,
    /// Connections one source address may hold open at once (0: no cap
    /// of its own), so one client (one pod reopening idle connections)
    /// cannot keep every other out; one more from it is closed as soon as
    /// it is accepted.
    pub max_per_address: usize,
    /// Of `max_connections`, how many only addresses proved to be the
    /// operator's own replicas ([`Trusted`]) may take, so that forwards
    /// between replicas get in while others hold every other connection.
    pub reserved: usize,
    /// Time a connection has to send a request's whole header, counted from
    /// when the server waits for it: a new connection, and a kept-alive one
    /// between requests (so this is also the idle timeout).
    pub header_read_timeout: Duration,
    /// Time a request's body has to arrive (between its chunks, tower-http's
    /// rule); the handler then sees a failed read.
    pub body_read_timeout: Duration,
    /// Time a whole request may take; then the answer is an empty 408.
    /// `None`: the app bounds its requests itself (the discovery API does,
    /// inside its request log, so that the 408 is logged, counted and
    /// answered in its JSON error shape).
    pub request_timeout: Option<Duration>,
}

/// The discovery API: crawlers keep connections alive and send small
/// bodies (the body itself is capped by the API's router, at 64 KiB).
/// 1,024 connections, with the probe and metrics servers', fit half the
/// manager's 128Mi at worst (`edge_budget`).
pub const DISCOVERY_LIMITS: Limits = Limits {
    max_connections: 1024,
    max_per_address: 512,
    reserved: 64,
    header_read_timeout: Duration::from_secs(10),
    body_read_timeout: Duration::from_secs(10),
    request_timeout: Some(Duration::from_secs(30)),
};

/// `/healthz`, `/readyz` and `/metrics`: a kubelet and a scraper or two.
/// Their handlers read no body, so none is ever buffered.
pub const PROBE_LIMITS: Limits = Limits {
    max_connections: 128,
    // One kubelet and a scraper or two: their addresses are few.
    max_per_address: 0,
    reserved: 0,
    header_read_timeout: Duration::from_secs(10),
    body_read_timeout: Duration::from_secs(10),
    request_timeout: Some(Duration::from_secs(30)),
};

/// The largest request head (request line and header fields) a server
/// of the operator buffers, the gateway's too; a longer one is answered
/// 431 and the connection closed before any handler (or sign-in) runs.
/// hyper's default (about 408 KiB) let ~300 unfinished heads fill the
/// 128Mi manager. The longest legitimate heads are far below 16 KiB: a
/// signed lease id in a path is under 1 KiB (its Proxy's namespace and
/// name, the client name, 62 bytes of expiry, nonce, lengths and tag, in
/// base64), a bearer token or a gateway `Proxy-Authorization` (a client
/// name with `-<key>-<value>` filters) a few hundred bytes, the replicas'
/// signed forwarding headers (a signature, a client name, a 256-byte key
/// at most) and a `traceparent` less still. 16 KiB is also
/// twice hyper's first read buffer, so the buffer grows once, to exactly
/// this ([`read_buffer_bound`]).
pub const MAX_HEAD: usize = 16 * 1024;

/// The most header fields a request may carry (hyper answers 431 past
/// them); hyper's default is 100, no client of these servers sends more
/// than a dozen.
pub const MAX_HEADERS: usize = 64;

/// hyper refuses (panics on) a smaller `max_buf_size`.
const HYPER_MIN_BUF: usize = 8192;
const _: () = assert!(MAX_HEAD >= HYPER_MIN_BUF);

/// The most bytes hyper 1.x's read buffer holds under a `max_buf_size`
/// of `max` (hyper's `proto/h1/io.rs`): it first reserves 8 KiB and then
/// asks for at most `max` minus what it holds, but a `Vec` grows to at
/// least twice its capacity, so past twice the first buffer it may
/// overshoot `max` (never twice it).
pub const fn read_buffer_bound(max: usize) -> usize {
    if max <= 2 * HYPER_MIN_BUF {
        max
    } else {
        2 * max
    }
}

/// The HTTP/1 connection builder of every server of the operator (the
/// gateway's too): a timer-backed header-read timeout (also the idle
/// timeout between requests) and the bounded head above.
pub fn http1_server(header_read_timeout: Duration) -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .max_buf_size(MAX_HEAD)
        .max_headers(MAX_HEADERS);
    b
}

/// How long in-flight requests get to finish once `shutdown` resolves.
const DRAIN: Duration = Duration::from_secs(5);

/// Pause after a failed accept (out of file descriptors, say) so the loop
/// does not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `app` on `listener` within `limits` until `shutdown` resolves,
/// then lets open requests finish for a few seconds.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, app, (limits, Trusted::default()), None, shutdown).await
}

/// [`serve`], with the reserved connections for the `trusted` addresses.
pub async fn serve_trusting(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    trusted: Trusted,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, app, (limits, trusted), None, shutdown).await
}

/// The address a request's connection comes from, in its extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub IpAddr);

/// How long an address stays trusted after it last proved itself.
pub const TRUST_FOR: Duration = Duration::from_secs(60);

/// Addresses that proved to be the operator's own replicas (a call signed
/// with the shared lease key), and when they last did.
#[derive(Clone, Default)]
pub struct Trusted(Arc<std::sync::Mutex<HashMap<IpAddr, tokio::time::Instant>>>);

impl Trusted {
    /// `ip` just proved itself.
    pub fn trust(&self, ip: IpAddr) {
        let now = tokio::time::Instant::now();
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= 1024 {
            m.retain(|_, at| now.saturating_duration_since(*at) < TRUST_FOR);
        }
        m.insert(ip.to_canonical(), now);
    }

    /// Whether `ip` proved itself within [`TRUST_FOR`].
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&ip.to_canonical())
            .is_some_and(|at| at.elapsed() < TRUST_FOR)
    }
}

/// [`serve`] over TLS: each connection's handshake must finish within the
/// header-read timeout (it holds a slot like a slow header would).
pub async fn serve_tls(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    tls: TlsAcceptor,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(
        listener,
        app,
        (limits, Trusted::default()),
        Some(tls),
        shutdown,
    )
    .await
}

type Service = RequestBodyTimeout<Router>;

async fn serve_with(
    listener: TcpListener,
    app: Router,
    (limits, trusted): (Limits, Trusted),
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = match limits.request_timeout {
        Some(limit) => app.layer(middleware::from_fn_with_state(limit, bounded)),
        None => app,
    };
    let service = RequestBodyTimeout::new(app, limits.body_read_timeout);
    let reserved = limits.reserved.min(limits.max_connections);
    let slots = Arc::new(Semaphore::new(limits.max_connections - reserved));
    let kept = Arc::new(Semaphore::new(reserved));
    let per_address = PerAddress::default();
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    debug!(error = %e, "Accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => Ok(slot),
            Err(_) if trusted.is_trusted(peer.ip()) => kept.clone().try_acquire_owned(),
            Err(e) => Err(e),
        };
        let Ok(slot) = slot else {
            debug!(
                max = limits.max_connections,
                "Connection refused: too many open"
            );
            drop(stream);
            continue;
        };
        let Some(held) = per_address.take(peer.ip(), limits.max_per_address) else {
            debug!(
                max = limits.max_per_address,
                "Connection refused: too many open from one address"
            );
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (service, watcher, tls) = (service.clone(), graceful.watcher(), tls.clone());
        let peer = Peer(peer.ip().to_canonical());
        tokio::spawn(async move {
            match tls {
                None => connection(stream, (service, peer), limits, watcher).await,
                Some(tls) => {
                    let handshake = tls.accept(stream);
                    match tokio::time::timeout(limits.header_read_timeout, handshake).await {
                        Ok(Ok(stream)) => {
                            connection(stream, (service, peer), limits, watcher).await
                        }
                        Ok(Err(e)) => debug!(error = %e, "TLS handshake failed"),
                        Err(_) => debug!("TLS handshake timed out"),
                    }
                }
            }
            drop((slot, held));
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(DRAIN, graceful.shutdown()).await;
    Ok(())
}

/// Open connections by source address.
#[derive(Clone, Default)]
struct PerAddress(Arc<std::sync::Mutex<HashMap<IpAddr, usize>>>);

/// One connection counted against its address until dropped.
struct Held(PerAddress, IpAddr);

/// Whether an address holding `held` connections may open one more
/// under a cap of `max` (0: no cap).
pub fn admits(held: usize, max: usize) -> bool {
    max == 0 || held < max
}

impl PerAddress {
    fn take(&self, ip: IpAddr, max: usize) -> Option<Held> {
        // IPv4 clients of a dual-stack listener are one address either way.
        let ip = ip.to_canonical();
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(ip).or_default();
        if !admits(*n, max) {
            return None;
        }
        *n += 1;
        Some(Held(self.clone(), ip))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut m = (self.0).0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.1) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.1);
            }
        }
    }
}

/// One connection's requests, until it closes or the server drains.
async fn connection<I>(io: I, (service, peer): (Service, Peer), limits: Limits, watcher: Watcher)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(peer);
        let mut s = service.clone();
        // A Router is always ready (and the body timeout around it asks
        // only it), so `call` needs no `poll_ready` first.
        tower::Service::call(&mut s, req)
    });
    let conn = http1_server(limits.header_read_timeout).serve_connection(TokioIo::new(io), service);
    if let Err(e) = watcher.watch(conn).await {
        debug!(error = %e, "Connection ended with an error");
    }
}

/// A whole request within `limit`, else an empty 408.
async fn bounded(State(limit): State<Duration>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => StatusCode::REQUEST_TIMEOUT.into_response(),
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
