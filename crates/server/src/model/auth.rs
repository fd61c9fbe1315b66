//! Grants, tokens and who a token is, as the API shows them.

use std::time::SystemTime;

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

/// What a user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Read objects (and, on `*`, the seed benchmark's rows).
    Read,
    /// Create, change or delete objects.
    Write,
}

/// The user a token authenticates as, with their policies: what the token
/// lookup answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The user's name.
    pub user: String,
    /// The user's policies.
    pub grants: Vec<Grant>,
    /// When the token stops working, in Unix milliseconds; `None`: never.
    pub expires_at_ms: Option<i64>,
    /// When the user was created, in Unix seconds.
    pub user_created_at: i64,
}

/// `t` in Unix milliseconds, as token expiries are kept.
pub fn unix_millis(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Principal {
    /// Whether the token has expired by `now`: checked on every request,
    /// so a cached principal stops working at its expiry, not its cache
    /// entry's.
    pub fn expired(&self, now: SystemTime) -> bool {
        let Some(at) = self.expires_at_ms else {
            return false;
        };
        unix_millis(now) >= at
    }

    /// Whether the user may do `action` in `repository` (`*`: the
    /// service-wide scope, granted only by a `*` policy).
    pub fn may(&self, action: Action, repository: &str) -> bool {
        self.grants.iter().any(|g| {
            let scope = g.repository == "*" || (repository != "*" && g.repository == repository);
            scope
                && match action {
                    Action::Read => g.read || g.write,
                    Action::Write => g.write,
                }
        })
    }
}
