//! The discovery and lease API (operator.md §4), served by every replica.
//! See docs/api.md. Middleware, outermost first: panic recovery, a server
//! span and a request log line per request (route-pattern names, incoming
//! `traceparent` honoured), body cap, bearer auth, then the routes.

pub mod model;

use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, RawQuery, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::FutureExt;
use kube::runtime::reflector::Store;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tracing::{info, warn, Instrument};
use utoipa::OpenApi;

use crate::api::Proxy;
use crate::lease::{AcquireError, AcquireRequest, Lease, LeaseStore, Outcome};
use crate::metrics::{DiscoveryMetrics, Metrics};
pub use model::*;

/// Request bodies above this answer 413.
pub const BODY_LIMIT: usize = 64 * 1024;
/// Longest `stickyKey` and `site`.
pub const MAX_KEY_LEN: usize = 256;
/// How often expired leases are swept.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Where the API reads Proxies from (the shared cache in the operator, a
/// fixed list in tests).
pub trait ProxySource: Send + Sync {
    /// Every Proxy currently known.
    fn proxies(&self) -> Vec<Arc<Proxy>>;
}

impl ProxySource for Store<Proxy> {
    fn proxies(&self) -> Vec<Arc<Proxy>> {
        self.state()
    }
}

impl ProxySource for Vec<Arc<Proxy>> {
    fn proxies(&self) -> Vec<Arc<Proxy>> {
        self.clone()
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct ApiState {
    source: Arc<dyn ProxySource>,
    leases: Arc<LeaseStore>,
    token_digest: Option<[u8; 32]>,
    metrics: DiscoveryMetrics,
    listing: Arc<std::sync::Mutex<Option<(Instant, Listing)>>>,
    rebuilding: Arc<std::sync::atomic::AtomicBool>,
}

/// Eligible proxies with their lease-store keys, sorted by namespace/name.
type Listing = Arc<Vec<(crate::lease::ProxyKey, ProxyItem)>>;

/// How long the eligible-proxy listing is reused before it is rebuilt from
/// the cache (the cache itself lags the API server by about as much).
pub const LISTING_MAX_AGE: Duration = Duration::from_millis(250);

impl ApiState {
    /// The state; `token` is `DISCOVERY_TOKEN` (None or empty: open API).
    pub fn new(
        source: Arc<dyn ProxySource>,
        leases: Arc<LeaseStore>,
        token: Option<&str>,
        metrics: &Metrics,
    ) -> Self {
        let token_digest = token
            .filter(|t| !t.is_empty())
            .map(|t| Sha256::digest(t.as_bytes()).into());
        let l = leases.clone();
        metrics
            .sources
            .set_leases(move || i64::try_from(l.active()).unwrap_or(i64::MAX));
        let metrics = metrics.discovery.clone();
        ApiState {
            source,
            leases,
            token_digest,
            metrics,
            listing: Arc::new(std::sync::Mutex::new(None)),
            rebuilding: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }

    /// Whether a token is required.
    pub fn authenticated(&self) -> bool {
        self.token_digest.is_some()
    }

    /// Every eligible proxy, sorted; rebuilt at most every
    /// [`LISTING_MAX_AGE`] so a busy API does not convert every Proxy on
    /// every request.
    fn listing(&self) -> Listing {
        use std::sync::atomic::Ordering;
        let current = self
            .listing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some((at, items)) = &current {
            // Fresh, or stale while another request rebuilds it: use it.
            if at.elapsed() < LISTING_MAX_AGE || self.rebuilding.swap(true, Ordering::AcqRel) {
                return items.clone();
            }
        }
        // Built outside the lock so readers never wait for a rebuild; the
        // flag is cleared however this ends.
        struct Clear<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Clear<'_> {
            fn drop(&mut self) {
                self.0.store(false, std::sync::atomic::Ordering::Release);
            }
        }
        let _clear = Clear(&self.rebuilding);
        let mut items: Vec<(crate::lease::ProxyKey, ProxyItem)> = self
            .source
            .proxies()
            .iter()
            .filter_map(|p| item_of(p))
            .map(|i| (i.key(), i))
            .collect();
        items.sort_by(|a, b| a.0.cmp(&b.0));
        let items = Arc::new(items);
        *self.listing.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now(), items.clone()));
        items
    }

    fn eligible(&self, f: &Filters) -> Vec<ProxyItem> {
        self.listing()
            .iter()
            .filter(|(_, i)| matches(i, f))
            .map(|(_, i)| i.clone())
            .collect()
    }
}

