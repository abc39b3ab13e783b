//! Reading a request by the API's rules: its JSON body, the lengths of
//! its keys, its caller, a report's result, a TTL's refusal. Nothing here
//! touches the API's state.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::Extension;
use serde::de::DeserializeOwned;

use super::client::{Client, ANONYMOUS};
use super::error::{ApiError, ApiResult};
use crate::lease::{Outcome, TtlError};

/// Request bodies above this answer 413.
pub const BODY_LIMIT: usize = 64 * 1024;

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

/// A key, site or username: 1 to [`MAX_KEY_LEN`] printable ASCII
/// characters, as the OpenAPI document says (its `maxLength` counts
/// characters and the store bounds bytes: in ASCII they are the same).
pub(super) fn check_len(field: &str, v: &Option<String>) -> ApiResult<()> {
    let printable = |s: &str| s.bytes().all(|b| (0x20..=0x7e).contains(&b));
    match v {
        Some(s) if s.is_empty() || s.len() > MAX_KEY_LEN || !printable(s) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            format!("{field} must be 1-{MAX_KEY_LEN} printable ASCII characters"),
        )),
        _ => Ok(()),
    }
}

/// The caller: its token's name (the anonymous name without tokens), as
/// acquire records it on a lease.
pub(super) fn caller(client: Option<Extension<Client>>) -> std::sync::Arc<str> {
    client
        .map(|Extension(c)| c.0)
        .unwrap_or_else(|| ANONYMOUS.into())
}

pub(super) fn ttl_error(e: TtlError) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_ttl", e.to_string())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_printable_ascii_as_the_document_says() {
        let ok = |s: &str| check_len("site", &Some(s.to_string())).is_ok();
        assert!(check_len("site", &None).is_ok(), "absent");
        assert!(ok("example.com") && ok(&"k".repeat(256)) && ok("a b~"));
        for (name, s) in [
            ("empty", String::new()),
            ("257", "k".repeat(257)),
            ("non-ASCII within 256 characters", "ä".repeat(200)),
            ("a control character", "a\u{6}b".to_string()),
        ] {
            assert!(!ok(&s), "{name}");
        }
        let e = check_len("stickyKey", &Some("ä".into())).unwrap_err();
        assert!(
            format!("{e:?}").contains("stickyKey must be 1-256 printable ASCII"),
            "{e:?}"
        );
    }
}
