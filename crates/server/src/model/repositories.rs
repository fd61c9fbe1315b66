//! Repositories.

use serde::Serialize;

/// A repository, as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Repository {
    /// Its name.
    pub name: String,
    /// Where its objects' data lives.
    pub storage_namespace: String,
    /// Creation time, seconds since the Unix epoch.
    pub created_at: i64,
    /// Its one branch (the lakeFS surface's), `main` unless named at
    /// creation. Not in this API's own shape.
    #[serde(skip)]
    pub default_branch: String,
    /// Marked read-only at creation (the lakeFS surface's flag). Not in
    /// this API's own shape.
    #[serde(skip)]
    pub read_only: bool,
}
