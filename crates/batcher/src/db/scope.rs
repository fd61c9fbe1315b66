//! Who a scoped load runs as: a database role and transaction-local
//! settings, the way PostgREST, Supabase and PostGraphile run each request
//! for row-level security.
//!
//! Both drivers run a scoped load in a transaction of its own that starts
//! with one prepared statement, the loader's [`Prologue`]:
//! `SELECT pg_catalog.set_config('role', $1, true), pg_catalog.set_config('app.tenant', $2,
//! true), ...`, with the role and every value bound as parameters, never
//! written into SQL text (which drivers log, the server logs when a
//! statement fails, and `pg_stat_activity` shows to other sessions). It
//! sets the role and *every* setting the loader declared, to `''` where
//! the scope has none, so a load never reads what another client left on
//! a pooled connection. Everything it sets ends with the transaction.

use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Who a load runs as: a database role (or, said explicitly, the login
/// role), and settings local to the load's transaction (a user's JWT
/// claims, a tenant id), for services that authorize with row-level
/// security. Cheap to clone.
///
/// A scoped batcher (`Batcher<K, V, Scope>`, built with
/// [`build_scoped`](crate::BatcherBuilder::build_scoped) over a
/// `pg::ScopedPgLoader` or a `sqlx::ScopedSqlxLoader`) runs each load as
/// one scope, in a transaction of its own:
///
/// ```text
/// BEGIN;
/// SELECT set_config('role', $1, true), set_config('app.tenant', $2, true), ...;
///        -- $1 = 'authenticated', $2 = '7': parameters, never SQL text
/// SELECT ... WHERE id = ANY($1);   -- the batch, under the role's policies
/// COMMIT;
/// ```
///
/// Two scopes are the same scope when their label, role and settings are;
/// only then may their callers share a load or a cached value. The
/// [label](ScopeBuilder::label) names a scope in spans, logs and metrics
/// (its settings never appear there, nor in `Debug`: claims are secrets).
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
///
/// // A scope must say who it runs as.
/// assert!(Scope::builder().setting("app.tenant", "7").build().is_err());
/// # Ok::<(), pgbatch::db::ScopeError>(())
/// ```
#[derive(Clone)]
pub struct Scope {
    inner: Arc<Inner>,
}

#[derive(PartialEq, Eq, Hash)]
struct Inner {
    label: Option<String>,
    role: Role,
    /// By name (folded to lower case, as Postgres compares them), so the
    /// same settings given in another order are the same scope.
    settings: BTreeMap<String, String>,
    /// A hash of all of the above, computed once: a scope is hashed for
    /// every request.
    fingerprint: u64,
}

/// Who a scope's loads run as.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Role {
    /// The role the connection logged in as (`set_config('role', 'none',
    /// true)`, which also undoes a session-level `SET ROLE` another client
    /// left on a pooled connection).
    Login,
    /// A role the login role is a member of.
    Named(String),
}

/// What `set_config('role', ...)` reads as the login role: the one role
/// name no scope may give (see [`ScopeError::ReservedRole`]).
const LOGIN_ROLE: &str = "none";

impl Scope {
    /// Starts describing a scope.
    pub fn builder() -> ScopeBuilder {
        ScopeBuilder::default()
    }

    /// The label spans, logs and metrics name this scope by, if one was
    /// given.
    pub fn label(&self) -> Option<&str> {
        self.inner.label.as_deref()
    }

    /// The role loads run as; `None` for a scope built with
    /// [`login_role`](ScopeBuilder::login_role).
    pub fn role(&self) -> Option<&str> {
        match &self.inner.role {
            Role::Login => None,
            Role::Named(role) => Some(role),
        }
    }

    /// The names of the scope's settings, in lower case.
    pub fn setting_names(&self) -> impl Iterator<Item = &str> {
        self.inner.settings.keys().map(String::as_str)
    }