/// An API error: status, machine code, message.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    /// An error.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
            },
        };
        (self.status, Json(body)).into_response()
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// Reads a JSON body: empty means `{}` when `empty_ok`; over the cap 413;
/// broken JSON 400; well-formed but wrong shape (unknown field, wrong
/// type) 422.
fn parse_body<T: DeserializeOwned>(
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
    let blank = bytes.iter().all(u8::is_ascii_whitespace);
    let value: serde_json::Value = if blank && empty_ok {
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

fn check_len(field: &str, v: &Option<String>) -> ApiResult<()> {
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

fn unknown_lease() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "unknown_lease", "no such lease")
}

/// 409: the lease is live but its proxy left the healthy set.
fn proxy_unavailable(lease: &crate::lease::Lease) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "proxy_unavailable",
        format!("proxy {} is no longer healthy", lease.proxy),
    )
}

fn ttl_error(e: crate::lease::TtlError) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_ttl", e.to_string())
}

/// Liveness of the API.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "The API serves", body = String)), security(()))]
async fn healthz() -> &'static str {
    "ok"
}

/// Lists healthy proxies matching the filters.
#[utoipa::path(get, path = "/v1/proxies", params(ListQuery),
    responses(
        (status = 200, body = ProxyList),
        (status = 400, description = "Unknown or malformed query parameter", body = ErrorBody),
        (status = 401, body = ErrorBody)))]
async fn list_proxies(
    State(s): State<ApiState>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<ProxyList>> {
    let f = parse_query(q.as_deref())
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
        (status = 400, description = "Malformed JSON or invalid ttlSeconds", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 409, description = "No healthy proxy matches (no_proxy) or all are at capacity or cooling down (no_capacity)", body = ErrorBody),
        (status = 413, body = ErrorBody),
        (status = 422, description = "Unknown field or wrong type", body = ErrorBody)))]
async fn acquire(
    State(s): State<ApiState>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let b: AcquireBody = parse_body(body, true)?;
    check_len("stickyKey", &b.sticky_key)?;
    check_len("site", &b.site)?;
    let ttl = s.leases.ttl(b.ttl_seconds).map_err(ttl_error)?;
    let listing = s.listing();
    let keys: Vec<&crate::lease::ProxyKey> = listing
        .iter()
        .filter(|(_, i)| matches(i, &b.filters))
        .map(|(k, _)| k)
        .collect();
    let req = AcquireRequest {
        ttl,
        sticky_key: b.sticky_key,
        site: b.site,
    };
    match s.leases.acquire(&keys, &req) {
        Ok(lease) => {
            s.metrics.lease_event("granted", 1);
            let item = listing
                .iter()
                .find(|(k, _)| *k == lease.proxy)
                .map(|(_, i)| i.clone())
                .ok_or_else(|| {
                    ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal",
                        "leased proxy vanished",
                    )
                })?;
            let mut resp =
                (StatusCode::CREATED, Json(lease_response(&lease, item))).into_response();
            if let Ok(v) = format!("/v1/leases/{}", lease.id).parse() {
                resp.headers_mut().insert(header::LOCATION, v);
            }
            Ok(resp)
        }
        Err(e) => {
            s.metrics.lease_event("refused", 1);
            let code = match e {
                AcquireError::NoProxy => "no_proxy",
                AcquireError::NoCapacity { .. } => "no_capacity",
            };
            Err(ApiError::new(StatusCode::CONFLICT, code, e.to_string()))
        }
    }
}

fn item_for(s: &ApiState, lease: &Lease) -> Option<ProxyItem> {
    let listing = s.listing();
    listing
        .binary_search_by(|(k, _)| k.cmp(&lease.proxy))
        .ok()
        .map(|i| listing[i].1.clone())
}

/// Reads a live lease.
#[utoipa::path(get, path = "/v1/leases/{id}", params(("id" = String, Path, description = "Lease id")),
    responses((status = 200, body = LeaseResponse), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "The leased proxy is no longer healthy", body = ErrorBody)))]
