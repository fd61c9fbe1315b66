//! Grants and tokens, as the API shows them.

/// One policy row: what a user may do in one repository, or in all (`*`).
/// Serialized as `GET /api/v1/user` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Grant {
    /// A repository name, or `*`.
    pub repository: String,
    /// Reads allowed.
    pub read: bool,
    /// Writes allowed.
    pub write: bool,
}

/// A stored token as it is listed: never the token itself, only an id (the
/// first 16 hex digits of its SHA-256 digest), its user and description.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct TokenInfo {
    /// The first 16 hex digits of the token's digest.
    pub id: String,
    /// The user it authenticates as.
    pub user: String,
    /// What it is for.
    pub description: String,
    /// When it was created, in Unix seconds.
    pub created_at: i64,
    /// When it stops working, in Unix seconds; `null`: never.
    pub expires_at: Option<i64>,
}
