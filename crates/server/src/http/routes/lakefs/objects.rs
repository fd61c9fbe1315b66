//! lakeFS's object operations over the service's own reads and writes: stat
//! and head (the batched, cached lookup), list (range scans), stage, link
//! and delete (the micro-batched writer). Reading a branch shows staged
//! writes at once: there are no commits.

use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::errors::LakeError;
use super::query;
use super::repositories::is_commit_id;
use super::shapes::{
    ObjectError, ObjectErrorList, ObjectStageCreation, ObjectStats, Page, PathList,
    StagingLocation, StagingMetadata,
};
use super::unserved::{self, Why};
use crate::domain::auth::{Action, Principal};
use crate::domain::failure::Failure;
use crate::domain::input::{self, ObjectBody};
use crate::domain::listing::{ListRequest, MAX_AMOUNT};
use crate::http::extract::{Caller, JsonBody, PathParams};
use crate::http::position::ReadPosition;
use crate::model::objects::{ObjectKey, ObjectStats as Stats};
use crate::model::repositories::Repository;
use crate::service::state::AppState;

/// `{repository}` and `{ref}` (or `{branch}`) of a path.
#[derive(Debug, Deserialize)]
pub(crate) struct RefPath {
    repository: String,
    #[serde(alias = "branch")]
    r#ref: String,
}

impl RefPath {
    /// The repository name, validated, with the caller allowed `action`.
    fn checked(&self, caller: &Principal, action: Action) -> Result<&str, Failure> {
        input::repository(&self.repository)?;
        caller.require(action, &self.repository)?;
        Ok(&self.repository)
    }

    /// The answer for a ref that is not the repository's branch: a read at
    /// a commit id gets 501 (there is no history to read at it), anything
    /// else 404 (a write names a branch, and there is no other).
    fn no_such_ref(&self, action: Action) -> LakeError {
        if action == Action::Read && is_commit_id(&self.r#ref) {
            return unserved::not_implemented(
                &format!("reading at commit `{}`", self.r#ref),
                Why::History,
            );
        }
        Failure::NoSuchRef {
            repository: self.repository.clone(),
            reference: self.r#ref.clone(),
        }
        .into()
    }
}

/// The repository `at` names, if its one branch is `at`'s ref; writes
/// also need it not read-only.
async fn repository(
    state: &AppState,
    at: &RefPath,
    caller: &Principal,
    action: Action,
    position: Option<tokio_postgres::types::PgLsn>,
) -> Result<Repository, LakeError> {
    let name = at.checked(caller, action)?;
    let repo = if action == Action::Write {
        state.reads.repository_on_primary(name).await?
    } else {
        state.reads.repository(name, position).await?
    };
    let repo = repo.ok_or_else(|| Failure::NoSuchRepository(name.to_owned()))?;
    if repo.default_branch != at.r#ref {
        return Err(at.no_such_ref(action));
    }
    if action == Action::Write && repo.read_only {
        return Err(LakeError::read_only());
    }
    Ok(repo)
}

/// The object at `path` on `at`'s ref, through the object-stat lookup
/// (batched, cached), whose answer also names the repository's branch.
async fn stat_of(
    state: &AppState,
    at: &RefPath,
    caller: &Principal,
    path: String,
    position: Option<tokio_postgres::types::PgLsn>,
) -> Result<std::sync::Arc<Stats>, LakeError> {
    let repository = at.checked(caller, Action::Read)?.to_owned();
    let key = ObjectKey { repository, path };
    let stat = state
        .reads
        .object_stat
        .get_at(key.clone(), position)
        .await?
        .ok_or_else(|| Failure::NoSuchRepository(key.repository.clone()))?;
    if *stat.branch != at.r#ref {
        return Err(at.no_such_ref(Action::Read));
    }
    stat.object.ok_or_else(|| {
        Failure::NoSuchObject {
            repository: key.repository,
            path: key.path,
        }
        .into()
    })
}

/// `GET .../refs/{ref}/objects/stat?path=P` (statObject).
pub(crate) async fn stat(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathParams(at): PathParams<RefPath>,
    RawQuery(q): RawQuery,
    ReadPosition(position): ReadPosition,
) -> Result<Json<ObjectStats>, LakeError> {
    let path = input::required_path(q.as_deref())?;
    let with_metadata = query::flag(q.as_deref(), "user_metadata", true)?;
    query::no_presign(q.as_deref())?;
    let stats = stat_of(&state, &at, &caller, path, position).await?;
    Ok(Json(ObjectStats::object(&stats, with_metadata)))
}

