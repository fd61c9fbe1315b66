//! lakeFS's repository and branch operations. A repository has one branch,
//! named at creation (`main` unless given); there are no commits.

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;

use super::errors::LakeError;
use super::query;
use super::shapes::{Page, Ref, Repository, RepositoryCreation};
use crate::domain::auth::Action;
use crate::domain::failure::Failure;
use crate::domain::input;
use crate::http::extract::{Caller, JsonBody, PathParams};
use crate::http::position::ReadPosition;
use crate::service::state::AppState;

/// `{repository}` of a path.
#[derive(Debug, Deserialize)]
pub(crate) struct RepositoryPath {
    repository: String,
}

/// `{repository}` and `{branch}` of a path.
#[derive(Debug, Deserialize)]
pub(crate) struct BranchPath {
    repository: String,
    branch: String,
}

/// lakeFS's branch names (`ValidateBranchID`).
fn branch_name(name: &str) -> Result<(), Failure> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    if first_ok
        && name.len() <= 256
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Ok(());
    }
    Err(Failure::invalid(
        "invalid_branch_name",
        "a branch name is 1 to 256 letters, digits, `_` or `-`, not starting with `-`",
    ))
}

/// `GET /repositories` (listRepositories): the repositories the caller may
/// read, by name, a page at a time.
pub(crate) async fn list(
    State(state): State<AppState>,
    Caller(caller): Caller,
    RawQuery(q): RawQuery,
    ReadPosition(position): ReadPosition,
) -> Result<Json<Page<Repository>>, LakeError> {
    let q = q.as_deref();
    let prefix = query::text(q, "prefix")?;
    let after = query::text(q, "after")?;
    let search = query::text(q, "search")?;
    let amount = query::amount(q)?;
    let mut repos: Vec<Repository> = state
        .reads
        .list_repositories(position)
        .await?
        .into_iter()
        .filter(|r| caller.may(Action::Read, &r.name))
        .filter(|r| r.name.starts_with(&prefix) && r.name.contains(&search))
        .filter(|r| after.is_empty() || r.name > after)
        .map(Repository::from)
        .take(amount + 1)
        .collect();
    let has_more = repos.len() > amount;
    repos.truncate(amount);
    Ok(Json(Page::of(repos, has_more, |last| last.id.clone())))
}

/// `POST /repositories` (createRepository): 201 with the repository, 409
/// when the name is taken.
pub(crate) async fn create(
    State(state): State<AppState>,
    Caller(caller): Caller,
    JsonBody(new): JsonBody<RepositoryCreation>,
) -> Result<(StatusCode, Json<Repository>), LakeError> {
    input::repository(&new.name)?;
    input::storage_namespace(&new.storage_namespace)?;
    let branch = new
        .default_branch
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| "main".to_owned());
    branch_name(&branch)?;
    if new.storage_id.as_deref().is_some_and(|id| !id.is_empty()) {
        return Err(Failure::invalid(
            "invalid_storage_id",
            "this service has one storage: `storage_id` must be empty",
        )
        .into());
    }
    caller.require(Action::Write, &new.name)?;
    let created = state
        .writes
        .create_repository_as(
            &new.name,
            &new.storage_namespace,
            &branch,
            new.read_only.unwrap_or(false),
        )
        .await?;
    Ok((StatusCode::CREATED, Json(created.into())))
}

/// `GET /repositories/{repository}` (getRepository).
pub(crate) async fn get(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathParams(path): PathParams<RepositoryPath>,
    ReadPosition(position): ReadPosition,
) -> Result<Json<Repository>, LakeError> {
    input::repository(&path.repository)?;
    caller.require(Action::Read, &path.repository)?;
    let repo = state
        .reads
        .repository(&path.repository, position)
        .await?
        .ok_or_else(|| Failure::NoSuchRepository(path.repository.clone()))?;
    Ok(Json(repo.into()))
}

