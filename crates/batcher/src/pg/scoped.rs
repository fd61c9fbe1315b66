//! A [`ScopedLoader`] over a [`PgLoader`]: each load in a transaction of
//! its own that runs as one [`Scope`].

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use bytes::BytesMut;
use deadpool_postgres::Pool;
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};
use tokio_postgres::Row;

use super::loader::{BatchQuery, PageQuery, PgError, PgLoader, Withheld};
use super::statements::{Sql, Start, Statements};
use crate::db::{
    judge_role, CheckedRoles, List, Page, PageKey, Paged, Prologue, Scope, ScopeError, Single,
    ROLE_CHECK_SQL,
};
use crate::{Loaded, ScopedLoader};

/// Runs a [`BatchQuery`] as a [`Scope`]: the [`ScopedLoader`] of a scoped
/// [`Batcher`](crate::Batcher) (`Batcher<K, V, Scope>`, built with
/// [`build_scoped`](crate::BatcherBuilder::build_scoped)). Made by
/// [`PgLoader::scoped`].
///
/// Each load is one transaction, sent in one round trip: `BEGIN`, the
/// loader's prologue (`SELECT set_config('role', $1, true),
/// set_config('app.tenant', $2, true), ...`: the role and every declared
/// setting, the values bound as parameters), the statement, `COMMIT`. So
/// row-level security applies as it does to the scope's own requests, no
/// load reads a setting another client left on the connection, no value
/// of a scope appears in SQL text, and nothing of the scope is left on the
/// connection.
///
/// A load may serve several scopes (up to
/// [`scopes_per_load`](Self::scopes_per_load), 4 by default): the batcher
/// then fills it from several tenants' waiting keys, and every scope's
/// transaction goes out on one connection in one round trip, one after
/// another. Each scope's keys are read from its own transaction only; a
/// scope whose role is refused or whose statement fails aborts its own
/// transaction, whose `COMMIT` rolls back, and the next starts clean. So
/// a thousand tenants with a key or two each still share round trips.
///
/// Before a role's first load, the loader checks it (one statement, once
/// per role): a role that is a superuser, has `BYPASSRLS`, or owns a table
/// whose row-level security is not forced is refused
/// ([`ScopeError::BypassesRls`]), since policies would not apply to it.
///
/// Every way to load here takes a scope: there is no unscoped load on a
/// scoped loader.
pub struct ScopedPgLoader<Q, R = Single> {
    pub(super) loader: PgLoader<Q, R>,
    scoping: Arc<Scoping>,
    /// How many scopes one load may serve, pipelined on one connection.
    scopes_per_load: usize,
}

/// Scopes one load serves at most, by default. Each scope's transaction
/// costs Postgres about as much as a round trip does, and a load that takes
/// many scopes' keys at once leaves each scope fewer keys to gather, so
/// more transactions carry fewer keys each. With 300 callers (the `scopes`
/// benchmark), 4 read 1.4x one scope a load at 100 tenants and 1.5x at
/// 1,000, where 32 read 0.8x and 1.7x.
const DEFAULT_SCOPES_PER_LOAD: usize = 4;

/// What every load of one scoped loader shares: its prologue, the role
/// check, and the roles checked.
struct Scoping {
    prologue: Prologue,
    /// The prologue as a statement: all its parameters are text.
    start: Sql,
    check: Sql,
    checked: CheckedRoles,
}

impl<Q, R> Clone for ScopedPgLoader<Q, R> {
    fn clone(&self) -> Self {
        Self {
            loader: self.loader.clone(),
            scoping: Arc::clone(&self.scoping),
            scopes_per_load: self.scopes_per_load,
        }
    }
}

impl<Q, R> fmt::Debug for ScopedPgLoader<Q, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedPgLoader")
            .field("loader", &self.loader)
            .field("settings", &self.scoping.prologue)
            .finish_non_exhaustive()
    }
}

impl<Q, R> PgLoader<Q, R> {
    /// This loader, run as a [`Scope`] per load; `settings` names every
    /// setting its scopes may set. Each load sets all of them (to `''`
    /// where its scope has none), so none is read from what another client
    /// left on a pooled connection; a scope that sets any other is refused
    /// ([`ScopeError::UndeclaredSetting`]). Declare every setting your
    /// policies read.
    ///
    /// ```
    /// # fn f(pool: pgbatch::pg::Pool, query: impl pgbatch::pg::BatchQuery) -> Result<(), pgbatch::pg::ScopeError> {
    /// use pgbatch::pg::PgLoader;
    ///
    /// let loader = PgLoader::new(pool, query).scoped(["app.tenant", "request.jwt.claims"])?;
    /// # let _ = loader; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ScopeError::InvalidSettingName`] for a name no scope could set,
    /// [`ScopeError::DuplicateSetting`] for one given twice.
    pub fn scoped<I, N>(self, settings: I) -> Result<ScopedPgLoader<Q, R>, ScopeError>
    where
        I: IntoIterator<Item = N>,
        N: Into<String>,
    {
        Ok(ScopedPgLoader {
            loader: self,
            scoping: Arc::new(Scoping::new(Prologue::new(settings)?)),
            scopes_per_load: DEFAULT_SCOPES_PER_LOAD,
        })
    }
}

