//! Who a scoped load runs as: a database role and transaction-local
//! settings, the way PostgREST, Supabase and PostGraphile run each request
//! for row-level security.
//!
//! Both drivers run a scoped load in a transaction of its own that starts
//! with [`Scope`]'s one statement ([`Scope::set_local_sql`]): `SET LOCAL
//! ROLE` and `set_config(name, value, true)` for each setting. Both end
//! with the transaction, so nothing of a scope survives on a pooled
//! connection, through a transaction-mode pooler included.

use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Who a load runs as: a database role, and settings local to the load's
/// transaction (a user's JWT claims, a tenant id), for services that
/// authorize with row-level security. Cheap to clone.
///
/// A scoped batcher (`Batcher<K, V, Scope>`, built with
/// [`build_scoped`](crate::BatcherBuilder::build_scoped) over a
/// `PgLoader` or `SqlxLoader`) runs each load as one scope, in a
/// transaction of its own:
///
/// ```text
/// BEGIN;
/// SET LOCAL ROLE "authenticated";
/// SELECT set_config('request.jwt.claims', '{"sub":"42"}', true), ...;
/// SELECT ... WHERE id = ANY($1);   -- the batch, under the role's policies
/// COMMIT;
/// ```
///
/// Two scopes are the same scope when their role and settings are; only
/// then may their callers share a load or a cached value. The
/// [label](ScopeBuilder::label) names a scope in spans and logs (its
/// settings never appear there, nor in `Debug`: claims are secrets), and
/// plays no part in which scopes are the same.
///
/// ```
/// use pgbatch::db::Scope;
///
/// let scope = Scope::builder()
///     .label("tenant 7")
///     .role("app_user")
///     .setting("app.tenant", "7")
///     .setting("request.jwt.claims", r#"{"sub":"42","role":"app_user"}"#)
///     .build()?;
/// assert_eq!(scope.label(), Some("tenant 7"));
/// assert_eq!(format!("{scope:?}"), r#"Scope { label: Some("tenant 7"), .. }"#);
/// # Ok::<(), pgbatch::db::ScopeError>(())
/// ```
#[derive(Clone)]
pub struct Scope {
    inner: Arc<Inner>,
}

struct Inner {
    label: Option<String>,
    role: Option<String>,
    /// By name, so the same settings given in another order are the same
    /// scope.
    settings: BTreeMap<String, String>,
    /// What starts the scope's transaction (see [`Scope::set_local_sql`]).
    sql: String,
    /// A hash of the role and settings, computed once: a scope is hashed
    /// for every request.
    fingerprint: u64,
}

impl Scope {
    /// Starts describing a scope.
    pub fn builder() -> ScopeBuilder {
        ScopeBuilder::default()
    }

    /// The label spans and logs name this scope by, if one was given.
    pub fn label(&self) -> Option<&str> {
        self.inner.label.as_deref()
    }

    /// The role loads run as (`SET LOCAL ROLE`), if one was given; else
    /// the connection's own.
    pub fn role(&self) -> Option<&str> {
        self.inner.role.as_deref()
    }

    /// The names of the scope's settings.
    pub fn setting_names(&self) -> impl Iterator<Item = &str> {
        self.inner.settings.keys().map(String::as_str)
    }

    /// The statements that make a transaction this scope's, sent after
    /// `BEGIN`: `SET LOCAL ROLE` with the role as a quoted identifier, and
    /// one `SELECT` of `set_config(name, value, true)` for the settings,
    /// each an escaped string literal. Empty for a scope with neither.
    pub fn set_local_sql(&self) -> &str {
        &self.inner.sql
    }
}

impl PartialEq for Scope {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
            || (self.inner.fingerprint == other.inner.fingerprint
                && self.inner.role == other.inner.role
                && self.inner.settings == other.inner.settings)
    }
}

impl Eq for Scope {}

impl Hash for Scope {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.inner.fingerprint.hash(state);
    }
}

