//! The seed benchmark's rows over HTTP.

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use crate::domain::auth::Action;
use crate::domain::failure::Failure;
use crate::domain::input;
use crate::http::error::AppError;
use crate::http::extract::{Caller, PathParams};
use crate::service::state::AppState;

/// A `random_read_test` row.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct KvRow {
    pk: String,
    payload: String,
}

/// `GET /api/v1/kv/{pk}`: the seed benchmark's lookup over HTTP.
#[utoipa::path(
    get,
    path = "/api/v1/kv/{pk}",
    tag = "kv",
    params(("pk" = String, Path, description = "The row's key")),
    responses(
        (status = 200, description = "The row", body = KvRow),
        (status = 400, description = "`invalid_key`, `invalid_path_parameter`", body = crate::http::error::ErrorBody),
        (status = 403, description = "The caller may not read `*`", body = crate::http::error::ErrorBody),
        (status = 404, description = "`row_not_found`", body = crate::http::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn get(
    State(state): State<AppState>,
    Caller(caller): Caller,
    pk: Result<PathParams<String>, AppError>,
) -> Result<Json<KvRow>, AppError> {
    // The benchmark table belongs to no repository: it needs global read.
    caller.require(Action::Read, "*")?;
    let PathParams(pk) = pk?;
    input::pk(&pk)?;
    match state.reads.kv.get(pk.clone()).await? {
        Some(payload) => Ok(Json(KvRow { pk, payload })),
        None => Err(Failure::NoSuchRow(pk).into()),
    }
}