    /// How spans and metrics name this scope: its label, else its role.
    /// Never a setting's value.
    pub fn name(&self) -> String {
        match (&self.inner.label, &self.inner.role) {
            (Some(label), _) => label.clone(),
            (None, Role::Named(role)) => format!("role {role}"),
            (None, Role::Login) => "login role".to_owned(),
        }
    }

    /// Whether `text` (a database error's message, say) quotes any of the
    /// scope's setting values: such a text must not reach a log. A value
    /// of [`QUOTED_ANYWHERE`] bytes or more counts wherever it appears; a
    /// shorter one (a tenant number) only as a word of its own, so that
    /// "7" is not found in every message that holds a 7.
    pub(crate) fn is_quoted_in(&self, text: &str) -> bool {
        self.inner
            .settings
            .values()
            .any(|value| quotes(text, value))
    }
}

/// Values at least this long are looked for anywhere in a text; shorter
/// ones as whole words.
const QUOTED_ANYWHERE: usize = 6;

/// The shortest piece of a long value that counts as quoting it.
const FRAGMENT: usize = 8;

/// Whether `text` holds `value`: anywhere if it is long, or any
/// [`FRAGMENT`]-byte piece of it (Postgres quotes a window of a long value
/// it failed to parse, a JSON claim's, say); else as a word (not next to a
/// letter, digit or `_`).
fn quotes(text: &str, value: &str) -> bool {
    if value.is_empty() {
        return false;
    }
    if value.len() >= QUOTED_ANYWHERE {
        if text.contains(value) {
            return true;
        }
        return value.len() > FRAGMENT
            && value
                .char_indices()
                .map(|(at, _)| at)
                .filter(|at| value.is_char_boundary(at + FRAGMENT))
                .any(|at| text.contains(&value[at..at + FRAGMENT]));
    }
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(value).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + value.len()..].chars().next();
        !before.is_some_and(is_word) && !after.is_some_and(is_word)
    })
}

impl PartialEq for Scope {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner) || self.inner == other.inner
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
    role: Option<Role>,
    settings: Vec<(String, String)>,
}

impl fmt::Debug for ScopeBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopeBuilder")
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

/// Why a scope was refused: by its builder (a role or setting Postgres
/// would refuse or misread), by a loader it does not fit (a setting the
/// loader did not declare), or by the role check a loader runs before a
/// role's first load (a role row-level security does not apply to).
///
/// Its `Display` names roles and settings, never a setting's value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeError {
    /// The builder was given neither [`role`](ScopeBuilder::role) nor
    /// [`login_role`](ScopeBuilder::login_role): a scope says who it runs
    /// as, since the login role often owns the tables (and so bypasses
    /// their policies) or is a superuser.
    #[error("a scope must name its role, or run as the login role by saying so (`login_role`)")]
    NoRole,
    /// The role is empty, longer than Postgres's 63-byte identifiers (it
    /// would be truncated into another role's name), or holds a NUL.
    #[error("invalid role name (empty, over 63 bytes, or holding a NUL)")]
    InvalidRole,
    /// The role's name is one Postgres reads as something other than a
    /// role: `none` (which `SET ROLE` and `set_config('role', ...)` read
    /// as "back to the login role", quoted or not), `default`, `public`,
    /// `current_user`, `current_role`, `session_user`, `all`, in any case;
    /// or a name starting with `pg_`, reserved for Postgres's own roles.
    #[error("role name {0:?} is reserved: Postgres reads it as something other than a role")]
    ReservedRole(String),
    /// A setting's name is not a custom setting's: dotted (`app.tenant`),
    /// of letters, digits, `_` and `.`, not starting with a digit or a dot,
    /// at most 63 bytes. Postgres's own settings (`search_path`,
    /// `statement_timeout`, `role`, ...) are not a scope's to set.
    #[error("invalid setting name {0:?}")]
    InvalidSettingName(String),
    /// A setting's value holds a NUL, which Postgres text cannot.
    #[error("the value of setting {0:?} holds a NUL")]
    InvalidSettingValue(String),
    /// The same setting was given twice (names are compared as Postgres
    /// compares them: `APP.TENANT` is `app.tenant`).
    #[error("setting {0:?} given twice")]
    DuplicateSetting(String),
    /// The scope sets a setting its loader did not declare: the loader
    /// resets every declared setting in every load, so a setting it does
    /// not know could be left over from another client on a pooled
    /// connection for scopes that do not set it.
    #[error("setting {0:?} is not one the loader declared (`scoped([...])`)")]
    UndeclaredSetting(String),
    /// The role does not exist.
    #[error("role {0:?} does not exist")]
    NoSuchRole(String),
    /// Row-level security would not apply to the role a scope runs as.
    #[error("scope refused: role {role:?} bypasses row-level security: {why}")]
    BypassesRls {
        /// The role (the login role's name, for a login-role scope).
        role: String,
        /// Why: a superuser, `BYPASSRLS`, or the owner of a table whose
        /// policies do not apply to its owner.
        why: String,
    },
}