impl fmt::Debug for Scope {
    /// The label only: a scope's settings may be secrets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("label", &self.inner.label)
            .finish_non_exhaustive()
    }
}

/// Describes a [`Scope`]; get one from [`Scope::builder`].
#[derive(Default)]
#[must_use = "builder does nothing until .build()"]
pub struct ScopeBuilder {
    label: Option<String>,
    role: Option<String>,
    settings: Vec<(String, String)>,
}

impl fmt::Debug for ScopeBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopeBuilder")
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

/// Why a [`ScopeBuilder`] refused its scope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeError {
    /// The role is empty, longer than Postgres's 63-byte identifiers (it
    /// would be truncated into another role's name), or holds a NUL.
    #[error("invalid role name (empty, over 63 bytes, or holding a NUL)")]
    InvalidRole,
    /// A setting's name is not a settable name: letters, digits, `_` and
    /// `.`, not starting with a digit, at most 63 bytes. (`role` and
    /// `session_authorization` are set with [`ScopeBuilder::role`] or
    /// not at all.)
    #[error("invalid setting name {0:?}")]
    InvalidSettingName(String),
    /// A setting's value holds a NUL, which Postgres text cannot.
    #[error("the value of setting {0:?} holds a NUL")]
    InvalidSettingValue(String),
    /// The same setting was given twice.
    #[error("setting {0:?} given twice")]
    DuplicateSetting(String),
}

/// Postgres's longest identifier, in bytes (`NAMEDATALEN - 1`).
const MAX_NAME: usize = 63;

impl ScopeBuilder {
    /// Names the scope in spans and logs ("tenant 7", "anonymous").
    /// Choose a label that says nothing secret: it is printed.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// The role loads run as: `SET LOCAL ROLE`, sent as a quoted
    /// identifier. The connection's own role must be a member of it;
    /// loads of a scope whose role the database refuses fail, for that
    /// scope's callers alone.
    pub fn role(mut self, role: impl Into<String>) -> Self {
        self.role = Some(role.into());
        self
    }

    /// A setting local to each load's transaction:
    /// `set_config(name, value, true)`, as in
    /// `current_setting('app.tenant')` in a row-level-security policy.
    pub fn setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }

    /// The scope.
    ///
    /// # Errors
    ///
    /// [`ScopeError`] for a role or setting Postgres would refuse or
    /// misread.
    pub fn build(self) -> Result<Scope, ScopeError> {
        if let Some(role) = &self.role {
            if role.is_empty() || role.len() > MAX_NAME || role.contains('\0') {
                return Err(ScopeError::InvalidRole);
            }
        }
        let mut settings = BTreeMap::new();
        for (name, value) in self.settings {
            if !is_setting_name(&name) {
                return Err(ScopeError::InvalidSettingName(name));
            }
            if value.contains('\0') {
                return Err(ScopeError::InvalidSettingValue(name));
            }
            if settings.contains_key(&name) {
                return Err(ScopeError::DuplicateSetting(name));
            }
            settings.insert(name, value);
        }
        let mut statements = Vec::new();
        if let Some(role) = &self.role {
            statements.push(format!("SET LOCAL ROLE {}", super::import::ident(role)));
        }
        if !settings.is_empty() {
            let calls: Vec<String> = settings
                .iter()
                .map(|(n, v)| {
                    format!(
                        "set_config({}, {}, true)",
                        quote_literal(n),
                        quote_literal(v)
                    )
                })
                .collect();
            statements.push(format!("SELECT {}", calls.join(", ")));
        }
        let mut hasher = DefaultHasher::new();
        (&self.role, &settings).hash(&mut hasher);
        Ok(Scope {
            inner: Arc::new(Inner {
                label: self.label,
                role: self.role,
                settings,
                sql: statements.join("; "),
                fingerprint: hasher.finish(),
            }),
        })
    }
}

