//! A [`ScopedLoader`] over a [`SqlxLoader`]: each load in a transaction of
//! its own that runs as one [`Scope`].

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use ::sqlx::error::{DatabaseError, ErrorKind};
use ::sqlx::postgres::{PgDatabaseError, PgPool};

use super::loader::{BatchQuery, PageQuery, SqlxLoader};
use super::prologue::{Scoping, Start};
use crate::db::{List, Page, PageKey, Paged, Scope, ScopeError, Single, StatementMode};
use crate::{Loaded, ScopedLoader};

/// Runs a [`BatchQuery`] as a [`Scope`]: the [`ScopedLoader`] of a scoped
/// [`Batcher`](crate::Batcher) (`Batcher<K, V, Scope>`, built with
/// [`build_scoped`](crate::BatcherBuilder::build_scoped)). Made by
/// [`SqlxLoader::scoped`].
///
/// Each load is one transaction: `BEGIN`, the loader's prologue (`SELECT
/// set_config('role', $1, true), set_config('app.tenant', $2, true),
/// ...`: the role and every declared setting, the values bound as
/// parameters), the statement, `COMMIT`; four round trips, since sqlx
/// sends one statement at a time (tokio-postgres's `ScopedPgLoader` sends
/// all four in one). So row-level security applies as it does to the
/// scope's own requests, no load reads a setting another client left on
/// the connection, no value of a scope appears in SQL text, and nothing of
/// the scope is left on the connection.
///
/// Before a role's first load, in that load's transaction, the loader
/// checks it (once per role): a role that is a superuser, has
/// `BYPASSRLS`, or owns a table whose row-level security is not forced is
/// refused, since policies would not apply to it. A refused scope fails
/// with `sqlx::Error::Configuration` holding the [`ScopeError`].
///
/// A database report of a failed load reaches the callers as a
/// `sqlx::Error::Database` with the same SQLSTATE and message, without the
/// report's detail, hint, context and internal query (where Postgres
/// quotes pieces of what it was given), and with the message withheld too
/// when it quotes one of the scope's values (a policy's failed cast of a
/// setting): no log line carries a value.
///
/// Every way to load here takes a scope: there is no unscoped load on a
/// scoped loader.
pub struct ScopedSqlxLoader<Q, R = Single> {
    loader: SqlxLoader<Q, R>,
    scoping: Arc<Scoping>,
    /// How many scopes one load may serve, one after another.
    scopes_per_load: usize,
}

/// Scopes one load serves at most, by default (see
/// [`ScopedSqlxLoader::scopes_per_load`]).
const DEFAULT_SCOPES_PER_LOAD: usize = 4;

impl<Q, R> Clone for ScopedSqlxLoader<Q, R> {
    fn clone(&self) -> Self {
        Self {
            loader: self.loader.clone(),
            scoping: Arc::clone(&self.scoping),
            scopes_per_load: self.scopes_per_load,
        }
    }
}

