//! `GET /metrics`, without a token: what `crate::metrics` gathers, as
//! Prometheus (OpenMetrics) text.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use crate::service::state::AppState;

/// `GET /metrics`: Prometheus (OpenMetrics) text.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "health",
    responses((
        status = 200,
        description = "Prometheus / OpenMetrics text",
        body = String,
        content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"
    ))
)]
pub(crate) async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    // moka applies inserts to its entry count lazily: without this a small,
    // busy cache reports 0 entries while its hits grow.
    state.reads.sync_caches().await;
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
}