/// Postgres's longest identifier, in bytes (`NAMEDATALEN - 1`).
const MAX_NAME: usize = 63;

/// Role specifications Postgres reads as something other than a role
/// name somewhere (`SET ROLE`, `GRANT`, `ALTER ROLE`), compared without
/// case since unquoted they are folded.
const RESERVED_ROLES: [&str; 7] = [
    "none",
    "default",
    "public",
    "current_user",
    "current_role",
    "session_user",
    "all",
];

impl ScopeBuilder {
    /// Names the scope in spans, logs and metrics ("tenant 7",
    /// "anonymous"). Part of what makes two scopes the same, so label a
    /// scope by who it is (a tenant), not by a request. Choose a label
    /// that says nothing secret: it is printed.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// The role loads run as: `set_config('role', $1, true)`, the role a
    /// bound parameter. The login role must be a member of it; loads of a
    /// scope whose role the database refuses fail, for that scope's
    /// callers alone.
    pub fn role(mut self, role: impl Into<String>) -> Self {
        self.role = Some(Role::Named(role.into()));
        self
    }

    /// Loads run as the role the pool logged in as. Say so only when that
    /// role is one row-level security applies to: not a superuser, without
    /// `BYPASSRLS`, and owning no table read through scopes (unless the
    /// table has `FORCE ROW LEVEL SECURITY`); the loader checks this before
    /// the first load and refuses otherwise.
    pub fn login_role(mut self) -> Self {
        self.role = Some(Role::Login);
        self
    }

    /// A setting local to each load's transaction:
    /// `set_config(name, $n, true)`, as in
    /// `current_setting('app.tenant')` in a row-level-security policy. The
    /// name is compared as Postgres compares it, without case.
    pub fn setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }

    /// The scope.
    ///
    /// # Errors
    ///
    /// [`ScopeError`] for a scope that names no role, or a role or setting
    /// Postgres would refuse or misread.
    pub fn build(self) -> Result<Scope, ScopeError> {
        let role = match self.role {
            None => return Err(ScopeError::NoRole),
            Some(Role::Named(role)) => Role::Named(check_role(role)?),
            Some(Role::Login) => Role::Login,
        };
        let mut settings = BTreeMap::new();
        for (name, value) in self.settings {
            let name = setting_name(name)?;
            if value.contains('\0') {
                return Err(ScopeError::InvalidSettingValue(name));
            }
            if settings.contains_key(&name) {
                return Err(ScopeError::DuplicateSetting(name));
            }
            settings.insert(name, value);
        }
        let mut hasher = DefaultHasher::new();
        (&self.label, &role, &settings).hash(&mut hasher);
        Ok(Scope {
            inner: Arc::new(Inner {
                label: self.label,
                role,
                settings,
                fingerprint: hasher.finish(),
            }),
        })
    }
}

/// `role`, if a scope may run as it.
fn check_role(role: String) -> Result<String, ScopeError> {
    if role.is_empty() || role.len() > MAX_NAME || role.contains('\0') {
        return Err(ScopeError::InvalidRole);
    }
    let reserved = RESERVED_ROLES.iter().any(|r| role.eq_ignore_ascii_case(r))
        || role
            .get(..3)
            .is_some_and(|prefix| prefix.eq_ignore_ascii_case("pg_"));
    if reserved {
        return Err(ScopeError::ReservedRole(role));
    }
    Ok(role)
}

