//! Objects of a repository: stat one or many, put, delete, import.

use std::sync::Arc;

use axum::body::Body;
use axum::body::HttpBody;
use axum::extract::{FromRequest, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::Json;
use pgbatch::pg::Written;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::failure::Failure;
use crate::domain::input::{self, ObjectBody};
use crate::domain::lookup::Reservation;
use crate::http::error::AppError;
use crate::http::extract::{JsonBody, ObjectPath, ReadableRepository, WritableRepository};
use crate::http::position::ReadPosition;
use crate::model::objects::{ObjectKey, ObjectStats, Stat};
use crate::service::state::AppState;

/// The object a stat found in `repository`, `None` if the repository
/// exists and the object does not.
fn in_repository(
    stat: Option<Stat>,
    repository: &str,
) -> Result<Option<Arc<ObjectStats>>, Failure> {
    match stat {
        Some(Stat { object, .. }) => Ok(object),
        None => Err(Failure::NoSuchRepository(repository.to_owned())),
    }
}

/// `GET /api/v1/repositories/{repo}/objects/stat?path=P`
#[utoipa::path(
    get,
    path = "/api/v1/repositories/{repo}/objects/stat",
    tag = "objects",
    params(
        ("repo" = String, Path, description = "Repository name"),
        ("path" = String, Query, description = "The object's path (1 to 1,024 bytes, no NUL)"),
        ("x-pgbatch-lsn" = Option<String>, Header, description = "A write's commit position (from its answer): read from a database that has replayed it, never from a cache"),
    ),
    responses(
        (status = 200, description = "The object's metadata", body = ObjectStats),
        (status = 400, description = "Missing or invalid `path`, malformed query", body = crate::http::error::ErrorBody),
        (status = 403, description = "The caller may not read this repository", body = crate::http::error::ErrorBody),
        (status = 404, description = "`repository_not_found` or `object_not_found`", body = crate::http::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn stat(
    State(state): State<AppState>,
    ReadableRepository(repository): ReadableRepository,
    ObjectPath(path): ObjectPath,
    ReadPosition(position): ReadPosition,
) -> Result<Json<Arc<ObjectStats>>, AppError> {
    let key = ObjectKey { repository, path };
    let stat = state
        .reads
        .object_stat
        .get_at(key.clone(), position)
        .await?;
    let ObjectKey { repository, path } = key;
    match in_repository(stat, &repository)? {
        Some(stats) => Ok(Json(stats)),
        None => Err(Failure::NoSuchObject { repository, path }.into()),
    }
}

/// The body of `POST .../objects/stat`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct StatRequest {
    /// 1 to `--max-stat-paths` object paths.
    paths: Vec<String>,
}

/// One path's answer in a `POST .../objects/stat` response.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct StatResult {
    path: String,
    /// `null` when no object is at this path.
    #[schema(value_type = Option<ObjectStats>)]
    object: Option<Arc<ObjectStats>>,
}

/// The response of `POST .../objects/stat`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct StatResponse {
    /// One per requested path, in request order.
    results: Vec<StatResult>,
}

/// A `POST .../objects/stat` body, read once room for the most paths it
/// can hold is reserved. Under overload, refusing before the body is read
/// costs next to nothing; parsing a thousand paths first would let the
/// refused requests take the CPU that the admitted ones need.
pub(crate) struct StatBody {
    room: Reservation,
    request: StatRequest,
}

impl FromRequest<AppState> for StatBody {
    type Rejection = AppError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, AppError> {
        // The length a client sent (`Content-Length`), or the size of a
        // body built in process; none for a chunked one.
        let length = req.body().size_hint().upper();
        let most = most_paths(length, state.settings.limits.max_stat_paths);
        let room = state.reads.object_stat.reserve(most).await?;
        let JsonBody(request) = JsonBody::from_request(req, state).await?;
        Ok(Self { room, request })
    }
}

/// The most paths a body of `length` bytes can hold, at most `limit`:
/// each path takes 3 bytes at the least (`"",`), so a small request does
/// not hold room for a thousand paths while it runs. Without a length,
/// `limit`.
fn most_paths(length: Option<u64>, limit: usize) -> usize {
    length.map_or(limit, |n| {
        usize::try_from(n / 3 + 1).map_or(limit, |paths| paths.min(limit))
    })
}

