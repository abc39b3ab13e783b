//! The route handlers: request bodies read by the API's rules, the lease
//! store asked, the answer built. Each carries its OpenAPI description
//! (`openapi.rs` gathers them).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::de::DeserializeOwned;

use super::error::{ApiError, ApiResult};
use super::forward::Deadline;
use super::internal::REQUEST_KEY_HEADER;
use super::middleware::BODY_LIMIT;
use super::model::*;
use super::state::{ApiState, Client, ANONYMOUS};
use crate::lease::{
    AcquireError, AcquireRequest, Admission, Candidates, Lease, Outcome, ProxyKey, Refusal,
    TtlError,
};

/// Longest `stickyKey` and `site`.
pub const MAX_KEY_LEN: usize = 256;

/// Reads a JSON body: empty means `{}` when `empty_ok`; over the cap 413;
/// broken JSON 400; well-formed but wrong shape (unknown field, wrong
/// type) 422.
pub(super) fn parse_body<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    empty_ok: bool,
) -> ApiResult<T> {
    let bytes = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!("request body exceeds {BODY_LIMIT} bytes"),
            )
        } else {
            ApiError::new(StatusCode::BAD_REQUEST, "bad_request", e.body_text())
        }
    })?;
    // Only a body of no bytes is "no body": whitespace alone is not JSON,
    // and the OpenAPI document (which the fuzz run checks) says so.
    let value: serde_json::Value = if bytes.is_empty() && empty_ok {
        serde_json::Value::Object(Default::default())
    } else {
        serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "malformed_json", e.to_string()))?
    };
    let value = match value {
        // An optional body may be sent as JSON null.
        serde_json::Value::Null if empty_ok => serde_json::Value::Object(Default::default()),
        v => v,
    };
    // serde would read a struct from an array by position; the API only
    // takes objects.
    if !objects_only(&value, 0) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            "the body and its nested structures must be JSON objects",
        ));
    }
    serde_json::from_value(value).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            e.to_string(),
        )
    })
}

/// No request type of this API holds an array: the top level is an
/// object, and so is every nested structure.
fn objects_only(v: &serde_json::Value, depth: usize) -> bool {
    match v {
        serde_json::Value::Object(m) => m.values().all(|v| objects_only(v, depth + 1)),
        serde_json::Value::Array(_) => false,
        _ => depth > 0,
    }
}

pub(super) fn check_len(field: &str, v: &Option<String>) -> ApiResult<()> {
    match v {
        Some(s) if s.is_empty() || s.len() > MAX_KEY_LEN => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            format!("{field} must be 1-{MAX_KEY_LEN} bytes"),
        )),
        _ => Ok(()),
    }
}

fn lease_response(lease: &Lease, proxy: ProxyItem) -> LeaseResponse {
    // Seconds left, rounded up (a fresh lease shows its full TTL).
    let ms = (lease.expires_at - chrono::Utc::now())
        .num_milliseconds()
        .max(0);
    let ttl = ms.saturating_add(999) / 1000;
    LeaseResponse {
        id: lease.id.clone(),
        proxy,
        expires_at: lease
            .expires_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        ttl_seconds: u64::try_from(ttl).unwrap_or(0),
    }
}

/// Takes in a lease another leader granted when its id is presented here
/// first (docs/api.md, "Failover"); counts what happened.
pub(super) fn readmit(s: &ApiState, id: &str) {
    let listing = s.listing();
    let eligible = |k: &ProxyKey| listing.get(k).is_some();
    match s.leases.admit(id, eligible) {
        Admission::Readmitted(_) => s.metrics.lease_event("readmitted", 1),
        Admission::Refused(Refusal::NoRoom | Refusal::ClientLimit) => {
            s.metrics.lease_event("readmit_refused", 1)
        }
        Admission::Refused(Refusal::Ineligible) | Admission::Known | Admission::Unknown => {}
    }
}

fn unknown_lease() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "unknown_lease", "no such lease")
}

