//! `POST /v1/leases/{id}/replace`: a crawler whose proxy got blocked asks
//! for a fresh IP. The holder's lease ends, the proxy is asked to be
//! replaced (the operator writes `crawl.example.com/replace` on its Proxy,
//! which drains it and replaces its instance under the provider's budget,
//! as `kubectl annotate` would), and the answer is a new lease on another
//! healthy proxy when one is free.

use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;

use super::error::{ApiError, ApiResult};
use super::grant::{granted, lease_terms, own_lease, readmit, requester};
use super::hooks::{REPLACES_PER_WINDOW, REPLACE_WINDOW};
use super::model::{AcquireBody, ErrorBody, LeaseResponse};
use super::pools::plain as refused;
use super::state::{ApiState, Client};
use crate::lease::{Candidates, ProxyKey};
use crate::replica::forward::Deadline;

/// When a replace refused for an open circuit breaker is worth asking again.
pub const CIRCUIT_RETRY: Duration = Duration::from_secs(30);

/// The candidates of `inner` but `except`: the proxy being replaced is
/// never the new lease's, even while the listing still shows it.
struct Except<'a> {
    inner: &'a dyn Candidates,
    except: &'a ProxyKey,
}

impl Candidates for Except<'_> {
    fn len(&self) -> usize {
        self.inner.len() - usize::from(self.inner.contains(self.except))
    }

    fn whole(&self) -> Option<u64> {
        None
    }

    fn contains(&self, key: &ProxyKey) -> bool {
        key != self.except && self.inner.contains(key)
    }

    fn keys(&self) -> Box<dyn Iterator<Item = &ProxyKey> + '_> {
        Box::new(self.inner.keys().filter(|k| *k != self.except))
    }
}

fn refuse(status: StatusCode, code: &'static str, message: String) -> ApiError {
    ApiError::new(status, code, message)
}

/// The annotation value of a replace asked through the API: who, when.
pub fn request_value(client: &str, at: chrono::DateTime<chrono::Utc>) -> String {
    format!(
        "api client {client} at {}",
        at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    )
}

/// Ends a lease and replaces its proxy's instance: the proxy drains (no
/// new leases; other holders keep theirs to their end or the drain
/// timeout) and its instance is replaced under the provider's budget. The
/// answer is a new lease on another healthy proxy, with the body's terms
/// as for acquire.
#[utoipa::path(post, path = "/v1/leases/{id}/replace", params(("id" = String, Path, description = "Lease id")),
    request_body(content = Option<AcquireBody>, description = "The new lease's terms, as for acquire; an empty body is {}"),
    responses(
        (status = 201, description = "The old lease ended and its proxy is being replaced; this is the new lease, on another proxy", body = LeaseResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, description = "unknown_lease: no live lease of this client has this id", body = ErrorBody),
        (status = 409, description = "circuit_open: the proxy's provider replaces nothing now (nothing was done, the lease is kept); not_replaceable: an External proxy (nothing was done); replace_unavailable: no operator behind this API; no_proxy, no_capacity, client_limit: the replace was asked and the old lease ended, but no other proxy is free now (acquire again after Retry-After)", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until asking again is worth it"))),
        (status = 413, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 429, description = "rate_limited: this client asked for more than 10 replaces within a minute; nothing was done", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until one of its replaces is free"))),
        (status = 503, description = "leader_unavailable, recovering, or replace_failed (the Proxy could not be marked; nothing was done)", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until asking again is worth it")))))]
pub(super) async fn replace(
    State(s): State<ApiState>,
    client: Option<Extension<Client>>,
    forwarded: Option<Extension<Deadline>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let (req, filter) = lease_terms(&s, body, client)?;
    readmit(&s, &id);
    let old = own_lease(&s, &id, &req.client)?;
    let Some(replacer) = s.replacer.clone() else {
        return Err(refuse(
            StatusCode::CONFLICT,
            "replace_unavailable",
            "this API has no operator behind it to replace proxies".into(),
        ));
    };
    let proxy = s.source.proxies().into_iter().find(|p| {
        use kube::ResourceExt;
        p.namespace().as_deref() == Some(old.proxy.namespace.as_str())
            && p.name_any() == old.proxy.name
    });
    let Some(proxy) = proxy.filter(|p| p.spec.mode == crate::api::ProxyMode::Managed) else {
        return Err(refuse(
            StatusCode::CONFLICT,
            "not_replaceable",
            format!(
                "proxy {} is not one the operator manages an instance of (External, or gone); release the lease and acquire another",
                old.proxy
            ),
        ));
    };
    let provider = proxy.spec.provider.clone().unwrap_or_default();
    if let Some(why) = replacer.held(&provider) {
        s.metrics.lease_event("replace_refused", 1);
        return Err(refuse(StatusCode::CONFLICT, "circuit_open", why).retry_after(CIRCUIT_RETRY));
    }
    let limited = {
        let mut limits = s.replace_limits.lock().unwrap_or_else(|p| p.into_inner());
        limits.take(&req.client, Instant::now())
    };
    if let Err(wait) = limited {
        s.metrics.lease_event("replace_refused", 1);
        let message = format!(
            "client {} asked for {REPLACES_PER_WINDOW} replaces within {}s; nothing was done",
            req.client,
            REPLACE_WINDOW.as_secs()
        );
        return Err(
            refuse(StatusCode::TOO_MANY_REQUESTS, "rate_limited", message)
                .retry_after(wait.max(Duration::from_secs(1))),
        );
    }
    let value = request_value(&requester(&req), chrono::Utc::now());
    if let Err(why) = replacer.request(&old.proxy, &value).await {
        s.metrics.lease_event("replace_refused", 1);
        return Err(refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "replace_failed",
            format!(
                "proxy {} could not be marked for replacement: {why}",
                old.proxy
            ),
        )
        .retry_after(Duration::from_secs(5)));
    }
    s.leases.release(&id);
    s.metrics.lease_event("replace_requested", 1);
    tracing::info!(proxy = %old.proxy, client = %req.client, "A crawler asked for a fresh IP: replacing the proxy's instance");
    let listing = s.listing();
    // Chosen before any await: the candidates borrow the listing.
    let chosen = {
        let members = listing.members(&filter);
        let others = Except {
            inner: &members,
            except: &old.proxy,
        };
        s.leases
            .acquire_among(&others, &req)
            .map_err(|e| refused(&s, &others, &req.client, e))
    };
    granted(&s, &listing, chosen?, forwarded).await
}
