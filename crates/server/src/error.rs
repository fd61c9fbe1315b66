//! Errors as HTTP responses: `{"error": {"code": ..., "message": ...}}`.
//!
//! A 4xx says what was wrong with the request. A 5xx gives a generic
//! message and logs the cause, which may hold details a client should not
//! see.

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::read_path::ReadError;
use crate::write_path::WriteError;

/// Seconds a client is asked to wait after a 503.
const RETRY_AFTER_SECS: u64 = 1;

/// An error response.
#[derive(Debug)]
pub struct AppError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// Logged, never sent.
    cause: Option<anyhow::Error>,
}

impl AppError {
    /// A response with this status, machine-readable code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            cause: None,
        }
    }

    /// 400 with `code` and `message`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 404 with `code` and `message`.
    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }

    /// The response status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The machine-readable code.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<WriteError> for AppError {
    fn from(e: WriteError) -> Self {
        let message = e.to_string();
        match e {
            WriteError::NoSuchRepository(_) => Self::not_found("repository_not_found", message),
            WriteError::RepositoryExists(_) => {
                Self::new(StatusCode::CONFLICT, "repository_exists", message)
            }
            WriteError::Conflict(_) => Self::new(StatusCode::CONFLICT, "conflict", message),
            WriteError::Refused(_) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "rejected", message)
            }
            WriteError::BadLine { .. } => Self::bad_request("invalid_import_line", message),
            WriteError::TooLarge(_) => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
            }
            WriteError::Overloaded => ReadError::Overloaded.into(),
            WriteError::Timeout => Self::new(
                StatusCode::GATEWAY_TIMEOUT,
                "timeout",
                "the write did not complete within its deadline; it may still be applied",
            ),
            WriteError::Database(cause) => ReadError::Database(cause).into(),
        }
    }
}

impl From<ReadError> for AppError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Overloaded => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                "the server is overloaded; retry later",
            ),
            ReadError::Timeout => Self::new(
                StatusCode::GATEWAY_TIMEOUT,
                "timeout",
                "the lookup did not complete within its deadline",
            ),
            ReadError::Database(cause) => Self {
                cause: Some(cause),
                ..Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "database_unavailable",
                    "the database is unavailable; retry later",
                )
            },
        }
    }
}

impl From<JsonRejection> for AppError {
    fn from(r: JsonRejection) -> Self {
        let code = match r.status() {
            StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
            _ => "invalid_json",
        };
        Self::new(r.status(), code, r.body_text())
    }
}

impl From<PathRejection> for AppError {
    fn from(r: PathRejection) -> Self {
        Self::new(r.status(), "invalid_path_parameter", r.body_text())
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            match &self.cause {
                Some(cause) => tracing::error!(code = self.code, error = ?cause, "request failed"),
                None => tracing::warn!(code = self.code, "request failed"),
            }
        }
        let body = json!({ "error": { "code": self.code, "message": self.message } });
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        response
    }
}