async fn get_lease(
    State(s): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<Json<LeaseResponse>> {
    let lease = s.leases.get(&id).ok_or_else(unknown_lease)?;
    let item = item_for(&s, &lease).ok_or_else(|| proxy_unavailable(&lease))?;
    Ok(Json(lease_response(&lease, item)))
}

/// Extends a live lease to now + ttlSeconds (default: the default TTL).
#[utoipa::path(post, path = "/v1/leases/{id}/renew", params(("id" = String, Path, description = "Lease id")),
    request_body(content = Option<RenewBody>, description = "Optional; an empty body is {}"),
    responses((status = 200, body = LeaseResponse), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, description = "The leased proxy is no longer healthy; the lease runs out", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn renew(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<LeaseResponse>> {
    let b: RenewBody = parse_body(body, true)?;
    let ttl = s.leases.ttl(b.ttl_seconds).map_err(ttl_error)?;
    let lease = s.leases.get(&id).ok_or_else(unknown_lease)?;
    let item = item_for(&s, &lease).ok_or_else(|| proxy_unavailable(&lease))?;
    let lease = s.leases.renew(&id, ttl).ok_or_else(unknown_lease)?;
    s.metrics.lease_event("renewed", 1);
    Ok(Json(lease_response(&lease, item)))
}

/// Ends a lease. Idempotent: an unknown or already released lease is 204 too.
#[utoipa::path(delete, path = "/v1/leases/{id}", params(("id" = String, Path, description = "Lease id")),
    responses((status = 204, description = "Released (or already gone)"), (status = 401, body = ErrorBody)))]
async fn release(State(s): State<ApiState>, Path(id): Path<String>) -> StatusCode {
    if s.leases.release(&id) {
        s.metrics.lease_event("released", 1);
    }
    StatusCode::NO_CONTENT
}

/// Reports how a leased proxy did. `blocked` or `failed` withholds the
/// proxy for --lease-cooldown: for `site` only when given, for every site
/// otherwise. The lease is kept.
#[utoipa::path(post, path = "/v1/leases/{id}/report", params(("id" = String, Path, description = "Lease id")),
    request_body = ReportBody,
    responses((status = 204, description = "Recorded"), (status = 400, description = "Malformed JSON or invalid result", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 413, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn report(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<StatusCode> {
    let b: ReportBody = parse_body(body, false)?;
    check_len("site", &b.site)?;
    let outcome = match b.result.as_str() {
        "ok" => Outcome::Ok,
        "blocked" => Outcome::Blocked,
        "failed" => Outcome::Failed,
        other => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_result",
                format!("result must be ok, blocked or failed, got {other:?}"),
            ))
        }
    };
    s.leases
        .report(&id, outcome, b.site.as_deref())
        .ok_or_else(unknown_lease)?;
    s.metrics.lease_event(outcome.as_str(), 1);
    Ok(StatusCode::NO_CONTENT)
}

#[derive(OpenApi)]
#[openapi(
    info(title = "egress-proxies-operator discovery and lease API", description = "Lists healthy proxies and leases them to crawlers. See docs/api.md."),
    paths(healthz, list_proxies, acquire, get_lease, renew, release, report),
    components(schemas(ProxyItem, ProxyList, Filters, AcquireBody, RenewBody, ReportBody, ReportResult, LeaseResponse, ErrorBody, ErrorDetail)),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI 3 document, generated from the handlers and types, with
/// the `ttlSeconds` maximum of this deployment (`--max-lease-ttl`).
pub fn openapi_json(max_ttl: Duration) -> String {
    let Ok(mut doc) = serde_json::to_value(ApiDoc::openapi()) else {
        return "{}".to_string();
    };
    for schema in ["AcquireBody", "RenewBody"] {
        if let Some(ttl) = doc
            .pointer_mut(&format!(
                "/components/schemas/{schema}/properties/ttlSeconds"
            ))
            .and_then(|v| v.as_object_mut())
        {
            ttl.insert("maximum".into(), max_ttl.as_secs().into());
        }
    }
    serde_json::to_string_pretty(&doc).unwrap_or_else(|_| "{}".to_string())
}

fn exempt(path: &str) -> bool {
    path == "/healthz" || path == "/openapi.json"
}

async fn auth(State(s): State<ApiState>, req: Request, next: Next) -> Response {
    let Some(want) = &s.token_digest else {
        return next.run(req).await;
    };
    if exempt(req.uri().path()) {
        return next.run(req).await;
    }
    let given = bearer(req.headers()).unwrap_or("");
    // Hash first so the comparison is constant-time in the length too.
    let got: [u8; 32] = Sha256::digest(given.as_bytes()).into();
    if bool::from(got.ct_eq(want)) && !given.is_empty() {
        next.run(req).await
    } else {
        let mut resp = ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token",
        )
        .into_response();
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        resp
    }
}

fn bearer(h: &HeaderMap) -> Option<&str> {
    let v = h.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Parses a W3C `traceparent` (version 00): trace id, parent span id, flags.
pub fn parse_traceparent(v: &str) -> Option<(u128, u64, u8)> {
    let mut it = v.trim().split('-');
    let (ver, trace, span, flags) = (it.next()?, it.next()?, it.next()?, it.next()?);
    if ver.len() != 2 || ver == "ff" || trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
        return None;
    }
    if ver == "00" && it.next().is_some() {
        return None;
    }
    let trace = u128::from_str_radix(trace, 16).ok().filter(|t| *t != 0)?;
    let span = u64::from_str_radix(span, 16).ok().filter(|s| *s != 0)?;
    Some((trace, span, u8::from_str_radix(flags, 16).ok()?))
}

