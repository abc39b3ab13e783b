//! `make bench-scale`'s routes, served only with the hidden
//! `--bench-routes` flag. The lease figures of the benchmark are compared
//! with `POST /bench/leases` + `DELETE /bench/leases/{id}`: the same
//! process, runtime, connection handling, middleware (auth, request span,
//! body cap) and request parsing as a real acquire and release, with no
//! lease store behind them. `PUT /bench/probes` holds or resumes the health
//! engine's probes, so a lease phase can run without them.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post, put};
use axum::{Extension, Json, Router};
use serde::Deserialize;

use super::error::{ApiError, ApiResult};
use super::grant::lease_terms;
use super::request::parse_body;
use super::state::{ApiState, Client};

/// The routes, to merge into the API's router.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/bench/leases", post(acquire))
        .route("/bench/leases/{id}", delete(release))
        .route("/bench/probes", put(probes))
}

/// The shape of a grant's answer, with fixed values of a real one's size.
async fn acquire(
    State(s): State<ApiState>,
    client: Option<Extension<Client>>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let (req, _filter) = lease_terms(&s, body, client)?;
    let expires = chrono::Utc::now() + req.ttl;
    let answer = serde_json::json!({
        "id": "l1.bench.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "proxy": {
            "name": "bench", "namespace": "bench", "ip": "127.0.0.1", "port": 3128,
            "url": "http://127.0.0.1:3128", "username": "bench", "password": "bench",
        },
        "expiresAt": expires.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "ttlSeconds": req.ttl.as_secs(),
    });
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

async fn release(Path(id): Path<String>) -> ApiResult<StatusCode> {
    if id.len() > super::MAX_KEY_LEN {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_lease",
            "no such lease",
        ));
    }
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProbesBody {
    paused: bool,
}

async fn probes(
    State(s): State<ApiState>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<StatusCode> {
    let b: ProbesBody = parse_body(body, false)?;
    match &s.bench {
        Some(pause) => {
            pause.set(b.paused);
            tracing::info!(paused = b.paused, "Benchmark switched the probes");
            Ok(StatusCode::NO_CONTENT)
        }
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such route",
        )),
    }
}