/// `name` as Postgres reads it (in lower case), if a scope may set it: a
/// custom setting, dotted (`app.tenant`, `request.jwt.claims`). Postgres's
/// own settings are undotted, and a tenant's value in one of them would
/// change more than what its policies read: `search_path` what the
/// statement's names mean, `statement_timeout` the loader's own, the
/// encodings and formats how rows and cursors read, `application_name`
/// what other sessions see.
fn setting_name(name: String) -> Result<String, ScopeError> {
    let well_formed = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.contains('.')
        && !name.starts_with(|c: char| c.is_ascii_digit() || c == '.')
        && !name.ends_with('.')
        && !name.contains("..")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    if !well_formed {
        return Err(ScopeError::InvalidSettingName(name));
    }
    Ok(name.to_ascii_lowercase())
}

/// What starts every scoped transaction of one loader: one statement that
/// sets the role and each setting the loader declared, with the values
/// bound as parameters. Its text names settings (not secret), never
/// values.
#[derive(Debug, Clone)]
pub(crate) struct Prologue {
    /// The declared settings, in lower case, in the order of the
    /// statement's parameters after the role.
    names: Vec<String>,
    sql: String,
}

impl Prologue {
    /// The prologue of a loader whose scopes may set `names`.
    ///
    /// # Errors
    ///
    /// A name no scope could set, or one given twice.
    pub(crate) fn new<I, N>(names: I) -> Result<Self, ScopeError>
    where
        I: IntoIterator<Item = N>,
        N: Into<String>,
    {
        let mut declared: Vec<String> = Vec::new();
        for name in names {
            let name = setting_name(name.into())?;
            if declared.contains(&name) {
                return Err(ScopeError::DuplicateSetting(name));
            }
            declared.push(name);
        }
        // The names are dotted identifiers (checked above), so
        // they stand in a literal as they are.
        // `pg_catalog.` names the function whatever the search path: the
        // clean start resets a path another client left, but the prologue
        // must not depend on that.
        let mut sql = String::from("SELECT pg_catalog.set_config('role', $1, true)");
        for (i, name) in declared.iter().enumerate() {
            sql.push_str(&format!(
                ", pg_catalog.set_config('{name}', ${}, true)",
                i + 2
            ));
        }
        Ok(Self {
            names: declared,
            sql,
        })
    }

    /// The statement.
    pub(crate) fn sql(&self) -> &str {
        &self.sql
    }

    /// The declared settings.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    /// The statement's parameters for `scope`: its role (`none` for the
    /// login role), then each declared setting's value, `''` where the
    /// scope has none.
    ///
    /// # Errors
    ///
    /// [`ScopeError::UndeclaredSetting`] for a setting of the scope's that
    /// the loader did not declare.
    pub(crate) fn values<'s>(&self, scope: &'s Scope) -> Result<Vec<&'s str>, ScopeError> {
        if let Some(name) = scope
            .setting_names()
            .find(|name| !self.names.iter().any(|n| n == name))
        {
            return Err(ScopeError::UndeclaredSetting(name.to_owned()));
        }
        let settings = &scope.inner.settings;
        let role = scope.role().unwrap_or(LOGIN_ROLE);
        Ok(std::iter::once(role)
            .chain(
                self.names
                    .iter()
                    .map(|name| settings.get(name).map_or("", String::as_str)),
            )
            .collect())
    }
}

