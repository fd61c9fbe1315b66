//! Liveness and readiness, without a token.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;

use crate::db;
use crate::http::error::AppError;
use crate::service::state::AppState;

/// `{"status": "ok"}` or `{"status": "ready"}`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct StatusBody {
    /// `ok` or `ready`.
    #[schema(value_type = String)]
    status: &'static str,
}

/// How long the readiness check waits for the database.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// `GET /healthz`: the process is up.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "health",
    responses((status = 200, description = "The process is up", body = StatusBody))
)]
pub(crate) async fn healthz() -> impl IntoResponse {
    Json(StatusBody { status: "ok" })
}

/// `GET /readyz`: the database answers.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "health",
    responses(
        (status = 200, description = "The database answers", body = StatusBody),
        (status = 503, description = "`not_ready`", body = crate::http::error::ErrorBody),
    )
)]
pub(crate) async fn readyz(State(state): State<AppState>) -> Result<impl IntoResponse, AppError> {
    match tokio::time::timeout(READY_TIMEOUT, db::ping(&state.pool)).await {
        Ok(Ok(())) => Ok(Json(StatusBody { status: "ready" })),
        Ok(Err(e)) => {
            tracing::warn!(error = ?e, "readiness check failed");
            Err(not_ready())
        }
        Err(_) => Err(not_ready()),
    }
}

fn not_ready() -> AppError {
    AppError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "not_ready",
        "the database is not reachable",
    )
}
