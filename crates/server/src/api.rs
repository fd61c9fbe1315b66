//! The HTTP handlers: object stats, seed-benchmark rows, health and metrics.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Extension;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::json;

use axum::body::Body;
use batcher::pg::copy::ConflictPolicy;
use batcher::pg::Written;

use crate::auth::{Action, Grant, Principal};
use crate::error::AppError;
use crate::input;
use crate::input::ObjectBody;
use crate::queries::{ObjectKey, ObjectStats, Stat};
use crate::write_path::Repository;
use crate::AppState;

fn repository_not_found(repo: &str) -> AppError {
    AppError::not_found(
        "repository_not_found",
        format!("repository `{repo}` does not exist"),
    )
}

/// `GET /api/v1/repositories/{repo}/objects/stat?path=P`
pub(crate) async fn stat_object(
    State(state): State<AppState>,
    Extension(user): Extension<Arc<Principal>>,
    repo: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Json<Arc<ObjectStats>>, AppError> {
    let Path(repo) = repo?;
    input::repository(&repo)?;
    user.require(Action::Read, &repo)?;
    let path = input::query_param(query.as_deref(), "path")?.ok_or_else(|| {
        AppError::bad_request("missing_path", "query parameter `path` is required")
    })?;
    input::object_path(&path, "path")?;
    let key = ObjectKey {
        repository: repo,
        path,
    };
    match state.reader.stat(key.clone()).await? {
        Some(Stat::Found(stats)) => Ok(Json(stats)),
        Some(Stat::NoSuchObject) => Err(AppError::not_found(
            "object_not_found",
            format!(
                "no object at `{}` in repository `{}`",
                key.path, key.repository
            ),
        )),
        None => Err(repository_not_found(&key.repository)),
    }
}

/// The body of `POST .../objects/stat`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StatRequest {
    paths: Vec<String>,
}

/// One path's answer in a `POST .../objects/stat` response.
#[derive(Debug, Serialize)]
pub(crate) struct StatResult {
    path: String,
    /// `null` when no object is at this path.
    object: Option<Arc<ObjectStats>>,
}

/// The response of `POST .../objects/stat`.
#[derive(Debug, Serialize)]
pub(crate) struct StatResponse {
    results: Vec<StatResult>,
}

/// `POST /api/v1/repositories/{repo}/objects/stat` with `{"paths": [...]}`.
pub(crate) async fn stat_objects(
    State(state): State<AppState>,
    Extension(user): Extension<Arc<Principal>>,
    repo: Result<Path<String>, PathRejection>,
    body: Result<Json<StatRequest>, JsonRejection>,
) -> Result<Json<StatResponse>, AppError> {
    let Path(repo) = repo?;
    input::repository(&repo)?;
    user.require(Action::Read, &repo)?;
    let Json(request) = body?;
    let max = state.limits.max_stat_paths;
    if request.paths.is_empty() {
        return Err(AppError::bad_request(
            "empty_paths",
            "`paths` must not be empty",
        ));
    }
    if request.paths.len() > max {
        return Err(AppError::bad_request(
            "too_many_paths",
            format!(
                "at most {max} paths per request, got {}",
                request.paths.len()
            ),
        ));
    }
    for (i, path) in request.paths.iter().enumerate() {
        input::object_path(path, &format!("paths[{i}]"))?;
    }
    let keys = request
        .paths
        .iter()
        .map(|path| ObjectKey {
            repository: repo.clone(),
            path: path.clone(),
        })
        .collect();
    let stats = state.reader.stat_many(keys).await?;
    let mut results = Vec::with_capacity(stats.len());
    for (path, stat) in request.paths.into_iter().zip(stats) {
        let object = match stat {
            Some(Stat::Found(s)) => Some(s),
            Some(Stat::NoSuchObject) => None,
            None => return Err(repository_not_found(&repo)),
        };
        results.push(StatResult { path, object });
    }
    Ok(Json(StatResponse { results }))
}

