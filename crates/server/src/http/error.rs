//! Errors as HTTP responses: `{"error": {"code": ..., "message": ...},
//! "message": ...}`.
//! This module only maps; what went wrong is a [`Failure`], or an axum
//! rejection.
//!
//! A 4xx says what was wrong with the request. A 5xx gives a generic
//! message and logs the cause, which may hold details a client should not
//! see.

use std::any::Any;

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::failure::Failure;

/// Seconds a client is asked to wait after a 503.
const RETRY_AFTER_SECS: u64 = 1;

/// Every error's body: `{"error": {"code": ..., "message": ...},
/// "message": ...}`. The top-level `message` repeats `error.message`: it is
/// lakeFS's whole error shape (`{"message"}`), which its clients read on
/// the `/lakefs` routes.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
    /// The same as `error.message`.
    pub message: String,
}

/// The inside of an [`ErrorBody`].
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Machine-readable and stable: `object_not_found`, `overloaded`, ...
    #[schema(example = "object_not_found")]
    pub code: String,
    /// For people: names the problem (for a 5xx, a generic text).
    pub message: String,
}

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

    /// 401 with `code` and `message` (and `WWW-Authenticate: Bearer`).
    pub fn unauthorized(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, code, message)
    }

    /// 500 for a bug: the details are logged, not sent.
    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal server error",
        )
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

impl From<Failure> for AppError {
    fn from(failure: Failure) -> Self {
        let (status, code) = match &failure {
            Failure::Invalid { code, .. } => (StatusCode::BAD_REQUEST, *code),
            Failure::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            Failure::NoSuchRepository(_) => (StatusCode::NOT_FOUND, "repository_not_found"),
            Failure::NoSuchObject { .. } => (StatusCode::NOT_FOUND, "object_not_found"),
            Failure::NoSuchRef { .. } => (StatusCode::NOT_FOUND, "ref_not_found"),
            Failure::NoSuchRow(_) => (StatusCode::NOT_FOUND, "row_not_found"),
            Failure::NoSuchToken(_) => (StatusCode::NOT_FOUND, "token_not_found"),
            Failure::NoSuchUser(_) => (StatusCode::NOT_FOUND, "user_not_found"),
            Failure::RepositoryExists(_) => (StatusCode::CONFLICT, "repository_exists"),
            Failure::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            // Input that passed the checks here and broke a rule of the
            // database's: still bad input, so 400 like all of it.
            Failure::Rejected(_) => (StatusCode::BAD_REQUEST, "rejected"),
            Failure::BadImportLine { .. } => (StatusCode::BAD_REQUEST, "invalid_import_line"),
            Failure::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            Failure::BodyStalled(_) | Failure::BodyTooSlow(_) => {
                (StatusCode::REQUEST_TIMEOUT, "body_timeout")
            }
            Failure::Overloaded => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            Failure::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
            Failure::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "database_unavailable"),
            Failure::SessionStateLost(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "pooler_session_state")
            }
        };
        let message = failure.to_string();
        Self {
            cause: match failure {
                Failure::Unavailable(cause) => Some(cause),
                Failure::SessionStateLost(cause) => Some(cause.context(
                    "DATABASE_URL goes through a connection pooler the service is not set up \
                     for: behind a transaction-mode pooler start it with --pooler transaction \
                     (PGBATCH_POOLER=transaction), behind a session-mode one that refuses \
                     startup options with --pooler session; --pooler auto finds out",
                )),
                _ => None,
            },
            ..Self::new(status, code, message)
        }
    }
}

impl From<JsonRejection> for AppError {
    fn from(r: JsonRejection) -> Self {
        // axum answers JSON of the wrong shape with 422 and malformed JSON
        // with 400; to a client both are a bad body, and every other bad
        // input is 400, so these are too.
        let (status, code) = match r.status() {
            StatusCode::PAYLOAD_TOO_LARGE => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            _ => (StatusCode::BAD_REQUEST, "invalid_json"),
        };
        Self::new(status, code, r.body_text())
    }
}

impl From<PathRejection> for AppError {
    fn from(r: PathRejection) -> Self {
        Self::new(r.status(), "invalid_path_parameter", r.body_text())
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        // 501 is an answer (an operation this server leaves out), not a
        // failure to log.
        if self.status.is_server_error() && self.status != StatusCode::NOT_IMPLEMENTED {
            match &self.cause {
                Some(cause) => tracing::error!(code = self.code, error = ?cause, "request failed"),
                None => tracing::warn!(code = self.code, "request failed"),
            }
        }
        let body = ErrorBody {
            message: self.message.clone(),
            error: ErrorDetail {
                code: self.code.to_owned(),
                message: self.message,
            },
        };
        let mut response = (self.status, Json(body)).into_response();
        let headers = response.headers_mut();
        match self.status {
            StatusCode::SERVICE_UNAVAILABLE => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
            }
            StatusCode::UNAUTHORIZED => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        response
    }
}

/// The response to a handler's panic: a bug must cost one request a 500,
/// not the connection or the process.
pub fn panic_response(panic: Box<dyn Any + Send + 'static>) -> Response {
    let detail = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    tracing::error!(panic = %detail, "handler panicked");
    AppError::internal().into_response()
}
