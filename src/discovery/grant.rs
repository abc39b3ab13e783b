//! The lease transaction, one module: an acquire's terms read, the
//! store's choice among the listing's matches, the pool's demand counted,
//! the forwarded call's request key remembered, the followers in sync
//! waited for, and the grant undone when they do not confirm it; and the
//! lease answers every lease route builds from it.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::client::Client;
use super::error::{ApiError, ApiResult};
use super::model::*;
use super::request::{caller, check_len, parse_body, ttl_error};
use super::state::ApiState;
use crate::lease::{AcquireRequest, Admission, Lease, ProxyKey, Refusal};
use crate::replica::forward::Deadline;

/// The lease transaction of an acquire: a replay of a forwarded call
/// answered with the lease it got before; the store's choice among the
/// listing's matches, counted as a pool's demand; the request key
/// remembered; then the grant confirmed by the replicas in sync, or undone.
pub(super) async fn transact(
    s: &ApiState,
    (req, filter): (AcquireRequest, Filter),
    request_key: Option<&str>,
    forwarded: Option<Extension<Deadline>>,
) -> ApiResult<Response> {
    let deadline = forwarded.as_ref().map(|Extension(d)| d.0);
    let listing = s.listing();
    let members = listing.members(&filter);
    let client_name = req.client.clone();
    if let Some(lease) = request_key.and_then(|k| granted_before(s, &client_name, k)) {
        return created(s, &listing, lease);
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
            super::pools::asked(s, &filter, &client_name, None);
            if let Some((k, nonce)) = request_key.zip(s.leases.nonce_of(&lease.id)) {
                let mut r = s.replays.lock().unwrap_or_else(|p| p.into_inner());
                r.put(&client_name, k, nonce, std::time::Instant::now());
            }
            granted(s, &listing, lease, forwarded).await
        }
        Err(e) => Err(super::pools::refused(s, &filter, &members, &client_name, e)),
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

/// The live lease `client` was granted under request key `key`, when
/// the forwarding replica sends the same acquire again.
/// Whether every follower in sync holds the table with this change, by
/// `deadline` (a forward's) or [`crate::replica::members::CONFIRM_LIMIT`]: only
/// then may a crawler hear of it (`replicas.rs`).
pub(super) async fn confirmed(s: &ApiState, deadline: Option<tokio::time::Instant>) -> bool {
    let version = s.leases.version();
    let until = deadline
        .unwrap_or_else(|| tokio::time::Instant::now() + crate::replica::members::CONFIRM_LIMIT);
    // A leader whose fence closed while it waited (paused past its renew
    // deadline: another may lead by now) confirms nothing.
    s.replicas.confirmed(version, until).await
        && (s.forward.leader)() == crate::replica::forward::Leader::Me
}

pub(super) fn unconfirmed(message: &str) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "leader_unavailable",
        message,
    )
    .retry_after(std::time::Duration::from_secs(1))
}

fn granted_before(s: &ApiState, client: &std::sync::Arc<str>, key: &str) -> Option<Lease> {
    let nonce = {
        let mut r = s.replays.lock().unwrap_or_else(|p| p.into_inner());
        r.get(client, key, std::time::Instant::now())?
    };
    s.leases
        .get_by_nonce(&nonce)
        .filter(|l| &l.client == client)
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

pub(super) fn lease_response(lease: &Lease, proxy: ProxyItem) -> LeaseResponse {
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

pub(super) fn unknown_lease() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "unknown_lease", "no such lease")
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
pub(super) fn proxy_unavailable(lease: &Lease) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "proxy_unavailable",
        format!("proxy {} is no longer healthy", lease.proxy),
    )
}
