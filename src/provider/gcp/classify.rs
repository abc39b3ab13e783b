//! Error classification for the gcp provider: the one `classify` function,
//! the health-check reason mapping, and the classification of a failed
//! (asynchronous) insert operation.

use std::error::Error as StdError;

use google_cloud_compute_v1::Error as ApiError;
use google_cloud_gax::error::rpc::StatusDetails;

use crate::provider::ErrorClass;

/// Error reasons (Google's `errors[].reason` / `ErrorInfo.reason`) that mean
/// a quota or rate limit, compared after lowercasing and dropping `_`.
const QUOTA_REASONS: [&str; 3] = [
    "quotaexceeded",
    "ratelimitexceeded",
    "userratelimitexceeded",
];

fn normalise(reason: &str) -> String {
    reason
        .chars()
        .filter(|c| *c != '_')
        .flat_map(char::to_lowercase)
        .collect()
}

/// Whether a reason names a quota or rate limit.
pub fn is_quota_reason(reason: &str) -> bool {
    let n = normalise(reason);
    QUOTA_REASONS.contains(&n.as_str())
}

/// The SDK error somewhere in the chain, if any.
pub fn api_error<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a ApiError> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(a) = e.downcast_ref::<ApiError>() {
            return Some(a);
        }
        cur = e.source();
    }
    None
}

/// Every error reason the API gave: `ErrorInfo` details of a parsed status
/// and, for an unparsed body, the legacy `error.errors[].reason` items.
pub fn reasons(err: &ApiError) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(st) = err.status() {
        for d in &st.details {
            if let StatusDetails::ErrorInfo(info) = d {
                if !info.reason.is_empty() {
                    out.push(info.reason.clone());
                }
            }
        }
    }
    if let Some(body) = err.http_payload() {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
            if let Some(items) = v.pointer("/error/errors").and_then(|e| e.as_array()) {
                for it in items {
                    if let Some(r) = it.get("reason").and_then(|r| r.as_str()) {
                        out.push(r.to_string());
                    }
                }
            }
        }
    }
    out
}

