//! Objects: an object's identity, its metadata as the API returns it, and
//! what a stat lookup finds.

use std::sync::Arc;

use serde::Serialize;

/// An object's identity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// The repository name.
    pub repository: String,
    /// The object's path in the repository.
    pub path: String,
}

/// An object's metadata, as the API returns it (lakeFS's `ObjectStats`).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ObjectStats {
    /// The object's path in the repository.
    pub path: String,
    /// Where the object's data is stored.
    pub physical_address: String,
    /// The data's checksum.
    pub checksum: String,
    /// Size of the data in bytes.
    pub size_bytes: i64,
    /// Last modification, seconds since the Unix epoch.
    pub mtime: i64,
    /// MIME type of the data.
    pub content_type: String,
    /// User-defined metadata: an object of string values.
    #[schema(value_type = Object)]
    pub metadata: serde_json::Value,
}

/// What a stat lookup found in an existing repository. A key absent from
/// the loader's answer means the repository does not exist.
#[derive(Debug, Clone, PartialEq)]
pub struct Stat {
    /// The repository's one branch: the lakeFS surface checks a request's
    /// ref against it without a lookup of its own.
    pub branch: Arc<str>,
    /// The object, `None` if the repository has none at this path. Shared,
    /// so answering many waiters copies nothing.
    pub object: Option<Arc<ObjectStats>>,
}