impl<Q, R> fmt::Debug for ScopedSqlxLoader<Q, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedSqlxLoader")
            .field("loader", &self.loader)
            .field("settings", &self.scoping.names().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl<Q, R> SqlxLoader<Q, R> {
    /// This loader, run as a [`Scope`] per load; `settings` names every
    /// setting its scopes may set. Each load sets all of them (to `''`
    /// where its scope has none), so none is read from what another client
    /// left on a pooled connection; a scope that sets any other is refused
    /// ([`ScopeError::UndeclaredSetting`]). Declare every setting your
    /// policies read.
    ///
    /// # Errors
    ///
    /// [`ScopeError::InvalidSettingName`] for a name no scope could set,
    /// [`ScopeError::DuplicateSetting`] for one given twice.
    pub fn scoped<I, N>(self, settings: I) -> Result<ScopedSqlxLoader<Q, R>, ScopeError>
    where
        I: IntoIterator<Item = N>,
        N: Into<String>,
    {
        Ok(ScopedSqlxLoader {
            loader: self,
            scoping: Arc::new(Scoping::new(settings)?),
            scopes_per_load: DEFAULT_SCOPES_PER_LOAD,
        })
    }
}

impl<Q, R> ScopedSqlxLoader<Q, R> {
    /// The same loader on another pool (a read replica's, say), sharing
    /// the query. Its roles are checked again, on that pool's database.
    #[must_use]
    pub fn with_pool(&self, pool: PgPool) -> Self {
        Self {
            loader: self.loader.with_pool(pool),
            scoping: Arc::new(self.scoping.anew()),
            scopes_per_load: self.scopes_per_load,
        }
    }

    /// Lets one load serve up to `n` scopes (at least 1), each scope's
    /// transaction after the one before, on the pool's connections one at
    /// a time. sqlx sends one statement at a time and cannot pipeline, so
    /// this saves the batcher loads, not round trips: each scope's
    /// transaction still takes four. tokio-postgres's `ScopedPgLoader`
    /// sends several scopes' transactions in one round trip. Default 4.
    #[must_use]
    pub fn scopes_per_load(mut self, n: usize) -> Self {
        self.scopes_per_load = n.max(1);
        self
    }

    /// The pool the loader draws connections from.
    pub fn pool(&self) -> &PgPool {
        self.loader.pool()
    }

    /// The query this loader runs.
    pub fn query(&self) -> &Q {
        self.loader.query()
    }

    /// How this loader sends its statements.
    pub fn statement_mode(&self) -> StatementMode {
        self.loader.statement_mode()
    }

    /// The settings every load sets, in lower case.
    pub fn settings(&self) -> impl Iterator<Item = &str> {
        self.scoping.names()
    }

    /// How a load of `scope` starts.
    fn start<'s>(&'s self, scope: &'s Scope) -> Result<Start<'s>, ::sqlx::Error> {
        self.scoping.start(scope)
    }
}

impl<Q: BatchQuery> ScopedSqlxLoader<Q> {
    /// Looks up one key as `scope` with the single-key statement, in a
    /// transaction of its own, no batching.
    ///
    /// # Errors
    ///
    /// As [`ScopedLoader::load`].
    pub async fn load_one(
        &self,
        scope: &Scope,
        key: &Q::Key,
    ) -> Result<Option<Q::Value>, ::sqlx::Error> {
        let start = self.start(scope)?;
        let one = self.loader.load_one_as(key, Some(&start)).await;
        one.map_err(|e| withhold(e, scope))
    }
}

/// `e`, with its message withheld if the database's report quotes a value
/// of `scope`.
fn withhold(e: ::sqlx::Error, scope: &Scope) -> ::sqlx::Error {
    let ::sqlx::Error::Database(db) = &e else {
        return e;
    };
    let severity = db.try_downcast_ref::<PgDatabaseError>().map_or_else(
        || "ERROR".to_owned(),
        |pg| format!("{:?}", pg.severity()).to_uppercase(),
    );
    let code = db.code().map(Cow::into_owned).unwrap_or_default();
    let message = if scope.is_quoted_in(db.message()) {
        format!(
            "{severity} (SQLSTATE {code}): the message is withheld, since it quotes a value of \
             the scope"
        )
    } else {
        format!("{severity}: {} (SQLSTATE {code})", db.message())
    };
    ::sqlx::Error::Database(Box::new(Withheld {
        message,
        code,
        kind: db.kind(),
    }))
}

/// A database report of a scoped load, as the scope's callers and logs may
/// see it: its severity, SQLSTATE and message, and never its detail, hint,
/// context or internal query, where Postgres quotes pieces of what it was
/// given; the message too is withheld when it quotes a value of the scope.
/// The SQLSTATE (which `classify` sorts by) and kind survive.
#[derive(Debug)]
struct Withheld {
    message: String,
    code: String,
    kind: ErrorKind,
}

impl fmt::Display for Withheld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Withheld {}

impl DatabaseError for Withheld {
    fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.code))
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> ErrorKind {
        match self.kind {
            ErrorKind::UniqueViolation => ErrorKind::UniqueViolation,
            ErrorKind::ForeignKeyViolation => ErrorKind::ForeignKeyViolation,
            ErrorKind::NotNullViolation => ErrorKind::NotNullViolation,
            ErrorKind::CheckViolation => ErrorKind::CheckViolation,
            _ => ErrorKind::Other,
        }
    }
}

/// Each scope's answers, or the error of the whole load.
type InSeries<K, V> = Result<Vec<Result<Loaded<K, V>, ::sqlx::Error>>, ::sqlx::Error>;

