//! Repositories: create, list, delete.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::auth::Action;
use crate::domain::input;
use crate::http::error::AppError;
use crate::http::extract::{Caller, JsonBody, WritableRepository};
use crate::http::position::ReadPosition;
use crate::model::repositories::Repository;
use crate::service::state::AppState;

/// The body of `POST /api/v1/repositories`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewRepository {
    name: String,
    storage_namespace: String,
}

/// `POST /api/v1/repositories`: 201 with the repository, or 409.
#[utoipa::path(
    post,
    path = "/api/v1/repositories",
    tag = "repositories",
    request_body = NewRepository,
    responses(
        (status = 201, description = "Created", body = Repository),
        (status = 400, description = "`invalid_repository_name`, `invalid_storage_namespace`, `invalid_json`", body = crate::http::error::ErrorBody),
        (status = 403, description = "The caller may not write a repository of that name", body = crate::http::error::ErrorBody),
        (status = 409, description = "`repository_exists`", body = crate::http::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
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

/// The body of `GET /api/v1/repositories`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RepositoryList {
    repositories: Vec<Repository>,
}

/// `GET /api/v1/repositories`: the repositories the caller may read.
#[utoipa::path(
    get,
    path = "/api/v1/repositories",
    tag = "repositories",
    responses(
        (status = 200, description = "The repositories the caller may read, by name", body = RepositoryList),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn list(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ReadPosition(position): ReadPosition,
) -> Result<Json<RepositoryList>, AppError> {
    let repos: Vec<Repository> = state
        .reads
        .list_repositories(position)
        .await?
        .into_iter()
        .filter(|r| caller.may(Action::Read, &r.name))
        .collect();
    Ok(Json(RepositoryList {
        repositories: repos,
    }))
}

/// `DELETE /api/v1/repositories/{repo}`: 204 (objects included), or 404.
#[utoipa::path(
    delete,
    path = "/api/v1/repositories/{repo}",
    tag = "repositories",
    params(("repo" = String, Path, description = "Repository name")),
    responses(
        (status = 204, description = "Deleted with its objects"),
        (status = 400, description = "`invalid_repository_name`", body = crate::http::error::ErrorBody),
        (status = 403, description = "The caller may not write this repository", body = crate::http::error::ErrorBody),
        (status = 404, description = "`repository_not_found`", body = crate::http::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn delete(
    State(state): State<AppState>,
    WritableRepository(repository): WritableRepository,
) -> Result<StatusCode, AppError> {
    state.writes.delete_repository(&repository).await?;
    Ok(StatusCode::NO_CONTENT)
}