/// `POST /api/v1/repositories/{repo}/objects/stat` with `{"paths": [...]}`.
#[utoipa::path(
    post,
    path = "/api/v1/repositories/{repo}/objects/stat",
    tag = "objects",
    params(
        ("repo" = String, Path, description = "Repository name"),
        ("x-pgbatch-lsn" = Option<String>, Header, description = "A write's commit position: all paths read from a database that has replayed it"),
    ),
    request_body = StatRequest,
    responses(
        (status = 200, description = "Each path's metadata, `null` where absent", body = StatResponse),
        (status = 400, description = "`empty_paths`, `too_many_paths`, `invalid_path`, `invalid_json`", body = crate::http::error::ErrorBody),
        (status = 403, description = "The caller may not read this repository", body = crate::http::error::ErrorBody),
        (status = 404, description = "`repository_not_found`", body = crate::http::error::ErrorBody),
        (status = 413, description = "Body over `--max-body-bytes`", body = crate::http::error::ErrorBody),
        (status = 415, description = "Not `application/json`", body = crate::http::error::ErrorBody),
        (status = 503, description = "No room for all the paths (`overloaded`), or the database failed", body = crate::http::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn stat_many(
    State(state): State<AppState>,
    ReadableRepository(repository): ReadableRepository,
    ReadPosition(position): ReadPosition,
    StatBody { room, request }: StatBody,
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
        .get_many_reserved(keys, room, position)
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
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PutResponse {
    path: String,
    /// `created` or `updated`.
    #[schema(value_type = String, example = "created")]
    result: &'static str,
}

/// `PUT /api/v1/repositories/{repo}/objects?path=P` with the object's
/// fields as JSON: 201 if created, 200 if replaced, once committed.
#[utoipa::path(
    put,
    path = "/api/v1/repositories/{repo}/objects",
    tag = "objects",
    params(
        ("repo" = String, Path, description = "Repository name"),
        ("path" = String, Query, description = "The object's path"),
    ),
    request_body(content = ObjectBody, description = "The object's fields; `path` is not allowed here"),
    responses(
        (status = 200, description = "Replaced, and committed", body = PutResponse),
        (status = 201, description = "Created, and committed", body = PutResponse),
        (status = 400, description = "`invalid_body`, `invalid_path`, `invalid_json`, or `rejected`: the database refused the row (a read-only repository's, for one)", body = crate::http::error::ErrorBody),
        (status = 403, description = "The caller may not write this repository", body = crate::http::error::ErrorBody),
        (status = 404, description = "`repository_not_found`", body = crate::http::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
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
#[utoipa::path(
    delete,
    path = "/api/v1/repositories/{repo}/objects",
    tag = "objects",
    params(
        ("repo" = String, Path, description = "Repository name"),
        ("path" = String, Query, description = "The object's path"),
    ),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "`missing_path`, `invalid_path`", body = crate::http::error::ErrorBody),
        (status = 403, description = "The caller may not write this repository", body = crate::http::error::ErrorBody),
        (status = 404, description = "`repository_not_found` or `object_not_found`", body = crate::http::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn delete(
    State(state): State<AppState>,
    WritableRepository(repository): WritableRepository,
    ObjectPath(path): ObjectPath,
) -> Result<StatusCode, AppError> {
    state.writes.delete(&ObjectKey { repository, path }).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// What an import did (see [`pgbatch::pg::copy::ImportCounts`]).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ImportReport {
    rows: u64,
    inserted: u64,
    updated: u64,
    skipped: u64,
    superseded: u64,
}

/// `POST /api/v1/repositories/{repo}/objects/import?policy=skip|overwrite|fail`
/// with one JSON object per line: all lines or none are committed.
#[utoipa::path(
    post,
    path = crate::http::deadline::IMPORT_ROUTE,
    tag = "objects",
    params(
        ("repo" = String, Path, description = "Repository name"),
        ("policy" = Option<String>, Query, description = "On an existing path: `skip` (default), `overwrite` or `fail`"),
    ),
    request_body(
        content = String,
        content_type = "application/x-ndjson",
        description = "One object per line, as `ObjectBody` with its `path`; streamed, at most `--max-import-bytes`"
    ),
    responses(
        (status = 200, description = "All lines committed", body = ImportReport),
        (status = 400, description = "`invalid_import_line` (naming the line), `invalid_policy`", body = crate::http::error::ErrorBody),
        (status = 403, description = "The caller may not write this repository", body = crate::http::error::ErrorBody),
        (status = 404, description = "`repository_not_found`", body = crate::http::error::ErrorBody),
        (status = 408, description = "`body_timeout`: the body paused too long; nothing committed", body = crate::http::error::ErrorBody),
        (status = 409, description = "`conflict`: `policy=fail` met an existing path", body = crate::http::error::ErrorBody),
        (status = 413, description = "Body over `--max-import-bytes`", body = crate::http::error::ErrorBody),
        (status = 503, description = "`overloaded` (too many imports) or `database_unavailable`", body = crate::http::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
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

#[cfg(test)]
mod tests {
    use super::most_paths;

    #[test]
    fn the_room_reserved_covers_every_path_a_body_of_that_length_can_hold() {
        for n in [1usize, 2, 5, 100, 999, 1000] {
            // The shortest body of n paths: empty strings, no spaces.
            let body = serde_json::json!({ "paths": vec![""; n] }).to_string();
            let room = most_paths(Some(body.len() as u64), 1000);
            assert!(room >= n, "{n} paths in {} bytes, room {room}", body.len());
        }
        assert_eq!(most_paths(Some(200), 1000), 67, "a small body, little room");
        assert_eq!(most_paths(Some(1 << 40), 1000), 1000);
        assert_eq!(most_paths(None, 1000), 1000, "chunked: the limit");
    }
}
