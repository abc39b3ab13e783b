//! Connect, the third layer of a `CONNECT`: the upstream chosen
//! (`route`), dialled and asked for the tunnel (`upstream`), a second one
//! tried when the first fails; then the `200` and the relay (`tunnel`).
//! A refusal that is the target's own is relayed as the upstream said it,
//! and the upstream kept.

use std::sync::Arc;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use tracing::debug;

use super::admission::Conn;
use super::answers::{answer, exhausted, moved, no_upstream, relay_refusal};
use super::route::{Ask, Gateway};
use super::upstream::{self, Opened, UpstreamError};

/// A `CONNECT`: a tunnel through the first upstream that grants one (a
/// second is tried when the first fails), then the relay.
pub(super) async fn connect(
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
                    super::tunnel::relay_upgraded(&gw, req, conn, early, &key).await;
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
