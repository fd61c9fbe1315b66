//! lakeFS's JSON shapes (its `api/swagger.yml`), as its generated clients
//! read them: every required field present and non-null, integers as JSON
//! integers, `next_offset` always a string.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::domain::listing::Entry;
use crate::model::objects::ObjectStats as Stats;
use crate::model::repositories::Repository as Row;

/// `ObjectStats`.
#[derive(Debug, Serialize)]
pub(crate) struct ObjectStats {
    pub(crate) path: String,
    /// `object`, or `common_prefix` for a listing's folded subtree.
    pub(crate) path_type: &'static str,
    pub(crate) physical_address: String,
    pub(crate) checksum: String,
    /// Unix seconds.
    pub(crate) mtime: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) size_bytes: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) content_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) metadata: Option<BTreeMap<String, String>>,
}

impl ObjectStats {
    /// An object's stats, as statObject answers: `metadata` always there,
    /// the user metadata in it only if `with_metadata`.
    pub(crate) fn object(stats: &Stats, with_metadata: bool) -> Self {
        Self::with_metadata(stats, Some(with_metadata))
    }

    /// `with`: `Some(true)` the user metadata, `Some(false)` `{}`, `None`
    /// no `metadata` at all.
    fn with_metadata(stats: &Stats, with: Option<bool>) -> Self {
        let metadata = with.map(|with| {
            stats
                .metadata
                .as_object()
                .into_iter()
                .flatten()
                .filter(|_| with)
                .map(|(k, v)| {
                    let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                    (k.clone(), v)
                })
                .collect()
        });
        Self {
            path: stats.path.clone(),
            path_type: "object",
            physical_address: stats.physical_address.clone(),
            checksum: stats.checksum.clone(),
            mtime: stats.mtime,
            size_bytes: Some(stats.size_bytes),
            content_type: Some(stats.content_type.clone()),
            metadata,
        }
    }

    /// A listing's entry, as lakeFS lists it: `metadata` only when the
    /// object has some and `with_metadata`; a common prefix has the
    /// required fields empty.
    pub(crate) fn entry(entry: &Entry, with_metadata: bool) -> Self {
        match entry {
            Entry::Object(stats) => {
                let has_metadata = stats.metadata.as_object().is_some_and(|m| !m.is_empty());
                Self::with_metadata(stats, (with_metadata && has_metadata).then_some(true))
            }
            Entry::CommonPrefix(prefix) => Self {
                path: prefix.clone(),
                path_type: "common_prefix",
                physical_address: String::new(),
                checksum: String::new(),
                mtime: 0,
                size_bytes: None,
                content_type: None,
                metadata: None,
            },
        }
    }
}

/// `Pagination`.
#[derive(Debug, Serialize)]
pub(crate) struct Pagination {
    pub(crate) has_more: bool,
    /// The last entry's path or id when `has_more`, else `""`.
    pub(crate) next_offset: String,
    pub(crate) results: usize,
    pub(crate) max_per_page: usize,
}

/// `{pagination, results}`: `ObjectStatsList`, `RepositoryList`, `RefList`.
#[derive(Debug, Serialize)]
pub(crate) struct Page<T> {
    pub(crate) pagination: Pagination,
    pub(crate) results: Vec<T>,
}

impl<T> Page<T> {
    /// `results`, with more after them if `has_more`; `last` names the
    /// cursor of the next page.
    pub(crate) fn of(results: Vec<T>, has_more: bool, last: impl FnOnce(&T) -> String) -> Self {
        let next_offset = match results.last() {
            Some(item) if has_more => last(item),
            _ => String::new(),
        };
        Self {
            pagination: Pagination {
                has_more,
                next_offset,
                results: results.len(),
                max_per_page: crate::domain::listing::MAX_AMOUNT,
            },
            results,
        }
    }
}

/// `Repository`.
#[derive(Debug, Serialize)]
pub(crate) struct Repository {
    pub(crate) id: String,
    /// Unix seconds.
    pub(crate) creation_date: i64,
    pub(crate) default_branch: String,
    pub(crate) storage_namespace: String,
    pub(crate) storage_id: String,
    pub(crate) read_only: bool,
}

impl From<Row> for Repository {
    fn from(r: Row) -> Self {
        Self {
            id: r.name,
            creation_date: r.created_at,
            default_branch: r.default_branch,
            storage_namespace: r.storage_namespace,
            storage_id: String::new(),
            read_only: r.read_only,
        }
    }
}

/// `RepositoryCreation`. Its `sample_data` is accepted and ignored: a new
/// repository starts empty here.
#[derive(Debug, Deserialize)]
pub(crate) struct RepositoryCreation {
    pub(crate) name: String,
    pub(crate) storage_namespace: String,
    #[serde(default)]
    pub(crate) default_branch: Option<String>,
    #[serde(default)]
    pub(crate) read_only: Option<bool>,
    /// One storage per service here; accepted when empty.
    #[serde(default)]
    pub(crate) storage_id: Option<String>,
}

/// `Ref`: a branch. There are no commits, so `commit_id` is empty.
#[derive(Debug, Serialize)]
pub(crate) struct Ref {
    pub(crate) id: String,
    pub(crate) commit_id: String,
}

/// `User`.
#[derive(Debug, Serialize)]
pub(crate) struct User {
    pub(crate) id: String,
    /// Unix seconds.
    pub(crate) creation_date: i64,
}

/// `CurrentUser`.
#[derive(Debug, Serialize)]
pub(crate) struct CurrentUser {
    pub(crate) user: User,
}

/// `ObjectStageCreation` (the deprecated `stageObject`). Its `mtime` and
/// `force` are accepted and ignored: an object's time is its write's here,
/// and nothing else stands in the way of a write.
#[derive(Debug, Deserialize)]
pub(crate) struct ObjectStageCreation {
    pub(crate) physical_address: String,
    pub(crate) checksum: String,
    #[serde(deserialize_with = "crate::domain::input::json_integer")]
    pub(crate) size_bytes: i64,
    #[serde(default)]
    pub(crate) metadata: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    pub(crate) content_type: Option<String>,
    /// Unix seconds; the time of the write when absent.
    #[serde(default)]
    pub(crate) mtime: Option<i64>,
}

/// `StagingLocation`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StagingLocation {
    #[serde(default)]
    pub(crate) physical_address: Option<String>,
    /// Nothing to sign: no data moves through this service.
    #[serde(default)]
    pub(crate) presigned_url: Option<String>,
}

/// `StagingMetadata` (`linkPhysicalAddress`).
#[derive(Debug, Deserialize)]
pub(crate) struct StagingMetadata {
    pub(crate) staging: StagingLocation,
    pub(crate) checksum: String,
    #[serde(deserialize_with = "crate::domain::input::json_integer")]
    pub(crate) size_bytes: i64,
    #[serde(default)]
    pub(crate) user_metadata: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    pub(crate) content_type: Option<String>,
    /// Unix seconds; the time of the write when absent.
    #[serde(default)]
    pub(crate) mtime: Option<i64>,
}

/// `PathList`.
#[derive(Debug, Deserialize)]
pub(crate) struct PathList {
    pub(crate) paths: Vec<String>,
}

/// `ObjectError`.
#[derive(Debug, Serialize)]
pub(crate) struct ObjectError {
    pub(crate) status_code: u16,
    pub(crate) message: String,
    pub(crate) path: String,
}

/// `ObjectErrorList`.
#[derive(Debug, Serialize)]
pub(crate) struct ObjectErrorList {
    pub(crate) errors: Vec<ObjectError>,
}