impl<Q, R> ScopedPgLoader<Q, R> {
    /// The same loader on another pool (a read replica's, say), sharing
    /// the query. Its roles are checked again, on that pool's database.
    #[must_use]
    pub fn with_pool(&self, pool: Pool) -> Self {
        Self {
            loader: self.loader.with_pool(pool),
            scoping: Arc::new(Scoping::new(self.scoping.prologue.clone())),
            scopes_per_load: self.scopes_per_load,
        }
    }

    /// Lets one load serve up to `n` scopes (at least 1): their
    /// transactions go out together on one connection, one after another,
    /// in one round trip (see [`ScopedLoader::load_scopes`]). 1 gives each
    /// scope loads of its own. Default 4: more share more round trips when
    /// each tenant has a key or two waiting, but leave tenants with many
    /// waiting keys more, smaller transactions.
    #[must_use]
    pub fn scopes_per_load(mut self, n: usize) -> Self {
        self.scopes_per_load = n.max(1);
        self
    }

    /// The pool the loader draws connections from.
    pub fn pool(&self) -> &Pool {
        self.loader.pool()
    }

    /// The query this loader runs.
    pub fn query(&self) -> &Q {
        self.loader.query()
    }

    /// How this loader sends its statements.
    pub fn statements(&self) -> Statements {
        self.loader.statements()
    }

    /// The settings every load sets, in lower case.
    pub fn settings(&self) -> impl Iterator<Item = &str> {
        self.scoping.prologue.names()
    }

    /// Runs any statement of yours as `scope`, in a transaction of its own
    /// that starts as a load's does (one round trip): a list, a count, a
    /// statement the loader's query does not cover, under the same
    /// policies, checks and prologue.
    ///
    /// # Errors
    ///
    /// As [`ScopedLoader::load`].
    pub async fn query_as(
        &self,
        scope: &Scope,
        sql: &Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, PgError> {
        let values = self.prepare(scope).await?;
        let prologue = as_params(&values);
        let start = self.start(&prologue);
        let rows = self.loader.run(sql, params, Some(start)).await;
        rows.map_err(|e| withhold(e, scope))
    }

    /// The prologue's parameters for `scope`, once its role is checked
    /// (the first time only). A failure of the work they start goes
    /// through [`withhold`].
    pub(super) async fn prepare<'s>(&self, scope: &'s Scope) -> Result<Vec<Secret<'s>>, PgError> {
        let values = self
            .scoping
            .prologue
            .values(scope)
            .map_err(PgError::Scope)?;
        self.check_role(scope.role()).await?;
        Ok(values.into_iter().map(Secret).collect())
    }

    /// The start of a scope's transaction with `params` (from
    /// [`prepare`](Self::prepare)).
    pub(super) fn start<'a>(&'a self, params: &'a [&'a (dyn ToSql + Sync)]) -> Start<'a> {
        Start {
            sql: &self.scoping.start,
            params,
        }
    }

    /// Refuses a role (`None`: the login role) that row-level security
    /// does not apply to; asks the database the first time only.
    async fn check_role(&self, role: Option<&str>) -> Result<(), PgError> {
        let checked = &self.scoping.checked;
        if checked.is_accepted(role) {
            return Ok(());
        }
        let rows = self.loader.run(&self.scoping.check, &[&role], None).await?;
        let row = match rows.first() {
            Some(r) => Some((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?)),
            None => None,
        };
        judge_role(role, row).map_err(PgError::Scope)?;
        checked.accept(role);
        Ok(())
    }
}

impl<Q: BatchQuery> ScopedPgLoader<Q> {
    /// Looks up one key as `scope` with the single-key statement, in a
    /// transaction of its own: one round trip, no batching.
    ///
    /// # Errors
    ///
    /// As [`ScopedLoader::load`].
    pub async fn load_one(&self, scope: &Scope, key: &Q::Key) -> Result<Option<Q::Value>, PgError> {
        let values = self.prepare(scope).await?;
        let params = as_params(&values);
        let start = self.start(&params);
        let one = self.loader.load_one_as(key, Some(start)).await;
        one.map_err(|e| withhold(e, scope))
    }
}

impl Scoping {
    fn new(prologue: Prologue) -> Self {
        let params = 1 + prologue.names().count();
        Self {
            start: Sql::with_types(prologue.sql(), vec![Type::TEXT; params]),
            prologue,
            check: Sql::with_types(ROLE_CHECK_SQL, vec![Type::TEXT]),
            checked: CheckedRoles::default(),
        }
    }
}

/// Each scope's answers, or the error of the whole load (no connection).
pub(super) type Pipelined<K, V> = Result<Vec<Result<Loaded<K, V>, PgError>>, PgError>;

