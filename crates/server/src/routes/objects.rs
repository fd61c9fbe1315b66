//! Objects of a repository: stat one or many, put, delete, import.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequestParts, RawQuery, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::Json;
use batcher::pg::Written;
use serde::{Deserialize, Serialize};

use crate::error::AppError;
use crate::extract::{JsonBody, ObjectPath, ReadableRepository, WritableRepository};
use crate::failure::Failure;
use crate::input::{self, ObjectBody};
use crate::lookup::Reservation;
use crate::queries::objects::{ObjectKey, ObjectStats, Stat};
use crate::state::AppState;

/// The object a stat found in `repository`, `None` if the repository
/// exists and the object does not.
fn in_repository(
    stat: Option<Stat>,
    repository: &str,
) -> Result<Option<Arc<ObjectStats>>, Failure> {
    match stat {
        Some(Stat::Found(stats)) => Ok(Some(stats)),
        Some(Stat::NoSuchObject) => Ok(None),
        None => Err(Failure::NoSuchRepository(repository.to_owned())),
    }
}

/// `GET /api/v1/repositories/{repo}/objects/stat?path=P`
pub(crate) async fn stat(
    State(state): State<AppState>,
    ReadableRepository(repository): ReadableRepository,
    ObjectPath(path): ObjectPath,
) -> Result<Json<Arc<ObjectStats>>, AppError> {
    let key = ObjectKey { repository, path };
    let stat = state.reads.object_stat.get(key.clone()).await?;
    let ObjectKey { repository, path } = key;
    match in_repository(stat, &repository)? {
        Some(stats) => Ok(Json(stats)),
        None => Err(Failure::NoSuchObject { repository, path }.into()),
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

/// Room for the most paths a `POST .../objects/stat` may hold, reserved
/// before its body is read. Under overload, refusing then costs next to
/// nothing; parsing a thousand paths first would let the refused requests
/// take the CPU that the admitted ones need.
pub(crate) struct StatRoom(Reservation);

impl FromRequestParts<AppState> for StatRoom {
    type Rejection = AppError;

    async fn from_request_parts(_: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        let most = state.settings.limits.max_stat_paths;
        Ok(Self(state.reads.object_stat.reserve(most).await?))
    }
}

/// `POST /api/v1/repositories/{repo}/objects/stat` with `{"paths": [...]}`.
pub(crate) async fn stat_many(
    State(state): State<AppState>,
    ReadableRepository(repository): ReadableRepository,
    StatRoom(room): StatRoom,
    JsonBody(request): JsonBody<StatRequest>,
) -> Result<Json<StatResponse>, AppError> {
    input::stat_paths(&request.paths, state.settings.limits.max_stat_paths)?;
    let keys = request
        .paths
        .iter()
        .map(|path| ObjectKey {
            repository: repository.clone(),
            path: path.clone(),
        })
        .collect();
    let stats = state
        .reads
        .object_stat
        .get_many_reserved(keys, room)
        .await?;
    let results = request
        .paths
        .into_iter()
        .zip(stats)
        .map(|(path, stat)| {
            let object = in_repository(stat, &repository)?;
            Ok(StatResult { path, object })
        })
        .collect::<Result<_, Failure>>()?;
    Ok(Json(StatResponse { results }))
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
pub(crate) async fn put(
    State(state): State<AppState>,
    WritableRepository(repository): WritableRepository,
    ObjectPath(path): ObjectPath,
    JsonBody(body): JsonBody<ObjectBody>,
) -> Result<(StatusCode, Json<PutResponse>), AppError> {
    let row = body.into_put_row(&repository, path.clone())?;
    let (status, result) = match state.writes.put(row).await? {
        Written::Created => (StatusCode::CREATED, "created"),
        Written::Updated => (StatusCode::OK, "updated"),
    };
    Ok((status, Json(PutResponse { path, result })))
}

/// `DELETE /api/v1/repositories/{repo}/objects?path=P`: 204, or 404.
pub(crate) async fn delete(
    State(state): State<AppState>,
    WritableRepository(repository): WritableRepository,
    ObjectPath(path): ObjectPath,
) -> Result<StatusCode, AppError> {
    state.writes.delete(&ObjectKey { repository, path }).await?;
    Ok(StatusCode::NO_CONTENT)
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

/// `POST /api/v1/repositories/{repo}/objects/import?policy=skip|overwrite|fail`
/// with one JSON object per line: all lines or none are committed.
pub(crate) async fn import(
    State(state): State<AppState>,
    WritableRepository(repository): WritableRepository,
    RawQuery(query): RawQuery,
    body: Body,
) -> Result<Json<ImportReport>, AppError> {
    let policy = input::conflict_policy(query.as_deref())?;
    let c = state.writes.import(&repository, body, policy).await?;
    Ok(Json(ImportReport {
        rows: c.rows,
        inserted: c.inserted,
        updated: c.updated,
        skipped: c.skipped,
        superseded: c.superseded,
    }))
}