fn set_remote_parent(span: &tracing::Span, headers: &HeaderMap) {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let Some((t, s, f)) = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_traceparent)
    else {
        return;
    };
    let sc = SpanContext::new(
        TraceId::from(t),
        SpanId::from(s),
        TraceFlags::new(f),
        true,
        TraceState::default(),
    );
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(sc));
}

/// Outermost: recover panics (500), one server span named after the route
/// pattern, one `request` log line, the route metrics.
async fn observe(State(s): State<ApiState>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    // Label values stay bounded: known methods and route patterns only.
    let m = match method.as_str() {
        "GET" | "POST" | "DELETE" | "PUT" | "PATCH" | "HEAD" | "OPTIONS" => method.as_str(),
        _ => "OTHER",
    };
    let route = format!("{m} {}", route_of(&path));
    let traced = path != "/healthz";
    let span = if traced {
        let span = tracing::info_span!("request", otel.name = %route, otel.kind = "server", http.route = %route, http.response.status_code = tracing::field::Empty);
        set_remote_parent(&span, req.headers());
        span
    } else {
        tracing::Span::none()
    };
    let resp = match AssertUnwindSafe(next.run(req).instrument(span.clone()))
        .catch_unwind()
        .await
    {
        Ok(r) => r,
        Err(_) => {
            warn!(route = %route, "Handler panicked");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error",
            )
            .into_response()
        }
    };
    let status = resp.status().as_u16();
    let took = start.elapsed();
    span.record("http.response.status_code", status);
    s.metrics.observe_request(&route, status, took);
    if traced {
        span.in_scope(
            || info!(method = %method, path = %path, status, duration = ?took, "request"),
        );
    }
    resp
}

/// The route pattern of a path (span names and metric labels must not
/// carry lease ids).
pub fn route_of(path: &str) -> &'static str {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["healthz"] => "/healthz",
        ["openapi.json"] => "/openapi.json",
        ["v1", "proxies"] => "/v1/proxies",
        ["v1", "leases"] => "/v1/leases",
        ["v1", "leases", id] if !id.is_empty() => "/v1/leases/{id}",
        ["v1", "leases", id, "renew"] if !id.is_empty() => "/v1/leases/{id}/renew",
        ["v1", "leases", id, "report"] if !id.is_empty() => "/v1/leases/{id}/report",
        _ => "unmatched",
    }
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
}

/// The API's router.
pub fn router(state: ApiState) -> Router {
    let doc = openapi_json(state.leases.config().max_ttl);
    Router::new()
        .route("/healthz", get(healthz))
        .route(
            "/openapi.json",
            get(move || {
                let doc = doc.clone();
                async move { ([(header::CONTENT_TYPE, "application/json")], doc) }
            }),
        )
        .route("/v1/proxies", get(list_proxies))
        .route("/v1/leases", post(acquire))
        .route("/v1/leases/{id}", get(get_lease).delete(release))
        .route("/v1/leases/{id}/renew", post(renew))
        .route("/v1/leases/{id}/report", post(report))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}

/// Sweeps expired leases and forgets deleted Proxies every second.
pub async fn sweep(state: ApiState, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tick.tick() => {
                let n = state.leases.sweep();
                state.metrics.lease_event("expired", n as u64);
                let present = state
                    .source
                    .proxies()
                    .iter()
                    .map(|p| crate::lease::ProxyKey {
                        namespace: kube::ResourceExt::namespace(p.as_ref()).unwrap_or_default(),
                        name: kube::ResourceExt::name_any(p.as_ref()),
                    })
                    .collect();
                state.leases.retain_proxies(&present);
            }
        }
    }
}

/// Serves the API on `addr` until `shutdown` resolves (graceful), with
/// the lease sweeper alongside.
pub async fn serve(
    addr: SocketAddr,
    state: ApiState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    serve_on(listener, state, shutdown).await
}

/// As [`serve`], on a bound listener (tests bind port 0).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    state: ApiState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if !state.authenticated() {
        warn!(
            "DISCOVERY_TOKEN is not set: the discovery and lease API serves WITHOUT authentication"
        );
    }
    let (tx, rx) = tokio::sync::watch::channel(false);
    let stop = {
        let mut rx = rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let sweeper = tokio::spawn(sweep(state.clone(), stop));
    let app = router(state);
    let res = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            let _ = tx.send(true);
        })
        .await;
    drop(rx);
    let _ = sweeper.await;
    res
}

#[cfg(test)]
mod tests;