/// A `random_read_test` row.
#[derive(Debug, Serialize)]
pub(crate) struct KvRow {
    pk: String,
    payload: String,
}

/// `GET /api/v1/kv/{pk}`: the seed benchmark's lookup over HTTP.
pub(crate) async fn kv_row(
    State(state): State<AppState>,
    Extension(user): Extension<Arc<Principal>>,
    pk: Result<Path<String>, PathRejection>,
) -> Result<Json<KvRow>, AppError> {
    // The benchmark table belongs to no repository: it needs global read.
    user.require(Action::Read, "*")?;
    let Path(pk) = pk?;
    input::pk(&pk)?;
    match state.reader.kv(pk.clone()).await? {
        Some(payload) => Ok(Json(KvRow { pk, payload })),
        None => Err(AppError::not_found(
            "row_not_found",
            format!("no row with key `{pk}`"),
        )),
    }
}

/// The body of `GET /api/v1/user`.
#[derive(Debug, Serialize)]
pub(crate) struct UserBody {
    user: String,
    grants: Vec<Grant>,
}

/// `GET /api/v1/user`: who the token belongs to and what they may do.
///
/// Answered from the authenticated principal alone, so with the auth cache
/// warm it does no database work: the HTTP benchmark's ceiling (the lakeFS
/// method of starting from an empty handler) is this route.
pub(crate) async fn current_user(Extension(user): Extension<Arc<Principal>>) -> Json<UserBody> {
    Json(UserBody {
        user: user.user.clone(),
        grants: user.grants.clone(),
    })
}

/// `GET /healthz`: the process is up.
pub(crate) async fn healthz() -> impl IntoResponse {
    Json(json!({ "status": "ok" }))
}

/// `GET /readyz`: the database answers.
pub(crate) async fn readyz(State(state): State<AppState>) -> Result<impl IntoResponse, AppError> {
    let check = async {
        let client = state.pool.get().await?;
        client.simple_query("SELECT 1").await?;
        Ok::<_, anyhow::Error>(())
    };
    match tokio::time::timeout(Duration::from_secs(2), check).await {
        Ok(Ok(())) => Ok(Json(json!({ "status": "ready" }))),
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

/// `GET /metrics`: Prometheus (OpenMetrics) text.
pub(crate) async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
}

/// Any other route.
pub(crate) async fn no_route() -> AppError {
    AppError::not_found("route_not_found", "no such route")
}

/// A known route with another method.
pub(crate) async fn wrong_method() -> AppError {
    AppError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not accept that method",
    )
}

/// The answer to a `PUT` of an object.
#[derive(Debug, Serialize)]
pub(crate) struct PutResponse {
    path: String,
    /// `created` or `updated`.
    result: &'static str,
}

/// `PUT /api/v1/repositories/{repo}/objects?path=P` with the object's
/// fields as JSON: 201 if created, 200 if replaced, once committed.
pub(crate) async fn put_object(
    State(state): State<AppState>,
    Extension(user): Extension<Arc<Principal>>,
    repo: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    body: Result<Json<ObjectBody>, JsonRejection>,
) -> Result<(StatusCode, Json<PutResponse>), AppError> {
    let Path(repo) = repo?;
    input::repository(&repo)?;
    user.require(Action::Write, &repo)?;
    let path = required_path(query.as_deref())?;
    let Json(body) = body?;
    if body.path.is_some() {
        return Err(AppError::bad_request(
            "invalid_body",
            "`path` goes in the query string, not the body",
        ));
    }
    let row = body
        .into_row(&repo, path.clone())
        .map_err(|m| AppError::bad_request("invalid_body", m))?;
    let (status, result) = match state.writes.put(row).await? {
        Written::Created => (StatusCode::CREATED, "created"),
        Written::Updated => (StatusCode::OK, "updated"),
    };
    Ok((status, Json(PutResponse { path, result })))
}

fn required_path(query: Option<&str>) -> Result<String, AppError> {
    let path = input::query_param(query, "path")?.ok_or_else(|| {
        AppError::bad_request("missing_path", "query parameter `path` is required")
    })?;
    input::object_path(&path, "path")?;
    Ok(path)
}

