//! The API's error answer: a status and a JSON body with a machine code
//! and a message (docs/api.md, "Errors").

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::model::{ErrorBody, ErrorDetail};

/// An API error: status, machine code, message.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// When asking again is worth it (`Retry-After`, whole seconds).
    retry_after: Option<Duration>,
}

impl ApiError {
    /// An error.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// The same, telling the client to ask again after `wait`.
    pub fn retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = Some(wait);
        self
    }

    /// The same answer, asking to wait at most `cap`.
    pub fn retry_within(mut self, cap: Duration) -> Self {
        self.retry_after = Some(self.retry_after.map_or(cap, |w| w.min(cap)));
        self
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
        let mut resp = (self.status, Json(body)).into_response();
        if let Some(wait) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(wait.as_secs()));
        }
        resp
    }
}

/// What a handler answers.
pub type ApiResult<T> = Result<T, ApiError>;