/// `HEAD .../refs/{ref}/objects?path=P` (headObject): the status, and
/// the object's size, checksum and time as headers; never a body.
pub(crate) async fn head(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathParams(at): PathParams<RefPath>,
    RawQuery(q): RawQuery,
    ReadPosition(position): ReadPosition,
) -> Response {
    let found = match input::required_path(q.as_deref()) {
        Ok(path) => stat_of(&state, &at, &caller, path, position).await,
        Err(e) => Err(e.into()),
    };
    match found {
        Ok(stats) => {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(stats.size_bytes));
            if let Ok(etag) = HeaderValue::from_str(&format!("\"{}\"", stats.checksum)) {
                headers.insert(header::ETAG, etag);
            }
            if let Some(when) = http_date(stats.mtime) {
                headers.insert(header::LAST_MODIFIED, when);
            }
            (StatusCode::OK, headers).into_response()
        }
        Err(failure) => failure.status().into_response(),
    }
}

/// `mtime` (Unix seconds) as an HTTP date.
fn http_date(mtime: i64) -> Option<HeaderValue> {
    let secs = u64::try_from(mtime).ok()?;
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    HeaderValue::from_str(&httpdate::fmt_http_date(when)).ok()
}

/// `GET .../refs/{ref}/objects/ls` (listObjects): a page of the objects
/// under `prefix` after `after`, folded at `delimiter`, at most `amount`
/// (100 unless given, at most 1,000).
pub(crate) async fn list(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathParams(at): PathParams<RefPath>,
    RawQuery(q): RawQuery,
    ReadPosition(position): ReadPosition,
) -> Result<Json<Page<ObjectStats>>, LakeError> {
    let q = q.as_deref();
    let request = ListRequest {
        prefix: query::text(q, "prefix")?,
        after: query::text(q, "after")?,
        delimiter: query::text(q, "delimiter")?,
        amount: query::amount(q)?,
    };
    let with_metadata = query::flag(q, "user_metadata", true)?;
    query::no_presign(q)?;
    let repo = repository(&state, &at, &caller, Action::Read, position).await?;
    let listing = state
        .reads
        .list_objects(&repo.name, &request, position)
        .await?;
    let results = listing
        .entries
        .iter()
        .map(|e| ObjectStats::entry(e, with_metadata))
        .collect();
    Ok(Json(Page::of(results, listing.has_more, |last| {
        last.path.clone()
    })))
}

/// Latest `mtime` taken: the end of year 9999, the last second Postgres's
/// `to_timestamp` and every client's date types agree on.
const MAX_MTIME: i64 = 253_402_300_799;

/// Writes `body` as the object at `path` of `repo`, modified at `mtime`
/// (Unix seconds; now when `None`), and answers its stats.
async fn write(
    state: &AppState,
    repo: &str,
    path: String,
    body: ObjectBody,
    mtime: Option<i64>,
) -> Result<ObjectStats, Failure> {
    if mtime.is_some_and(|m| !(0..=MAX_MTIME).contains(&m)) {
        return Err(Failure::invalid(
            "invalid_body",
            format!("`mtime` must be 0 to {MAX_MTIME} (Unix seconds)"),
        ));
    }
    let mut row = body.into_put_row(repo, path)?;
    row.mtime = mtime;
    let stats = Stats {
        path: row.path.clone(),
        physical_address: row.physical_address.clone(),
        checksum: row.checksum.clone(),
        size_bytes: row.size_bytes,
        mtime: mtime.unwrap_or_else(super::unix_now),
        content_type: row.content_type.clone(),
        metadata: row.metadata.clone(),
    };
    state.writes.put(row).await?;
    Ok(ObjectStats::object(&stats, true))
}

/// A random name for staged data (a v4 UUID from the thread's generator).
fn fresh_id() -> String {
    uuid::Builder::from_random_bytes(rand::random::<u128>().to_le_bytes())
        .into_uuid()
        .simple()
        .to_string()
}

/// `PUT .../branches/{branch}/objects?path=P` (the deprecated stageObject):
/// registers an object's metadata without data; 201 with its stats.
pub(crate) async fn stage(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathParams(at): PathParams<RefPath>,
    RawQuery(q): RawQuery,
    JsonBody(staged): JsonBody<ObjectStageCreation>,
) -> Result<(StatusCode, Json<ObjectStats>), LakeError> {
    let path = input::required_path(q.as_deref())?;
    let repo = repository(&state, &at, &caller, Action::Write, None).await?;
    let body = ObjectBody {
        path: None,
        physical_address: staged.physical_address,
        size_bytes: staged.size_bytes,
        checksum: staged.checksum,
        // lakeFS stores an empty type as it stores a missing one.
        content_type: staged.content_type.filter(|t| !t.is_empty()),
        metadata: staged.metadata,
    };
    let stats = write(&state, &repo.name, path, body, staged.mtime).await?;
    Ok((StatusCode::CREATED, Json(stats)))
}

