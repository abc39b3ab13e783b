//! `POST /v1/sessions/{session}/report`: a crawler that sees its gateway
//! session blocked reports it as it would a lease. The session's upstream
//! (what this replica's gateway last used for it) is cooled down as a
//! lease report would, so the session's next connection moves to another
//! upstream. Served by the replica that received it, not forwarded: the
//! session lives in this replica's gateway; the cooldown also goes to the
//! leader's table, so every gateway replica moves the session alike
//! (`replica/to_leader.rs`).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Serialize;
use utoipa::ToSchema;

use super::error::{ApiError, ApiResult};
use super::model::SessionReportBody;
use super::request::{caller, check_len, outcome_of, parse_body};
use super::state::{ApiState, Client};
use crate::lease::Outcome;

/// The answer to a session report.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionReport {
    /// The session.
    pub session: String,
    /// The upstream it used: `namespace/name` of its Proxy.
    pub proxy: String,
    /// Whether that upstream was cooled down (`blocked`, `failed`): the
    /// session's next connection goes to another.
    pub moved: bool,
}

/// Reports how a gateway session's upstream did. `blocked` or `failed`
/// withholds that upstream for --lease-cooldown (for `site` only when
/// given, else for this client), so the session moves at its next
/// connection.
#[utoipa::path(post, path = "/v1/sessions/{session}/report",
    params(("session" = String, Path, description = "The session id of the gateway username (session-<id>)")),
    request_body = SessionReportBody,
    responses((status = 200, description = "Recorded", body = SessionReport),
        (status = 400, description = "Malformed JSON or invalid result", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, description = "no_gateway: this replica runs no gateway; session_not_found: its gateway has not seen the session within its ttl", body = ErrorBody),
        (status = 413, body = ErrorBody),
        (status = 422, description = "A field too long, or invalid_username: the username does not parse or names another session", body = ErrorBody)))]
pub(super) async fn report_session(
    State(s): State<ApiState>,
    client: Option<Extension<Client>>,
    Path(session): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<SessionReport>> {
    let b: SessionReportBody = parse_body(body, false)?;
    check_len("site", &b.site)?;
    check_len("username", &b.username)?;
    let outcome = outcome_of(&b.result)?;
    let Some(gateway) = &s.gateway else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_gateway",
            "this replica runs no gateway (--gateway-bind-address)",
        ));
    };
    let client = caller(client);
    let found = gateway
        .upstream_of(
            &client,
            &session,
            (b.username.as_deref(), b.site.as_deref()),
        )
        .map_err(|why| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_username", why))?;
    let Some(proxy) = found else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "session_not_found",
            format!(
                "this gateway has not seen session {session:?} of client {client:?} within its ttl, \
                 and no usable proxy matches the username given (send the session's username \
                 to have any gateway replica find its upstream)"
            ),
        ));
    };
    let moved = outcome != Outcome::Ok;
    if moved {
        s.cool_down(&proxy, &client, b.site.as_deref()).await;
    }
    s.metrics.lease_event(outcome.as_str(), 1);
    Ok(Json(SessionReport {
        session,
        proxy: proxy.to_string(),
        moved,
    }))
}

#[allow(unused_imports)] // the OpenAPI document's references
use super::model::ErrorBody;