/// The HTTP status of an API error anywhere in the chain.
pub fn http_status(err: &(dyn StdError + 'static)) -> Option<u16> {
    api_error(err).and_then(ApiError::http_status_code)
}

/// The class of a gcp error (providers.md §11.6):
///
/// | error | class |
/// |---|---|
/// | not an SDK error, transport, token, timeout | Transient |
/// | 404 | NotFound |
/// | 429 | QuotaExceeded |
/// | 403 with a quota / rate-limit reason | QuotaExceeded |
/// | 401, other 403 (permission, API disabled) | Unavailable |
/// | 400 | Permanent |
/// | a request the SDK cannot even bind (missing path parameter) | Permanent |
/// | anything else (5xx, 409 outside create, …) | Transient |
///
/// 409 on insert never reaches here: create treats it as "already exists".
pub fn classify(err: &(dyn StdError + 'static)) -> ErrorClass {
    let Some(api) = api_error(err) else {
        return ErrorClass::Transient;
    };
    if api.is_binding() {
        return ErrorClass::Permanent;
    }
    match api.http_status_code() {
        Some(404) => ErrorClass::NotFound,
        Some(429) => ErrorClass::QuotaExceeded,
        Some(403) if reasons(api).iter().any(|r| is_quota_reason(r)) => ErrorClass::QuotaExceeded,
        // A credential or permission problem: restoring the credentials or
        // the role fixes it, no edit of a Proxy does.
        Some(401 | 403) => ErrorClass::Unavailable,
        Some(400) => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    }
}

/// A one-line summary of an API error for the raw-error log line: HTTP
/// status, reasons and the message.
pub fn describe(err: &(dyn StdError + 'static)) -> String {
    match api_error(err) {
        Some(api) => format!(
            "http_status={} reasons={:?} error={}",
            api.http_status_code()
                .map(|c| c.to_string())
                .unwrap_or_else(|| "none".into()),
            reasons(api),
            api
        ),
        None => format!("error={err}"),
    }
}

/// Health-check reason (provider-health.md §4.3, gcp): a deadline or a
/// timeout wins; then 401 Unauthorized, 403 Forbidden, any other HTTP
/// status APIError; everything without a status (transport, token) is
/// Unreachable.
pub fn check_reason(err: &(dyn StdError + 'static)) -> &'static str {
    let Some(api) = api_error(err) else {
        return "Unreachable";
    };
    if api.is_timeout() || chain_mentions_timeout(err) {
        return "Timeout";
    }
    match api.http_status_code() {
        Some(401) => "Unauthorized",
        Some(403) => "Forbidden",
        Some(_) => "APIError",
        None if api.status().is_some() => "APIError",
        None => "Unreachable",
    }
}

fn chain_mentions_timeout(err: &(dyn StdError + 'static)) -> bool {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return true;
            }
        }
        if e.downcast_ref::<tokio::time::error::Elapsed>().is_some() {
            return true;
        }
        cur = e.source();
    }
    false
}

/// The class of a finished insert operation's error codes: quota and
/// capacity codes are QuotaExceeded (retry in minutes), the rest Permanent.
pub fn classify_operation_codes<'a>(codes: impl IntoIterator<Item = &'a str>) -> ErrorClass {
    let quota = codes.into_iter().any(|c| {
        let n = normalise(c);
        n.contains("quota")
            || n.contains("ratelimit")
            || n.starts_with("zoneresourcepoolexhausted")
            || n == "resourceexhausted"
    });
    if quota {
        ErrorClass::QuotaExceeded
    } else {
        ErrorClass::Permanent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes_like::body;

    mod bytes_like {
        pub fn body(code: u16, reason: &str) -> String {
            format!(
                r#"{{"error":{{"code":{code},"message":"m","errors":[{{"reason":"{reason}","domain":"global","message":"m"}}]}}}}"#
            )
        }
    }

    fn http(code: u16, reason: &str) -> ApiError {
        // The integration tests cover parsed service errors through the
        // real client; here the body stays raw.
        raw(code, &body(code, reason))
    }

    fn raw(code: u16, payload: &str) -> ApiError {
        ApiError::http(
            code,
            Default::default(),
            payload.to_string().into_bytes().into(),
        )
    }

    #[test]
    fn classify_table() {
        let cases: Vec<(&str, Box<dyn StdError + Send + Sync>, ErrorClass)> = vec![
            (
                "not an sdk error",
                Box::new(std::io::Error::other("x")),
                ErrorClass::Transient,
            ),
            ("404", Box::new(http(404, "notFound")), ErrorClass::NotFound),
            (
                "429",
                Box::new(http(429, "rateLimitExceeded")),
                ErrorClass::QuotaExceeded,
            ),
            (
                "403 quota",
                Box::new(http(403, "quotaExceeded")),
                ErrorClass::QuotaExceeded,
            ),
            (
                "403 rate",
                Box::new(http(403, "rateLimitExceeded")),
                ErrorClass::QuotaExceeded,
            ),
            (
                "403 user rate",
                Box::new(http(403, "userRateLimitExceeded")),
                ErrorClass::QuotaExceeded,
            ),
            (
                "403 ErrorInfo style",
                Box::new(http(403, "RATE_LIMIT_EXCEEDED")),
                ErrorClass::QuotaExceeded,
            ),
            (
                "403 forbidden",
                Box::new(http(403, "forbidden")),
                ErrorClass::Unavailable,
            ),
            (
                "403 api disabled",
                Box::new(http(403, "accessNotConfigured")),
                ErrorClass::Unavailable,
            ),
            (
                "403 raw body quota",
                Box::new(raw(403, &body(403, "quotaExceeded"))),
                ErrorClass::QuotaExceeded,
            ),
            (
                "403 raw text",
                Box::new(raw(403, "denied")),
                ErrorClass::Unavailable,
            ),
            ("400", Box::new(http(400, "invalid")), ErrorClass::Permanent),
            (
                "401",
                Box::new(http(401, "authError")),
                ErrorClass::Unavailable,
            ),
            (
                "409 outside create",
                Box::new(http(409, "alreadyExists")),
                ErrorClass::Transient,
            ),
            (
                "500",
                Box::new(http(500, "backendError")),
                ErrorClass::Transient,
            ),
            (
                "502 raw",
                Box::new(raw(502, "bad gateway")),
                ErrorClass::Transient,
            ),
            (
                "timeout",
                Box::new(ApiError::timeout(std::io::Error::other("t"))),
                ErrorClass::Transient,
            ),
            (
                "io",
                Box::new(ApiError::io(std::io::Error::other("reset"))),
                ErrorClass::Transient,
            ),
        ];
        for (name, err, want) in cases {
            let e: &(dyn StdError + 'static) = err.as_ref();
            assert_eq!(classify(e), want, "{name}");
        }
    }

    #[test]
    fn check_reason_table() {
        let cases: Vec<(&str, Box<dyn StdError + Send + Sync>, &str)> = vec![
            (
                "not an sdk error",
                Box::new(std::io::Error::other("x")),
                "Unreachable",
            ),
            (
                "io",
                Box::new(ApiError::io(std::io::Error::other("refused"))),
                "Unreachable",
            ),
            (
                "timeout",
                Box::new(ApiError::timeout(std::io::Error::other("t"))),
                "Timeout",
            ),
            (
                "transport wrapping a deadline",
                Box::new(ApiError::io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "deadline",
                ))),
                "Timeout",
            ),
            ("401", Box::new(http(401, "authError")), "Unauthorized"),
            ("403", Box::new(http(403, "forbidden")), "Forbidden"),
            (
                "403 disabled",
                Box::new(http(403, "accessNotConfigured")),
                "Forbidden",
            ),
            (
                "403 quota",
                Box::new(http(403, "quotaExceeded")),
                "Forbidden",
            ),
            ("500", Box::new(http(500, "backendError")), "APIError"),
            ("404", Box::new(raw(404, "nope")), "APIError"),
        ];
        for (name, err, want) in cases {
            let e: &(dyn StdError + 'static) = err.as_ref();
            assert_eq!(check_reason(e), want, "{name}");
        }
    }

    #[test]
    fn operation_codes() {
        assert_eq!(
            classify_operation_codes(["QUOTA_EXCEEDED"]),
            ErrorClass::QuotaExceeded
        );
        assert_eq!(
            classify_operation_codes(["ZONE_RESOURCE_POOL_EXHAUSTED"]),
            ErrorClass::QuotaExceeded
        );
        assert_eq!(
            classify_operation_codes(["RATE_LIMIT_EXCEEDED"]),
            ErrorClass::QuotaExceeded
        );
        assert_eq!(
            classify_operation_codes(["RESOURCE_NOT_FOUND"]),
            ErrorClass::Permanent
        );
        assert_eq!(
            classify_operation_codes(["INVALID_FIELD_VALUE"]),
            ErrorClass::Permanent
        );
        assert_eq!(classify_operation_codes([]), ErrorClass::Permanent);
    }
}