/// Whether `name` is a setting a scope may set: a plain or dotted name,
/// and not one of the two that change who the session is.
fn is_setting_name(name: &str) -> bool {
    let well_formed = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with(|c: char| c.is_ascii_digit() || c == '.')
        && !name.ends_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    let reserved = ["role", "session_authorization"]
        .iter()
        .any(|r| name.eq_ignore_ascii_case(r));
    well_formed && !reserved
}

/// `text` as an escape string literal (`E'...'`), read as itself whatever
/// `standard_conforming_strings` says: backslashes and quotes doubled.
fn quote_literal(text: &str) -> String {
    format!("E'{}'", text.replace('\\', "\\\\").replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scope_statement_quotes_the_role_and_escapes_every_value() {
        let scope = Scope::builder()
            .role(r#"odd "role"; DROP TABLE x"#)
            .setting("request.jwt.claims", r#"{"sub":"o'brien\x"}"#)
            .setting("app.tenant", "7")
            .build()
            .unwrap();
        assert_eq!(
            scope.set_local_sql(),
            r#"SET LOCAL ROLE "odd ""role""; DROP TABLE x"; SELECT set_config(E'app.tenant', E'7', true), set_config(E'request.jwt.claims', E'{"sub":"o''brien\\x"}', true)"#
        );
        assert_eq!(Scope::builder().build().unwrap().set_local_sql(), "");
    }

    #[test]
    fn scopes_are_the_same_by_role_and_settings_not_by_label_or_order() {
        let a = Scope::builder()
            .label("a")
            .role("r")
            .setting("x.a", "1")
            .setting("x.b", "2")
            .build()
            .unwrap();
        let b = Scope::builder()
            .label("b")
            .role("r")
            .setting("x.b", "2")
            .setting("x.a", "1")
            .build()
            .unwrap();
        assert_eq!(a, b);
        let hash = |s: &Scope| {
            let mut h = DefaultHasher::new();
            s.hash(&mut h);
            h.finish()
        };
        assert_eq!(hash(&a), hash(&b));
        let other = Scope::builder()
            .role("r")
            .setting("x.a", "1")
            .setting("x.b", "3")
            .build()
            .unwrap();
        assert_ne!(a, other);
        let no_role = Scope::builder()
            .setting("x.a", "1")
            .setting("x.b", "2")
            .build()
            .unwrap();
        assert_ne!(a, no_role);
    }

    #[test]
    fn what_postgres_would_refuse_or_misread_is_refused_by_name() {
        let long = "r".repeat(64);
        for (builder, err) in [
            (Scope::builder().role(""), ScopeError::InvalidRole),
            (Scope::builder().role(long), ScopeError::InvalidRole),
            (Scope::builder().role("a\0b"), ScopeError::InvalidRole),
            (
                Scope::builder().setting("role", "admin"),
                ScopeError::InvalidSettingName("role".into()),
            ),
            (
                Scope::builder().setting("app.x'; --", "1"),
                ScopeError::InvalidSettingName("app.x'; --".into()),
            ),
            (
                Scope::builder().setting("app.x", "a\0"),
                ScopeError::InvalidSettingValue("app.x".into()),
            ),
            (
                Scope::builder().setting("app.x", "1").setting("app.x", "2"),
                ScopeError::DuplicateSetting("app.x".into()),
            ),
        ] {
            assert_eq!(builder.build().unwrap_err(), err);
        }
    }

    #[test]
    fn debug_shows_the_label_never_a_setting() {
        let scope = Scope::builder()
            .label("tenant 7")
            .role("app_user")
            .setting("request.jwt.claims", "secret-token")
            .build()
            .unwrap();
        let shown = format!(
            "{scope:?} {:?}",
            Scope::builder().setting("a.b", "secret-token")
        );
        assert!(!shown.contains("secret-token"), "{shown}");
        assert!(shown.contains("tenant 7"), "{shown}");
    }
}