/// The caller: its token's name (the anonymous name without tokens), as
/// acquire records it on a lease.
pub(super) fn caller(client: Option<Extension<Client>>) -> std::sync::Arc<str> {
    client
        .map(|Extension(c)| c.0)
        .unwrap_or_else(|| ANONYMOUS.into())
}

/// The live lease `id` when `caller` holds it. Another client's lease is
/// as unknown to the caller as one that never was: an id seen in passing
/// (a log, a proxy's access log) is no hold on the lease.
pub(super) fn own_lease(s: &ApiState, id: &str, caller: &str) -> ApiResult<Lease> {
    s.leases
        .get(id)
        .filter(|l| &*l.client == caller)
        .ok_or_else(unknown_lease)
}

/// 409: the lease is live but its proxy left the healthy set.
fn proxy_unavailable(lease: &Lease) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "proxy_unavailable",
        format!("proxy {} is no longer healthy", lease.proxy),
    )
}

fn ttl_error(e: TtlError) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_ttl", e.to_string())
}

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
        (status = 503, description = "leader_unavailable: this replica does not lead and cannot reach the one that does (or none leads during an election), or the replicas in sync did not confirm the grant in time; recovering: a new leader's recovery window after a failover, when leases the previous leader granted may still be presented; pool_scaling_up: the autoscaled pool named in the filters is at zero or coming back from it, and grows for this acquire. Nothing was granted", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until asking again is worth it: one leader-election retry period (leader_unavailable), until the recovery window ends (recovering), or about the time the pool's first proxy takes to come up (pool_scaling_up)")))))]
pub(super) async fn acquire(
    State(s): State<ApiState>,
    client: Option<Extension<Client>>,
    forwarded: Option<Extension<Deadline>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    // Only a forwarded call (its signature checked) carries these.
    let deadline = forwarded.as_ref().map(|Extension(d)| d.0);
    let request_key = deadline
        .and(headers.get(REQUEST_KEY_HEADER))
        .and_then(|v| v.to_str().ok());
    let (req, filter) = lease_terms(&s, body, client)?;
    let listing = s.listing();
    let members = listing.members(&filter);
    let client_name = req.client.clone();
    if let Some(lease) = request_key.and_then(|k| granted_before(&s, &client_name, k)) {
        return created(&s, &listing, lease);
    }
    if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
        // The follower has answered 503 by now: a grant would be a lease
        // nobody holds.
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "leader_unavailable",
            "the leader got this forwarded call after the forwarding replica gave up on it; nothing was granted",
        )
        .retry_after(std::time::Duration::from_secs(1)));
    }
    match s.leases.acquire_among(&members, &req) {
        Ok(lease) => {
            super::pools::asked(&s, &filter, &client_name, None);
            if let Some(k) = request_key {
                let mut r = s.replays.lock().unwrap_or_else(|p| p.into_inner());
                r.put(client_name, k, lease.id.clone(), std::time::Instant::now());
            }
            granted(&s, &listing, lease, forwarded).await
        }
        Err(e) => Err(super::pools::refused(
            &s,
            &filter,
            &members,
            &client_name,
            e,
        )),
    }
}

/// The terms of a new lease from an acquire body (an empty one is `{}`),
/// for the caller.
pub(super) fn lease_terms(
    s: &ApiState,
    body: Result<Bytes, BytesRejection>,
    client: Option<Extension<Client>>,
) -> ApiResult<(AcquireRequest, Filter)> {
    let b: AcquireBody = parse_body(body, true)?;
    check_len("stickyKey", &b.sticky_key)?;
    check_len("site", &b.site)?;
    let ttl = s.leases.ttl(b.ttl_seconds).map_err(ttl_error)?;
    let filter = Filter::new(b.filters)
        .map_err(|m| ApiError::new(StatusCode::BAD_REQUEST, "invalid_filter", m))?;
    let req = AcquireRequest {
        ttl,
        sticky_key: b.sticky_key,
        site: b.site,
        client: caller(client),
    };
    Ok((req, filter))
}

