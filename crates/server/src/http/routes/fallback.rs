//! The answers to unknown routes and methods, in the JSON error shape.

use axum::http::StatusCode;

use crate::http::error::AppError;

/// Any other route.
pub(crate) async fn no_route() -> AppError {
    AppError::new(StatusCode::NOT_FOUND, "route_not_found", "no such route")
}

/// A known route with another method.
pub(crate) async fn wrong_method() -> AppError {
    AppError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not accept that method",
    )
}