/// Asks about the role a scope runs as (`$1`, or the login role for
/// NULL): its name, whether row-level security would not apply to it (a
/// superuser, `BYPASSRLS`), and a table with row-level security that it
/// owns (or whose owner's privileges it has) and whose policies therefore
/// do not apply to it, unless forced. No row: no such role.
///
/// Every name in it is qualified (`pg_catalog.`, `OPERATOR(pg_catalog.=)`):
/// it runs on whatever search path the connection carries, which another
/// client may have pointed at functions and operators of its own.
pub(crate) const ROLE_CHECK_SQL: &str = "\
SELECT r.rolname::pg_catalog.text, r.rolsuper, r.rolbypassrls, \
       (SELECT c.oid::pg_catalog.regclass::pg_catalog.text FROM pg_catalog.pg_class c \
         WHERE c.relrowsecurity AND NOT c.relforcerowsecurity \
           AND pg_catalog.pg_has_role(r.oid, c.relowner, 'USAGE') \
         ORDER BY c.oid LIMIT 1) \
FROM pg_catalog.pg_roles r \
WHERE r.rolname OPERATOR(pg_catalog.=) COALESCE($1::pg_catalog.name, session_user)";

/// What a scope's transaction runs first, before its prologue, as one
/// simple query (no value in it): the search path back to the session's
/// default (not what another client `SET` on a pooled connection), with
/// temporary tables searched last (another client's `CREATE TEMP TABLE
/// notes` must not hide the application's), and no statement parameters
/// in the server's log of a failed statement (another client may have
/// raised `log_parameter_max_length_on_error`).
pub(crate) const CLEAN_START: &str = "\
SET LOCAL search_path TO DEFAULT; \
SET LOCAL log_parameter_max_length_on_error = 0; \
SELECT pg_catalog.set_config('search_path', pg_catalog.concat_ws(', ', \
    NULLIF(pg_catalog.current_setting('search_path'), ''), 'pg_temp'), true)";

/// What [`ROLE_CHECK_SQL`] answered about `asked` (`None`: the login
/// role), as a verdict.
///
/// # Errors
///
/// The role does not exist, or row-level security would not apply to it.
pub(crate) fn judge_role(
    asked: Option<&str>,
    row: Option<(String, bool, bool, Option<String>)>,
) -> Result<(), ScopeError> {
    let Some((role, superuser, bypass, owned)) = row else {
        return Err(ScopeError::NoSuchRole(
            asked.unwrap_or("(the login role)").to_owned(),
        ));
    };
    let why = if superuser {
        "it is a superuser".to_owned()
    } else if bypass {
        "it has BYPASSRLS".to_owned()
    } else if let Some(table) = owned {
        format!(
            "it owns table {table} (or has its owner's privileges), whose policies do not apply \
             to their owner without FORCE ROW LEVEL SECURITY"
        )
    } else {
        return Ok(());
    };
    Err(ScopeError::BypassesRls { role, why })
}

/// The roles a loader has checked (by [`ROLE_CHECK_SQL`]) and found
/// subject to row-level security: each is checked before its first load,
/// and again once its check is [`RECHECK_AFTER`] old (a role granted
/// `BYPASSRLS`, or a table, since is then refused). A refusal is not
/// remembered, so a role fixed in the database is accepted on its next
/// load.
#[derive(Debug, Default)]
pub(crate) struct CheckedRoles {
    /// std Mutex: held for a lookup or an insert, never across an await.
    /// `None` is the login role; each with when it was accepted.
    roles: std::sync::Mutex<std::collections::HashMap<Option<String>, std::time::Instant>>,
}

/// How long a role's check holds.
pub(crate) const RECHECK_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

impl CheckedRoles {
    /// Whether `role` was checked and accepted within [`RECHECK_AFTER`].
    pub(crate) fn is_accepted(&self, role: Option<&str>) -> bool {
        self.lock()
            .get(&role.map(str::to_owned))
            .is_some_and(|at| at.elapsed() < RECHECK_AFTER)
    }

