//! The seed benchmark's rows over HTTP.

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use crate::auth::Action;
use crate::error::AppError;
use crate::extract::{Caller, PathParams};
use crate::failure::Failure;
use crate::input;
use crate::state::AppState;

/// A `random_read_test` row.
#[derive(Debug, Serialize)]
pub(crate) struct KvRow {
    pk: String,
    payload: String,
}

/// `GET /api/v1/kv/{pk}`: the seed benchmark's lookup over HTTP.
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
