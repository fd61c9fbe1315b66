//! Liveness and readiness, without a token.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;

use crate::db;
use crate::http::error::AppError;
use crate::service::state::AppState;

/// `{"status": "ok"}` or `{"status": "ready", "caches": ...}`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct StatusBody {
    /// `ok` or `ready`.
    #[schema(value_type = String)]
    status: &'static str,
    /// With `ready`: `in_use`, or `bypassed` while the cross-instance
    /// invalidation listener is not proved to hear every change (it is
    /// reconnecting, after a failover say; reads go to the database).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    caches: Option<&'static str>,
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
    Json(StatusBody {
        status: "ok",
        caches: None,
    })
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
        Ok(Ok(())) => Ok(Json(StatusBody {
            status: "ready",
            caches: Some(if state.coherence.caches_usable() {
                "in_use"
            } else {
                "bypassed"
            }),
        })),
        Ok(Err(e)) => {
            tracing::warn!(error = ?e, "readiness check failed");
            let busy = e
                .downcast_ref::<deadpool_postgres::PoolError>()
                .is_some_and(|p| {
                    matches!(
                        p,
                        deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Wait)
                    )
                });
            Err(not_ready(if busy {
                "every database connection is busy (overloaded)"
            } else {
                "no database node that takes writes accepts connections (down, or failing over)"
            }))
        }
        Err(_) => {
            tracing::warn!(timeout = ?READY_TIMEOUT, "readiness check: the database did not answer");
            Err(not_ready(
                "the database did not answer within 2 s (it hangs, or is failing over)",
            ))
        }
    }
}

fn not_ready(message: &'static str) -> AppError {
    AppError::new(StatusCode::SERVICE_UNAVAILABLE, "not_ready", message)
}