/// `GET .../branches/{branch}/staging/backing?path=P` (getPhysicalAddress):
/// a fresh address in the repository's namespace for the client to put
/// data at, before it links it. Nothing to sign: no data moves here.
pub(crate) async fn physical_address(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathParams(at): PathParams<RefPath>,
    RawQuery(q): RawQuery,
) -> Result<Json<StagingLocation>, LakeError> {
    input::required_path(q.as_deref())?;
    query::no_presign(q.as_deref())?;
    let repo = repository(&state, &at, &caller, Action::Write, None).await?;
    let namespace = repo.storage_namespace.trim_end_matches('/');
    Ok(Json(StagingLocation {
        physical_address: Some(format!("{namespace}/data/{}", fresh_id())),
        presigned_url: None,
    }))
}

/// `PUT .../branches/{branch}/staging/backing?path=P`
/// (linkPhysicalAddress): the object at `path` is the data at the staged
/// address; 200 with its stats.
pub(crate) async fn link(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathParams(at): PathParams<RefPath>,
    RawQuery(q): RawQuery,
    JsonBody(staged): JsonBody<StagingMetadata>,
) -> Result<Json<ObjectStats>, LakeError> {
    let path = input::required_path(q.as_deref())?;
    let repo = repository(&state, &at, &caller, Action::Write, None).await?;
    let physical_address = staged.staging.physical_address.ok_or_else(|| {
        Failure::invalid("invalid_body", "`staging.physical_address` is required")
    })?;
    let body = ObjectBody {
        path: None,
        physical_address,
        size_bytes: staged.size_bytes,
        checksum: staged
            .checksum
            .trim_matches(|c: char| c == '"' || c == ' ')
            .to_owned(),
        content_type: staged.content_type.filter(|t| !t.is_empty()),
        metadata: staged.user_metadata,
    };
    Ok(Json(
        write(&state, &repo.name, path, body, staged.mtime).await?,
    ))
}

/// `DELETE .../branches/{branch}/objects?path=P` (deleteObject): 204,
/// also when there was no such object, as lakeFS answers.
pub(crate) async fn delete(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathParams(at): PathParams<RefPath>,
    RawQuery(q): RawQuery,
) -> Result<StatusCode, LakeError> {
    let path = input::required_path(q.as_deref())?;
    let repo = repository(&state, &at, &caller, Action::Write, None).await?;
    match state
        .writes
        .delete(&ObjectKey {
            repository: repo.name,
            path,
        })
        .await
    {
        Ok(()) | Err(Failure::NoSuchObject { .. }) => Ok(StatusCode::NO_CONTENT),
        Err(e) => Err(e.into()),
    }
}

/// `POST .../branches/{branch}/objects/delete` (deleteObjects): each path
/// deleted, what failed listed; 200, as lakeFS answers: a caller without
/// the grant gets each path listed as 401, a read-only repository each as
/// 403, and empty paths (Spark sends them) are skipped.
pub(crate) async fn delete_many(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathParams(at): PathParams<RefPath>,
    JsonBody(list): JsonBody<PathList>,
) -> Result<Json<ObjectErrorList>, LakeError> {
    if list.paths.len() > MAX_AMOUNT {
        return Err(Failure::invalid(
            "too_many_paths",
            format!("request size exceeded, max paths is set to {MAX_AMOUNT}"),
        )
        .into());
    }
    let paths: Vec<&str> = list
        .paths
        .iter()
        .map(String::as_str)
        .filter(|p| !p.is_empty())
        .collect();
    let repo = match repository(&state, &at, &caller, Action::Write, None).await {
        Ok(repo) => repo,
        // Refused for every path alike: listed per path, as lakeFS does.
        Err(refused)
            if matches!(
                refused.status(),
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
            ) =>
        {
            let message = if refused.status() == StatusCode::UNAUTHORIZED {
                "Unauthorized"
            } else {
                refused.message()
            };
            let errors = paths
                .iter()
                .map(|path| ObjectError {
                    status_code: refused.status().as_u16(),
                    message: message.to_owned(),
                    path: (*path).to_owned(),
                })
                .collect();
            return Ok(Json(ObjectErrorList { errors }));
        }
        Err(e) => return Err(e),
    };
    let mut errors = Vec::new();
    // Each path is checked alone; the valid ones go in one statement (one
    // round trip for up to 1,000 paths), so they fail or succeed together.
    let mut valid = Vec::with_capacity(paths.len());
    for path in paths {
        match input::object_path(path, "paths") {
            Ok(()) => valid.push(path),
            Err(failure) => errors.push(object_error(path, &failure.into())),
        }
    }
    if let Err(failure) = state.writes.delete_many(&repo.name, &valid).await {
        // Each path gets the statement's error, as lakeFS lists each
        // path it could not delete.
        let error = LakeError::from(failure);
        errors.extend(valid.iter().map(|path| object_error(path, &error)));
    }
    Ok(Json(ObjectErrorList { errors }))
}

/// `path`'s entry in deleteObjects' list of failures.
fn object_error(path: &str, error: &LakeError) -> ObjectError {
    ObjectError {
        status_code: error.status().as_u16(),
        message: error.message().to_owned(),
        path: path.to_owned(),
    }
}
