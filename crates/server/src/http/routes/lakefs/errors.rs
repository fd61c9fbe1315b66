//! Failures as lakeFS answers them, where that differs from the service's
//! own API: its clients map statuses to exception types (the Python SDK
//! raises `UnauthorizedException` for 401, `NotFoundException` for 404),
//! so the status is what they act on.
//!
//! - A caller without the grant gets 401 "insufficient permissions", as
//!   lakeFS's `authorize` answers, not 403.
//! - A write to a read-only repository gets 403 "read-only repository".
//! - An operation this server leaves out gets 501 (see `unserved`).
//!
//! Everything else is the service's own answer ([`AppError`]), whose body
//! carries lakeFS's `{"message"}` too.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::domain::failure::Failure;
use crate::http::error::AppError;

/// An error answer on the lakeFS routes.
#[derive(Debug)]
pub(crate) struct LakeError(AppError);

impl LakeError {
    /// An answer with this status, machine-readable code and message.
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self(AppError::new(status, code, message))
    }

    /// lakeFS's refusal of a write to a read-only repository.
    pub(crate) fn read_only() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "read_only_repository",
            "read-only repository",
        )
    }

    /// The status.
    pub(crate) fn status(&self) -> StatusCode {
        self.0.status()
    }

    /// The message.
    pub(crate) fn message(&self) -> &str {
        self.0.message()
    }
}

impl From<Failure> for LakeError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Forbidden(why) => Self::new(
                StatusCode::UNAUTHORIZED,
                "insufficient_permissions",
                format!("insufficient permissions: {why}"),
            ),
            other => Self(other.into()),
        }
    }
}

impl From<AppError> for LakeError {
    fn from(error: AppError) -> Self {
        Self(error)
    }
}

impl IntoResponse for LakeError {
    fn into_response(self) -> Response {
        self.0.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_grant_is_401_and_the_rest_as_the_service_answers() {
        let denied = LakeError::from(Failure::Forbidden("user `u` may not write `r`".into()));
        assert_eq!(denied.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            denied.message(),
            "insufficient permissions: user `u` may not write `r`"
        );
        let missing = LakeError::from(Failure::NoSuchRepository("r".into()));
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
        assert_eq!(LakeError::read_only().status(), StatusCode::FORBIDDEN);
    }
}
