//! Accept and bound, the first layer a connection passes: the listener,
//! [`Admission`]'s caps before a byte is read, the HTTP/1.1 connection
//! with its head bounds, and the drain when the gateway stops. Each
//! request goes on to `sign_in`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

use super::admission::{Admission, Bounds, Conn};
use super::forward::KeptCell;
use super::route::Gateway;

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
            let conn = Arc::new(Conn::new(ip, admission, (places, signing_in)));
            connection(gw, stream, conn, closed).await;
        });
    }
    drop(listener);
    let _ = closing.send(true);
    drain(&gateway, || admission.open()).await;
    Ok(())
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
        async move {
            Ok::<_, std::convert::Infallible>(super::sign_in::handle(gw, kept, conn, req).await)
        }
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