/// Who asks, as a note may name it.
pub(super) fn requester(req: &AcquireRequest) -> String {
    req.client.to_string()
}

/// Answers a grant once the replicas in sync hold it (`201`), or undoes
/// it (`503`): a lease nobody was told of would only keep its slot (a
/// follower's copy may hold it, which is safe).
pub(super) async fn granted(
    s: &ApiState,
    listing: &super::state::Listing,
    lease: Lease,
    forwarded: Option<Extension<Deadline>>,
) -> ApiResult<Response> {
    if !confirmed(s, forwarded.map(|Extension(d)| d.0)).await {
        s.leases.release(&lease.id);
        s.metrics.lease_event("refused", 1);
        return Err(unconfirmed("the replicas in sync did not confirm the grant in time; nothing was granted, ask again"));
    }
    s.metrics.lease_event("granted", 1);
    created(s, listing, lease)
}

/// The answer to an acquire the store refused, with when to ask again.
pub(super) fn refused(
    s: &ApiState,
    members: &dyn Candidates,
    client: &str,
    e: AcquireError,
) -> ApiError {
    s.metrics.lease_event("refused", 1);
    let (status, code) = match e {
        AcquireError::NoProxy => (StatusCode::CONFLICT, "no_proxy"),
        AcquireError::NoCapacity { .. } => (StatusCode::CONFLICT, "no_capacity"),
        AcquireError::ClientLimit { .. } => (StatusCode::CONFLICT, "client_limit"),
        AcquireError::Recovering { .. } => (StatusCode::SERVICE_UNAVAILABLE, "recovering"),
    };
    let wait = s.leases.retry_after_among(members, client, &e);
    ApiError::new(status, code, e.to_string()).retry_after(wait)
}

/// The live lease `client` was granted under request key `key`, when
/// the forwarding replica sends the same acquire again.
/// Whether every follower in sync holds the table with this change, by
/// `deadline` (a forward's) or [`super::replicas::CONFIRM_LIMIT`]: only
/// then may a crawler hear of it (`replicas.rs`).
async fn confirmed(s: &ApiState, deadline: Option<tokio::time::Instant>) -> bool {
    let version = s.leases.version();
    let until =
        deadline.unwrap_or_else(|| tokio::time::Instant::now() + super::replicas::CONFIRM_LIMIT);
    s.replicas.confirmed(version, until).await
}

fn unconfirmed(message: &str) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "leader_unavailable",
        message,
    )
    .retry_after(std::time::Duration::from_secs(1))
}

fn granted_before(s: &ApiState, client: &std::sync::Arc<str>, key: &str) -> Option<Lease> {
    let id = {
        let mut r = s.replays.lock().unwrap_or_else(|p| p.into_inner());
        r.get(client, key, std::time::Instant::now())?.clone()
    };
    s.leases.get(&id).filter(|l| &l.client == client)
}

/// 201 with `lease`, on a proxy of `listing`.
fn created(s: &ApiState, listing: &super::state::Listing, lease: Lease) -> ApiResult<Response> {
    // Chosen among this listing's members (checked against it when the
    // store holds a newer one), so it is in the listing.
    let Some(item) = listing.get(&lease.proxy).cloned() else {
        s.leases.release(&lease.id);
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "leased proxy vanished",
        ));
    };
    let mut resp = (StatusCode::CREATED, Json(lease_response(&lease, item))).into_response();
    if let Ok(v) = format!("/v1/leases/{}", lease.id).parse() {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    Ok(resp)
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

/// A report's `result`.
pub(super) fn outcome_of(result: &str) -> ApiResult<Outcome> {
    match result {
        "ok" => Ok(Outcome::Ok),
        "blocked" => Ok(Outcome::Blocked),
        "failed" => Ok(Outcome::Failed),
        other => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_result",
            format!("result must be ok, blocked or failed, got {other:?}"),
        )),
    }
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
