//! The route handlers: request bodies read by the API's rules, the lease
//! store asked, the answer built. Each carries its OpenAPI description
//! (`openapi.rs` gathers them).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::{Extension, Json};

use super::client::Client;
use super::error::{ApiError, ApiResult};
use super::grant::{
    confirmed, lease_response, lease_terms, own_lease, proxy_unavailable, readmit, transact,
    unconfirmed, unknown_lease,
};
use super::model::*;
use super::request::{caller, check_len, outcome_of, parse_body, ttl_error};
use super::state::ApiState;
use crate::replica::forward::Deadline;
use crate::replica::internal::REQUEST_KEY_HEADER;

/// Liveness of the API.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "The API serves", body = String)), security(()))]
pub(super) async fn healthz() -> &'static str {
    "ok"
}

/// Lists healthy proxies matching the filters, without their passwords
/// (a lease hands those to its client).
#[utoipa::path(get, path = "/v1/proxies", params(ListQuery),
    responses(
        (status = 200, description = "The proxies; url and password carry no password: lease one for its credentials", body = ProxyList),
        (status = 400, description = "Unknown or malformed query parameter", body = ErrorBody),
        (status = 401, body = ErrorBody)))]
pub(super) async fn list_proxies(
    State(s): State<ApiState>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<ProxyList>> {
    let f = parse_query(q.as_deref())
        .and_then(Filter::new)
        .map_err(|m| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", m))?;
    Ok(Json(ProxyList {
        items: s.eligible(&f),
    }))
}

/// Leases a healthy proxy: fewest active leases first, then least recently
/// leased, then namespace/name; a sticky key keeps its proxy while it
/// stays healthy and has capacity.
#[utoipa::path(post, path = "/v1/leases", request_body(content = Option<AcquireBody>, description = "Every field optional; an empty body is {}"),
    responses(
        (status = 201, body = LeaseResponse),
        (status = 400, description = "Malformed JSON, invalid ttlSeconds, or a malformed labelSelector (invalid_filter)", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 409, description = "No healthy proxy matches (no_proxy), all are at capacity or cooling down (no_capacity), or this client holds --max-leases-per-client leases (client_limit)", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until asking again is worth it: until a lease on a matching proxy ends (no_capacity) or one of the client's own (client_limit); 5 when nothing bounds the wait; 1 to 60"))),
        (status = 413, body = ErrorBody),
        (status = 422, description = "Unknown field or wrong type", body = ErrorBody),
        (status = 503, description = "leader_unavailable: this replica does not lead and cannot reach the one that does (or none leads during an election), or the replicas in sync did not confirm the grant in time; recovering: a new leader's recovery window after a failover, when leases the previous leader granted may still be presented; pool_scaling_up: the autoscaled pool named in the filters is at zero or coming back from it, and grows for this acquire; table_full: the leader remembers 400,000 live and released leases, the most it keeps. Nothing was granted", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until asking again is worth it: one leader-election retry period (leader_unavailable), until the recovery window ends (recovering), about the time the pool's first proxy takes to come up (pool_scaling_up), or until the earliest live or released lease ends (table_full)")))))]
pub(super) async fn acquire(
    State(s): State<ApiState>,
    client: Option<Extension<Client>>,
    forwarded: Option<Extension<Deadline>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    // Only a forwarded call (its signature checked) carries these.
    let request_key = forwarded
        .as_ref()
        .and(headers.get(REQUEST_KEY_HEADER))
        .and_then(|v| v.to_str().ok());
    let terms = lease_terms(&s, body, client)?;
    transact(&s, terms, request_key, forwarded).await
}

/// Reads a live lease.
#[utoipa::path(get, path = "/v1/leases/{id}", params(("id" = String, Path, description = "Lease id")),
    responses((status = 200, body = LeaseResponse), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "The leased proxy is no longer healthy", body = ErrorBody),
        (status = 503, description = "leader_unavailable: this replica does not lead and cannot reach the one that does (or none leads during an election); nothing was granted here", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until asking again is worth it: one leader-election retry period")))))]
pub(super) async fn get_lease(
    State(s): State<ApiState>,
    client: Option<Extension<Client>>,
    Path(id): Path<String>,
) -> ApiResult<Json<LeaseResponse>> {
    readmit(&s, &id);
    let lease = own_lease(&s, &id, &caller(client))?;
    let item = s
        .item_for(&lease)
        .ok_or_else(|| proxy_unavailable(&lease))?;
    Ok(Json(lease_response(&lease, item)))
}

/// Extends a live lease to now + ttlSeconds (default: the default TTL).
#[utoipa::path(post, path = "/v1/leases/{id}/renew", params(("id" = String, Path, description = "Lease id")),
    request_body(content = Option<RenewBody>, description = "Optional; an empty body is {}"),
    responses((status = 200, body = LeaseResponse), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, description = "The leased proxy is no longer healthy; the lease runs out", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 503, description = "leader_unavailable: this replica does not lead and cannot reach the one that does (or none leads during an election), or the replicas in sync did not confirm the renewal in time (renew again: the lease is not cut short)", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until asking again is worth it: one leader-election retry period")))))]
pub(super) async fn renew(
    State(s): State<ApiState>,
    client: Option<Extension<Client>>,
    forwarded: Option<Extension<Deadline>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<LeaseResponse>> {
    let b: RenewBody = parse_body(body, true)?;
    let ttl = s.leases.ttl(b.ttl_seconds).map_err(ttl_error)?;
    readmit(&s, &id);
    let lease = own_lease(&s, &id, &caller(client))?;
    let item = s
        .item_for(&lease)
        .ok_or_else(|| proxy_unavailable(&lease))?;
    let lease = s.leases.renew(&id, ttl).ok_or_else(unknown_lease)?;
    if !confirmed(&s, forwarded.map(|Extension(d)| d.0)).await {
        return Err(unconfirmed("the replicas in sync did not confirm the renewal in time; the lease is held as before: renew again"));
    }
    s.metrics.lease_event("renewed", 1);
    Ok(Json(lease_response(&lease, item)))
}

/// Ends a lease. An id that names no live lease of the caller (unknown,
/// expired, already released, another client's) is `404 unknown_lease`,
/// all alike, so a caller learns nothing of other clients' ids.
#[utoipa::path(delete, path = "/v1/leases/{id}", params(("id" = String, Path, description = "Lease id")),
    responses((status = 204, description = "Released"), (status = 401, body = ErrorBody),
        (status = 404, description = "unknown_lease: no live lease of this client has this id (unknown, expired, already released, or another client's)", body = ErrorBody),
        (status = 503, description = "leader_unavailable: this replica does not lead and cannot reach the one that does (or none leads during an election); nothing was granted here", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until asking again is worth it: one leader-election retry period")))))]
pub(super) async fn release(
    State(s): State<ApiState>,
    client: Option<Extension<Client>>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    // A lease another leader granted is taken in first, so it can end.
    readmit(&s, &id);
    own_lease(&s, &id, &caller(client))?;
    if !s.leases.release(&id) {
        return Err(unknown_lease());
    }
    s.metrics.lease_event("released", 1);
    Ok(StatusCode::NO_CONTENT)
}

/// Reports how a leased proxy did. `blocked` or `failed` withholds the
/// proxy for --lease-cooldown: for `site` only when given, for every site
/// otherwise. The lease is kept.
#[utoipa::path(post, path = "/v1/leases/{id}/report", params(("id" = String, Path, description = "Lease id")),
    request_body = ReportBody,
    responses((status = 204, description = "Recorded"), (status = 400, description = "Malformed JSON or invalid result", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 413, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 503, description = "leader_unavailable: this replica does not lead and cannot reach the one that does (or none leads during an election); nothing was granted here", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until asking again is worth it: one leader-election retry period")))))]
pub(super) async fn report(
    State(s): State<ApiState>,
    client: Option<Extension<Client>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<StatusCode> {
    let b: ReportBody = parse_body(body, false)?;
    check_len("site", &b.site)?;
    let outcome = outcome_of(&b.result)?;
    readmit(&s, &id);
    own_lease(&s, &id, &caller(client))?;
    s.leases
        .report(&id, outcome, b.site.as_deref())
        .ok_or_else(unknown_lease)?;
    s.metrics.lease_event(outcome.as_str(), 1);
    Ok(StatusCode::NO_CONTENT)
}

/// Any path no route matches.
pub(super) async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

/// A route's path with a method it does not serve.
pub(super) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
}
