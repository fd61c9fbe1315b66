//! What invalidation is, in one place: which tables each cached read
//! depends on ([`Table`], [`Invalidated`]), the changes writes report
//! ([`Change`]), and the payload the triggers of migration
//! `V20261122000100__invalidation` send on [`CHANNEL`] ([`Invalidation`]).
//! Writes report their changes through `Reads::changed`, which reaches
//! every registered lookup (token lookups included); `service::invalidation`
//! keeps the LISTEN connection alive and applies what arrives.
//!
//! A cached lookup whose query reads a table that no [`Change`] touches
//! fails the registry's tests (`domain::reads`), so a read added without
//! an invalidation path does not pass unnoticed.

use pgbatch::pg::BatchQuery;
use serde::Deserialize;

use crate::db::queries::auth::PrincipalQuery;
use crate::db::queries::kv::KvQuery;
use crate::db::queries::objects::ObjectStatQuery;
use crate::model::objects::ObjectKey;

/// The notification channel the triggers send on.
pub const CHANNEL: &str = "pgbatch_invalidate";

/// A table some lookup reads: a change to it must reach that lookup's
/// cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// `objects`.
    Objects,
    /// `repositories`.
    Repositories,
    /// `random_read_test`.
    Kv,
    /// `tokens`.
    Tokens,
    /// `users`.
    Users,
    /// `policies`.
    Policies,
}

impl Table {
    /// Every table, for the tests that check lookups against their SQL.
    pub const ALL: [Self; 6] = [
        Self::Objects,
        Self::Repositories,
        Self::Kv,
        Self::Tokens,
        Self::Users,
        Self::Policies,
    ];

    /// The table's name in SQL.
    pub fn name(self) -> &'static str {
        match self {
            Self::Objects => "objects",
            Self::Repositories => "repositories",
            Self::Kv => "random_read_test",
            Self::Tokens => "tokens",
            Self::Users => "users",
            Self::Policies => "policies",
        }
    }
}

/// A change that may make cached values stale, as writes and the
/// invalidation listener report it to `Reads::changed`.
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    /// One object was written or deleted.
    Object(&'a ObjectKey),
    /// Objects or repositories changed without a list of keys: an import,
    /// a repository created or deleted, or another instance's notice of
    /// one.
    Objects,
    /// One token (by its SHA-256 digest) was revoked or changed.
    Token(&'a [u8; 32]),
    /// Tokens, users or policies changed, digests not listed.
    Auth,
    /// Anything may have changed (a notice that could not be read).
    Everything,
}

impl Change<'_> {
    /// Whether this change may touch `table`.
    pub(crate) fn touches(self, table: Table) -> bool {
        match self {
            Self::Object(_) => table == Table::Objects,
            Self::Objects => matches!(table, Table::Objects | Table::Repositories),
            Self::Token(_) => table == Table::Tokens,
            Self::Auth => matches!(table, Table::Tokens | Table::Users | Table::Policies),
            Self::Everything => true,
        }
    }
}

/// What a query's cached values depend on. A bound of `Reads`' registry,
/// so every lookup states it.
pub trait Invalidated: BatchQuery {
    /// Every table the query's statements read (checked against them in
    /// the tests).
    const TABLES: &'static [Table];

    /// Whether every read of the query, cached or not, must be no older
    /// than the invalidations this instance has applied, and a key a
    /// replica does not know is asked of the primary: credentials, so a
    /// revoked token is refused at once, and a token made on another
    /// instance a moment ago works at once. By default reads may come
    /// from any replica within the lag bound.
    const FRESH: bool = false;

    /// The one cached key `change` makes stale, if it names one of this
    /// query's keys; otherwise a change that touches the query's tables
    /// drops the whole cache.
    fn changed_key(_change: Change<'_>) -> Option<Self::Key> {
        None
    }
}

impl Invalidated for KvQuery {
    const TABLES: &'static [Table] = &[Table::Kv];
}

