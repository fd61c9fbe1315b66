//! Repositories: create, list, delete.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use crate::auth::Action;
use crate::error::AppError;
use crate::extract::{Caller, JsonBody, WritableRepository};
use crate::input;
use crate::queries::repositories::Repository;
use crate::state::AppState;

/// The body of `POST /api/v1/repositories`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewRepository {
    name: String,
    storage_namespace: String,
}

/// `POST /api/v1/repositories`: 201 with the repository, or 409.
pub(crate) async fn create(
    State(state): State<AppState>,
    Caller(caller): Caller,
    JsonBody(new): JsonBody<NewRepository>,
) -> Result<(StatusCode, Json<Repository>), AppError> {
    input::repository(&new.name)?;
    input::storage_namespace(&new.storage_namespace)?;
    caller.require(Action::Write, &new.name)?;
    let repo = state
        .writes
        .create_repository(&new.name, &new.storage_namespace)
        .await?;
    Ok((StatusCode::CREATED, Json(repo)))
}

/// `GET /api/v1/repositories`: the repositories the caller may read.
pub(crate) async fn list(
    State(state): State<AppState>,
    Caller(caller): Caller,
) -> Result<Json<serde_json::Value>, AppError> {
    let repos: Vec<Repository> = state
        .reads
        .list_repositories()
        .await?
        .into_iter()
        .filter(|r| caller.may(Action::Read, &r.name))
        .collect();
    Ok(Json(json!({ "repositories": repos })))
}

/// `DELETE /api/v1/repositories/{repo}`: 204 (objects included), or 404.
pub(crate) async fn delete(
    State(state): State<AppState>,
    WritableRepository(repository): WritableRepository,
) -> Result<StatusCode, AppError> {
    state.writes.delete_repository(&repository).await?;
    Ok(StatusCode::NO_CONTENT)
}