/// `DELETE /repositories/{repository}` (deleteRepository): 204 with its
/// objects, 404 when there is none.
///
/// A read-only repository is deleted only with `force=true`, as lakeFS
/// does (403 "read-only repository" without it).
pub(crate) async fn delete(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathParams(path): PathParams<RepositoryPath>,
    RawQuery(q): RawQuery,
) -> Result<StatusCode, LakeError> {
    input::repository(&path.repository)?;
    let force = query::flag(q.as_deref(), "force", false)?;
    caller.require(Action::Write, &path.repository)?;
    if !force {
        let repo = state
            .reads
            .repository_on_primary(&path.repository)
            .await?
            .ok_or_else(|| Failure::NoSuchRepository(path.repository.clone()))?;
        if repo.read_only {
            return Err(LakeError::read_only());
        }
    }
    state.writes.delete_repository(&path.repository).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The repository's one branch, as a `Ref`.
async fn branch_of(
    state: &AppState,
    caller: &crate::domain::auth::Principal,
    repository: &str,
    position: Option<tokio_postgres::types::PgLsn>,
) -> Result<Ref, Failure> {
    input::repository(repository)?;
    caller.require(Action::Read, repository)?;
    let repo = state
        .reads
        .repository(repository, position)
        .await?
        .ok_or_else(|| Failure::NoSuchRepository(repository.to_owned()))?;
    Ok(Ref {
        commit_id: head_commit_id(&repo),
        id: repo.default_branch,
    })
}

/// The id lakeFS's clients see as the head commit of a repository's one
/// branch: 64 hex digits (a SHA-256, as lakeFS's commit ids are) of the
/// repository's name and creation time, so it is the same on every call
/// and every instance, and another for a repository made again under the
/// same name. There are no commits behind it: reading at it answers 501
/// (see [`is_commit_id`]).
pub(crate) fn head_commit_id(repo: &crate::model::repositories::Repository) -> String {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    hash.update(b"pgbatch head commit\0");
    hash.update(repo.name.as_bytes());
    hash.update(b"\0");
    hash.update(repo.created_at.to_le_bytes());
    hex::encode(hash.finalize())
}

/// Whether `reference` reads as a commit id (lakeFS takes 1 to 64 hex
/// digits; a branch name that is also hex is read as a commit from 7 on,
/// as short commit ids are written).
pub(crate) fn is_commit_id(reference: &str) -> bool {
    (7..=64).contains(&reference.len()) && reference.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `GET /repositories/{repository}/branches` (listBranches): its one
/// branch, when it matches `prefix` and sorts after `after`, as lakeFS
/// pages its branches (a client paging on reads an empty second page).
pub(crate) async fn branches(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathParams(path): PathParams<RepositoryPath>,
    RawQuery(q): RawQuery,
    ReadPosition(position): ReadPosition,
) -> Result<Json<Page<Ref>>, LakeError> {
    let q = q.as_deref();
    let prefix = query::text(q, "prefix")?;
    let after = query::text(q, "after")?;
    // Checked only: one branch fits any page.
    query::amount(q)?;
    let branch = branch_of(&state, &caller, &path.repository, position).await?;
    let branches = [branch]
        .into_iter()
        .filter(|b| b.id.starts_with(&prefix) && (after.is_empty() || b.id > after))
        .collect();
    Ok(Json(Page::of(branches, false, |b| b.id.clone())))
}

/// `GET /repositories/{repository}/branches/{branch}` (getBranch).
pub(crate) async fn branch(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathParams(path): PathParams<BranchPath>,
    ReadPosition(position): ReadPosition,
) -> Result<Json<Ref>, LakeError> {
    let branch = branch_of(&state, &caller, &path.repository, position).await?;
    if branch.id != path.branch {
        return Err(Failure::NoSuchRef {
            repository: path.repository,
            reference: path.branch,
        }
        .into());
    }
    Ok(Json(branch))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_names_as_lakefs_has_them() {
        for ok in ["main", "dev_1", "feature-x", "_x"] {
            assert!(branch_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-x", "a/b", "a b", "é"] {
            assert!(branch_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn commit_ids_are_told_from_branch_names() {
        let id = "a".repeat(64);
        for yes in [id.as_str(), "abc1234", "DEADBEEF"] {
            assert!(is_commit_id(yes), "{yes}");
        }
        for no in ["main", "abc123", &"a".repeat(65), "feature-1"] {
            assert!(!is_commit_id(no), "{no}");
        }
    }
}
