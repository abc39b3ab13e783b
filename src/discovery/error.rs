//! The API's error answer: a status and a JSON body with a machine code
//! and a message (docs/api.md, "Errors").

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::model::{ErrorBody, ErrorDetail};

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

/// What a handler answers.
pub type ApiResult<T> = Result<T, ApiError>;