impl Invalidated for ObjectStatQuery {
    // An object's stat names its repository's branch, and a missing
    // repository is an answer too.
    const TABLES: &'static [Table] = &[Table::Objects, Table::Repositories];

    fn changed_key(change: Change<'_>) -> Option<ObjectKey> {
        match change {
            Change::Object(key) => Some(key.clone()),
            _ => None,
        }
    }
}

impl Invalidated for PrincipalQuery {
    const TABLES: &'static [Table] = &[Table::Tokens, Table::Users, Table::Policies];
    const FRESH: bool = true;

    fn changed_key(change: Change<'_>) -> Option<[u8; 32]> {
        match change {
            Change::Token(digest) => Some(*digest),
            _ => None,
        }
    }
}

/// What a notification on [`CHANNEL`] asks to drop.
#[derive(Debug, PartialEq, Eq)]
pub enum Invalidation {
    /// These objects changed.
    Objects(Vec<ObjectKey>),
    /// Objects or repositories changed, keys not listed.
    AllObjects,
    /// These tokens (by digest) changed.
    Tokens(Vec<Vec<u8>>),
    /// Tokens or grants changed, digests not listed.
    AllAuth,
    /// A payload this version cannot read: everything is dropped.
    Unknown,
}

#[derive(Deserialize)]
struct Payload {
    c: String,
    #[serde(default)]
    all: bool,
    /// `null` when a statement touched no row (older triggers sent it).
    #[serde(default)]
    k: Option<Vec<serde_json::Value>>,
}

impl Invalidation {
    /// Reads a notification's payload, as the triggers write it.
    pub fn parse(text: &str) -> Self {
        let Ok(p) = serde_json::from_str::<Payload>(text) else {
            return Self::Unknown;
        };
        match (p.c.as_str(), p.all) {
            ("objects", true) => Self::AllObjects,
            ("auth", _) | ("tokens", true) => Self::AllAuth,
            ("objects", false) => p
                .k
                .unwrap_or_default()
                .into_iter()
                .map(|k| {
                    let (repository, path): (String, String) = serde_json::from_value(k).ok()?;
                    Some(ObjectKey { repository, path })
                })
                .collect::<Option<_>>()
                .map_or(Self::Unknown, Self::Objects),
            ("tokens", false) => {
                p.k.unwrap_or_default()
                    .into_iter()
                    .map(|k| hex::decode(k.as_str()?).ok())
                    .collect::<Option<_>>()
                    .map_or(Self::Unknown, Self::Tokens)
            }
            _ => Self::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_parse_and_anything_else_flushes() {
        assert_eq!(
            Invalidation::parse(r#"{"c":"objects","k":[["demo","a/b"],["x","y z"]]}"#),
            Invalidation::Objects(vec![
                ObjectKey {
                    repository: "demo".into(),
                    path: "a/b".into()
                },
                ObjectKey {
                    repository: "x".into(),
                    path: "y z".into()
                },
            ])
        );
        assert_eq!(
            Invalidation::parse(r#"{"c":"objects","all":true}"#),
            Invalidation::AllObjects
        );
        assert_eq!(
            Invalidation::parse(r#"{"c":"tokens","k":["00ff"]}"#),
            Invalidation::Tokens(vec![vec![0, 255]])
        );
        assert_eq!(
            Invalidation::parse(r#"{"c":"auth","all":true}"#),
            Invalidation::AllAuth
        );
        // A statement that touched nothing: nothing to drop, no flush.
        assert_eq!(
            Invalidation::parse(r#"{"c" : "tokens", "k" : null}"#),
            Invalidation::Tokens(vec![])
        );
        for bad in [
            "",
            "not json",
            r#"{"c":"objects","k":[["only-one"]]}"#,
            r#"{"c":"tokens","k":["zz"]}"#,
            r#"{"c":"future"}"#,
        ] {
            assert_eq!(Invalidation::parse(bad), Invalidation::Unknown, "{bad}");
        }
    }
}
