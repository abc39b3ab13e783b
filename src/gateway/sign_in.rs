//! Sign in, the second layer: a request's `Proxy-Authorization` names a
//! client by its discovery token and asks, in its username, for a session
//! and filters. A failed sign-in is answered `407` and closes its
//! connection; a signed-in `CONNECT` goes on to `connect`, an
//! absolute-form request to `forward`, and the answer is accounted.

use std::sync::Arc;

use axum::body::Body;
use http::header::{HeaderValue, PROXY_AUTHORIZATION};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use tracing::{info_span, Instrument};

use super::admission::Conn;
use super::answers::answer;
use super::forward::{forward, KeptCell};
use super::metrics::{result_of, RequestLabels};
use super::route::{Ask, Gateway};
use super::username::{self, Wanted};
use crate::discovery::Filter;

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

pub(super) async fn handle(
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
        super::connect::connect(gw.clone(), ask, &conn, req)
            .instrument(span)
            .await
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