/// The prologue's parameters as a statement takes them.
pub(super) fn as_params<'a>(values: &'a [Secret<'_>]) -> Vec<&'a (dyn ToSql + Sync)> {
    values.iter().map(|v| v as &(dyn ToSql + Sync)).collect()
}

/// `e` as a scope's callers may see it: a database report is [`Withheld`]
/// (its message too, if it quotes a value of `scope`).
pub(super) fn withhold(e: PgError, scope: &Scope) -> PgError {
    match e {
        PgError::Query(error) if error.as_db_error().is_some() => {
            let message_shown = error
                .as_db_error()
                .is_some_and(|db| !scope.is_quoted_in(db.message()));
            PgError::Withheld(Withheld {
                error,
                message_shown,
            })
        }
        e => e,
    }
}

/// A scope's value as a statement parameter: sent as text, shown by
/// `Debug` as a placeholder, since tokio-postgres logs a prepared
/// statement's parameters at debug level.
pub(super) struct Secret<'a>(&'a str);

impl fmt::Debug for Secret<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<a scope's value>")
    }
}

impl ToSql for Secret<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        self.0.to_sql(ty, out)
    }

    fn accepts(ty: &Type) -> bool {
        <&str as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

/// A scoped load: the statement in a transaction of its own that runs as
/// the [`Scope`] (see [`ScopedPgLoader`]); several scopes' transactions in
/// one round trip.
impl<Q: BatchQuery> ScopedLoader<Scope, Q::Key, Q::Value> for ScopedPgLoader<Q> {
    type Error = PgError;

    async fn load(
        &self,
        scope: &Scope,
        keys: Vec<Q::Key>,
    ) -> Result<Loaded<Q::Key, Q::Value>, PgError> {
        self.load_scope(scope, keys).await
    }

    fn scopes_per_load(&self) -> usize {
        self.scopes_per_load
    }

    async fn load_scopes(&self, batches: Vec<(Scope, Vec<Q::Key>)>) -> Pipelined<Q::Key, Q::Value> {
        self.load_each(batches).await
    }

    fn is_absent(&self, value: &Q::Value) -> bool {
        self.loader.query().is_absent(value)
    }

    fn label<'s>(&self, scope: &'s Scope) -> Option<Cow<'s, str>> {
        Some(Cow::Owned(scope.name()))
    }
}

/// Each key's list, as the [`Scope`].
impl<Q: BatchQuery> ScopedLoader<Scope, Q::Key, Vec<Q::Value>> for ScopedPgLoader<Q, List> {
    type Error = PgError;

    async fn load(
        &self,
        scope: &Scope,
        keys: Vec<Q::Key>,
    ) -> Result<Loaded<Q::Key, Vec<Q::Value>>, PgError> {
        self.load_scope(scope, keys).await
    }

    fn scopes_per_load(&self) -> usize {
        self.scopes_per_load
    }

    async fn load_scopes(
        &self,
        batches: Vec<(Scope, Vec<Q::Key>)>,
    ) -> Pipelined<Q::Key, Vec<Q::Value>> {
        self.load_each(batches).await
    }

    fn is_absent(&self, value: &Vec<Q::Value>) -> bool {
        value.is_empty()
    }

    fn label<'s>(&self, scope: &'s Scope) -> Option<Cow<'s, str>> {
        Some(Cow::Owned(scope.name()))
    }
}

/// Each key's page, as the [`Scope`].
impl<Q: PageQuery> ScopedLoader<Scope, PageKey<Q::Parent>, Page<Q::Value>>
    for ScopedPgLoader<Q, Paged>
{
    type Error = PgError;

    async fn load(
        &self,
        scope: &Scope,
        keys: Vec<PageKey<Q::Parent>>,
    ) -> Result<Loaded<PageKey<Q::Parent>, Page<Q::Value>>, PgError> {
        let values = self.prepare(scope).await?;
        let params = as_params(&values);
        let start = self.start(&params);
        let shown = |e| withhold(e, scope);
        self.loader.load_pages(keys, Some(start), shown).await
    }

    fn scopes_per_load(&self) -> usize {
        self.scopes_per_load
    }

    async fn load_scopes(
        &self,
        batches: Vec<(Scope, Vec<PageKey<Q::Parent>>)>,
    ) -> Pipelined<PageKey<Q::Parent>, Page<Q::Value>> {
        self.load_each_page(batches).await
    }

    fn is_absent(&self, value: &Page<Q::Value>) -> bool {
        value.items.is_empty()
    }

    fn label<'s>(&self, scope: &'s Scope) -> Option<Cow<'s, str>> {
        Some(Cow::Owned(scope.name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_value_never_shows_in_debug() {
        let params: Vec<&(dyn ToSql + Sync)> = vec![&Secret("secret-claims")];
        assert!(!format!("{params:?}").contains("secret-claims"));
    }
}