/// `DELETE /api/v1/repositories/{repo}/objects?path=P`: 204, or 404.
pub(crate) async fn delete_object(
    State(state): State<AppState>,
    Extension(user): Extension<Arc<Principal>>,
    repo: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<StatusCode, AppError> {
    let Path(repo) = repo?;
    input::repository(&repo)?;
    user.require(Action::Write, &repo)?;
    let path = required_path(query.as_deref())?;
    let key = ObjectKey {
        repository: repo,
        path,
    };
    if state.writes.delete(&key).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(AppError::not_found(
            "object_not_found",
            format!(
                "no object at `{}` in repository `{}`",
                key.path, key.repository
            ),
        ))
    }
}

/// `POST /api/v1/repositories/{repo}/objects/import?policy=skip|overwrite|fail`
/// with one JSON object per line: all lines or none are committed.
pub(crate) async fn import_objects(
    State(state): State<AppState>,
    Extension(user): Extension<Arc<Principal>>,
    repo: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    body: Body,
) -> Result<Json<ImportReport>, AppError> {
    let Path(repo) = repo?;
    input::repository(&repo)?;
    user.require(Action::Write, &repo)?;
    let policy = match input::query_param(query.as_deref(), "policy")?.as_deref() {
        None | Some("skip") => ConflictPolicy::Skip,
        Some("overwrite") => ConflictPolicy::Overwrite,
        Some("fail") => ConflictPolicy::Fail,
        Some(other) => {
            return Err(AppError::bad_request(
                "invalid_policy",
                format!("`policy` is skip, overwrite or fail, not `{other}`"),
            ))
        }
    };
    let c = state.writes.import(&repo, body, policy).await?;
    Ok(Json(ImportReport {
        rows: c.rows,
        inserted: c.inserted,
        updated: c.updated,
        skipped: c.skipped,
        superseded: c.superseded,
    }))
}

/// What an import did (see [`batcher::pg::copy::ImportCounts`]).
#[derive(Debug, Serialize)]
pub(crate) struct ImportReport {
    rows: u64,
    inserted: u64,
    updated: u64,
    skipped: u64,
    superseded: u64,
}

/// The body of `POST /api/v1/repositories`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewRepository {
    name: String,
    storage_namespace: String,
}

/// `POST /api/v1/repositories`: 201 with the repository, or 409.
pub(crate) async fn create_repository(
    State(state): State<AppState>,
    Extension(user): Extension<Arc<Principal>>,
    body: Result<Json<NewRepository>, JsonRejection>,
) -> Result<(StatusCode, Json<Repository>), AppError> {
    let Json(new) = body?;
    input::repository(&new.name)?;
    input::storage_namespace(&new.storage_namespace)?;
    user.require(Action::Write, &new.name)?;
    let repo = state
        .writes
        .create_repository(&new.name, &new.storage_namespace)
        .await?;
    Ok((StatusCode::CREATED, Json(repo)))
}

/// `GET /api/v1/repositories`: the repositories the caller may read.
pub(crate) async fn list_repositories(
    State(state): State<AppState>,
    Extension(user): Extension<Arc<Principal>>,
) -> Result<Json<serde_json::Value>, AppError> {
    let repos: Vec<Repository> = state
        .writes
        .list_repositories()
        .await?
        .into_iter()
        .filter(|r| user.may(Action::Read, &r.name))
        .collect();
    Ok(Json(json!({ "repositories": repos })))
}

/// `DELETE /api/v1/repositories/{repo}`: 204 (objects included), or 404.
pub(crate) async fn delete_repository(
    State(state): State<AppState>,
    Extension(user): Extension<Arc<Principal>>,
    repo: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, AppError> {
    let Path(repo) = repo?;
    input::repository(&repo)?;
    user.require(Action::Write, &repo)?;
    if state.writes.delete_repository(&repo).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(repository_not_found(&repo))
    }
}