/// A scoped load: the statement in a transaction of its own that runs as
/// the [`Scope`] (see [`ScopedSqlxLoader`]); several scopes' transactions
/// one after another.
impl<Q: BatchQuery> ScopedLoader<Scope, Q::Key, Q::Value> for ScopedSqlxLoader<Q> {
    type Error = ::sqlx::Error;

    async fn load(
        &self,
        scope: &Scope,
        keys: Vec<Q::Key>,
    ) -> Result<Loaded<Q::Key, Q::Value>, ::sqlx::Error> {
        let start = self.start(scope)?;
        let loaded = self.loader.load_keys(keys, Some(&start)).await;
        loaded.map_err(|e| withhold(e, scope))
    }

    fn is_absent(&self, value: &Q::Value) -> bool {
        self.loader.query().is_absent(value)
    }

    fn label<'s>(&self, scope: &'s Scope) -> Option<Cow<'s, str>> {
        Some(Cow::Owned(scope.name()))
    }

    fn scopes_per_load(&self) -> usize {
        self.scopes_per_load
    }

    async fn load_scopes(&self, batches: Vec<(Scope, Vec<Q::Key>)>) -> InSeries<Q::Key, Q::Value> {
        // One after another: concurrently, one load would hold as many of
        // the pool's connections as it has scopes.
        let mut each = Vec::with_capacity(batches.len());
        for (scope, keys) in batches {
            each.push(self.load(&scope, keys).await);
        }
        Ok(each)
    }
}

/// Each key's list, as the [`Scope`].
impl<Q: BatchQuery> ScopedLoader<Scope, Q::Key, Vec<Q::Value>> for ScopedSqlxLoader<Q, List> {
    type Error = ::sqlx::Error;

    async fn load(
        &self,
        scope: &Scope,
        keys: Vec<Q::Key>,
    ) -> Result<Loaded<Q::Key, Vec<Q::Value>>, ::sqlx::Error> {
        let start = self.start(scope)?;
        let loaded = self.loader.load_lists(keys, Some(&start)).await;
        loaded.map_err(|e| withhold(e, scope))
    }

    fn is_absent(&self, value: &Vec<Q::Value>) -> bool {
        value.is_empty()
    }

    fn label<'s>(&self, scope: &'s Scope) -> Option<Cow<'s, str>> {
        Some(Cow::Owned(scope.name()))
    }

    fn scopes_per_load(&self) -> usize {
        self.scopes_per_load
    }

    async fn load_scopes(
        &self,
        batches: Vec<(Scope, Vec<Q::Key>)>,
    ) -> InSeries<Q::Key, Vec<Q::Value>> {
        // One after another: concurrently, one load would hold as many of
        // the pool's connections as it has scopes.
        let mut each = Vec::with_capacity(batches.len());
        for (scope, keys) in batches {
            each.push(self.load(&scope, keys).await);
        }
        Ok(each)
    }
}

/// Each key's page, as the [`Scope`].
impl<Q: PageQuery> ScopedLoader<Scope, PageKey<Q::Parent>, Page<Q::Value>>
    for ScopedSqlxLoader<Q, Paged>
{
    type Error = ::sqlx::Error;

    async fn load(
        &self,
        scope: &Scope,
        keys: Vec<PageKey<Q::Parent>>,
    ) -> Result<Loaded<PageKey<Q::Parent>, Page<Q::Value>>, ::sqlx::Error> {
        let start = self.start(scope)?;
        let loaded = self.loader.load_pages(keys, Some(&start)).await;
        loaded.map_err(|e| withhold(e, scope))
    }

    fn is_absent(&self, value: &Page<Q::Value>) -> bool {
        value.items.is_empty()
    }

    fn label<'s>(&self, scope: &'s Scope) -> Option<Cow<'s, str>> {
        Some(Cow::Owned(scope.name()))
    }

    fn scopes_per_load(&self) -> usize {
        self.scopes_per_load
    }

    async fn load_scopes(
        &self,
        batches: Vec<(Scope, Vec<PageKey<Q::Parent>>)>,
    ) -> InSeries<PageKey<Q::Parent>, Page<Q::Value>> {
        // One after another: concurrently, one load would hold as many of
        // the pool's connections as it has scopes.
        let mut each = Vec::with_capacity(batches.len());
        for (scope, keys) in batches {
            each.push(self.load(&scope, keys).await);
        }
        Ok(each)
    }
}