    /// Remembers that `role` was accepted now.
    pub(crate) fn accept(&self, role: Option<&str>) {
        self.lock()
            .insert(role.map(str::to_owned), std::time::Instant::now());
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<Option<String>, std::time::Instant>>
    {
        // Single inserts and lookups: a panic cannot leave it half-done.
        self.roles
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(label: &str, role: &str, settings: &[(&str, &str)]) -> Scope {
        settings
            .iter()
            .fold(Scope::builder().label(label).role(role), |b, (n, v)| {
                b.setting(*n, *v)
            })
            .build()
            .unwrap()
    }

    #[test]
    fn the_prologue_binds_the_role_and_every_declared_setting_as_parameters() {
        let prologue = Prologue::new(["request.jwt.claims", "App.Tenant"]).unwrap();
        assert_eq!(
            prologue.sql(),
            "SELECT pg_catalog.set_config('role', $1, true), \
             pg_catalog.set_config('request.jwt.claims', $2, true), \
             pg_catalog.set_config('app.tenant', $3, true)"
        );
        let s = scope(
            "t",
            r#"odd "role"; DROP TABLE x"#,
            &[("APP.TENANT", "o'brien\\x")],
        );
        assert_eq!(
            prologue.values(&s).unwrap(),
            [r#"odd "role"; DROP TABLE x"#, "", "o'brien\\x"],
            "values as given, the undeclared-by-the-scope setting empty"
        );
        let login = Scope::builder().login_role().build().unwrap();
        assert_eq!(prologue.values(&login).unwrap(), ["none", "", ""]);
        let stray = scope("t", "r", &[("app.other", "1")]);
        assert_eq!(
            prologue.values(&stray).unwrap_err(),
            ScopeError::UndeclaredSetting("app.other".into())
        );
        assert_eq!(
            Prologue::new(["a.b", "A.B"]).unwrap_err(),
            ScopeError::DuplicateSetting("a.b".into())
        );
        assert_eq!(
            Prologue::new(["role"]).unwrap_err(),
            ScopeError::InvalidSettingName("role".into())
        );
    }

    #[test]
    fn scopes_are_the_same_by_label_role_and_settings_not_by_order_or_case() {
        let a = scope("a", "r", &[("x.a", "1"), ("x.b", "2")]);
        let b = scope("a", "r", &[("X.B", "2"), ("x.a", "1")]);
        assert_eq!(a, b);
        let hash = |s: &Scope| {
            let mut h = DefaultHasher::new();
            s.hash(&mut h);
            h.finish()
        };
        assert_eq!(hash(&a), hash(&b));
        for other in [
            scope("a", "r", &[("x.a", "1"), ("x.b", "3")]),
            scope("b", "r", &[("x.a", "1"), ("x.b", "2")]),
            scope("a", "R", &[("x.a", "1"), ("x.b", "2")]),
            Scope::builder()
                .label("a")
                .login_role()
                .setting("x.a", "1")
                .setting("x.b", "2")
                .build()
                .unwrap(),
        ] {
            assert_ne!(a, other);
        }
    }

    #[test]
    fn what_postgres_would_refuse_or_misread_is_refused_by_name() {
        let long = "r".repeat(64);
        let mut cases = vec![
            (Scope::builder(), ScopeError::NoRole),
            (
                Scope::builder().setting("app.tenant", "2"),
                ScopeError::NoRole,
            ),
            (Scope::builder().role(""), ScopeError::InvalidRole),
            (Scope::builder().role(long), ScopeError::InvalidRole),
            (Scope::builder().role("a\0b"), ScopeError::InvalidRole),
            (
                Scope::builder().login_role().setting("role", "admin"),
                ScopeError::InvalidSettingName("role".into()),
            ),
            (
                Scope::builder()
                    .login_role()
                    .setting("Session_Authorization", "x"),
                ScopeError::InvalidSettingName("Session_Authorization".into()),
            ),
            (
                Scope::builder().login_role().setting("app.x'; --", "1"),
                ScopeError::InvalidSettingName("app.x'; --".into()),
            ),
            (
                Scope::builder().login_role().setting("app..x", "1"),
                ScopeError::InvalidSettingName("app..x".into()),
            ),
            (
                Scope::builder().login_role().setting("search_path", "evil"),
                ScopeError::InvalidSettingName("search_path".into()),
            ),
            (
                Scope::builder()
                    .login_role()
                    .setting("statement_timeout", "0"),
                ScopeError::InvalidSettingName("statement_timeout".into()),
            ),
            (
                Scope::builder().login_role().setting("app.x", "a\0"),
                ScopeError::InvalidSettingValue("app.x".into()),
            ),
            (
                Scope::builder()
                    .login_role()
                    .setting("app.tenant", "1")
                    .setting("APP.TENANT", "2"),
                ScopeError::DuplicateSetting("app.tenant".into()),
            ),
        ];
        for reserved in [
            "none",
            "NONE",
            "None",
            "default",
            "public",
            "current_user",
            "CURRENT_ROLE",
            "session_user",
            "all",
            "pg_read_all_data",
            "PG_monitor",
        ] {
            cases.push((
                Scope::builder().role(reserved),
                ScopeError::ReservedRole(reserved.into()),
            ));
        }
        for (builder, err) in cases {
            assert_eq!(builder.build().unwrap_err(), err);
        }
        for fine in ["nonexistent", "app_user", "Tenant 7", "pgx", "defaults"] {
            assert!(Scope::builder().role(fine).build().is_ok(), "{fine}");
        }
    }

    #[test]
    fn debug_and_errors_show_names_never_a_setting() {
        let scope = Scope::builder()
            .label("tenant 7")
            .role("app_user")
            .setting("request.jwt.claims", "secret-token")
            .build()
            .unwrap();
        let prologue = Prologue::new(["app.tenant"]).unwrap();
        let shown = format!(
            "{scope:?} {:?} {} {prologue:?}",
            Scope::builder().setting("a.b", "secret-token"),
            prologue.values(&scope).unwrap_err(),
        );
        assert!(!shown.contains("secret-token"), "{shown}");
        assert!(shown.contains("tenant 7"), "{shown}");
        assert!(scope.is_quoted_in(r#"invalid input syntax: "secret-token""#));
        assert!(scope.is_quoted_in("no such user secret-tokenx"));
        assert!(scope.is_quoted_in("...et-token..."), "a window of it");
        assert!(!scope.is_quoted_in("a secret"), "under eight bytes of it");
        assert!(!scope.is_quoted_in("permission denied for table notes"));
        let short = Scope::builder()
            .login_role()
            .setting("app.tenant", "7")
            .build()
            .unwrap();
        assert!(short.is_quoted_in(r#"invalid input syntax for type integer: "7""#));
        assert!(short.is_quoted_in("tenant 7 is unknown"));
        for unrelated in [
            "relation t_17 does not exist",
            "role \"db_7_stranger\"",
            "70 rows",
        ] {
            assert!(!short.is_quoted_in(unrelated), "{unrelated}");
        }
    }

    #[test]
    fn the_role_check_refuses_what_row_level_security_does_not_apply_to() {
        let row = |superuser, bypass, owned: Option<&str>| {
            Some((
                "auth".to_owned(),
                superuser,
                bypass,
                owned.map(str::to_owned),
            ))
        };
        assert_eq!(judge_role(Some("auth"), row(false, false, None)), Ok(()));
        for (row, why) in [
            (row(true, false, None), "superuser"),
            (row(false, true, None), "BYPASSRLS"),
            (
                row(false, false, Some("public.notes")),
                "owns table public.notes",
            ),
        ] {
            let err = judge_role(None, row).unwrap_err();
            assert!(
                matches!(&err, ScopeError::BypassesRls { role, why: w } if role == "auth" && w.contains(why)),
                "{err}"
            );
        }
        assert_eq!(
            judge_role(Some("ghost"), None),
            Err(ScopeError::NoSuchRole("ghost".into()))
        );
    }

    #[test]
    fn a_checked_role_is_remembered_and_the_login_role_apart() {
        let checked = CheckedRoles::default();
        assert!(!checked.is_accepted(Some("a")));
        checked.accept(Some("a"));
        assert!(checked.is_accepted(Some("a")));
        assert!(!checked.is_accepted(None));
        checked.accept(None);
        assert!(checked.is_accepted(None));
    }
}
