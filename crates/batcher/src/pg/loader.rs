//! A [`Loader`] that runs one prepared statement per batch.

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use deadpool_postgres::{Pool, PoolError};
use tokio_postgres::error::DbError;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::error::DbErrorKind;
use super::statements::{Sql, Start, Statements};
use crate::db::{again_if_lost, BadRows, Classify, ScopeError};
use crate::error::Chain;
use crate::{Loaded, Loader};

/// Statement parameters that may borrow from the keys they were made from.
pub type Params<'a> = Vec<Box<dyn ToSql + Sync + Send + 'a>>;

/// How to look keys up in Postgres: one statement for a batch of keys, and
/// how a row maps to a key and its value. A statement for a single key is
/// optional.
///
/// ```
/// use pgbatch::pg::{BatchQuery, Params};
/// use pgbatch::pg::tokio_postgres::{Error, Row};
///
/// /// `random_read_test(pk text PRIMARY KEY, payload text NOT NULL)`.
/// struct Payloads;
///
/// impl BatchQuery for Payloads {
///     type Key = String;
///     type Value = String;
///
///     fn batch_sql(&self) -> &str {
///         "SELECT pk, payload FROM random_read_test WHERE pk = ANY($1)"
///     }
///     fn batch_params<'a>(&self, keys: &'a [String]) -> Params<'a> {
///         vec![Box::new(keys)]
///     }
///     fn map_row(&self, row: &Row) -> Result<(String, String), Error> {
///         Ok((row.try_get(0)?, row.try_get(1)?))
///     }
/// }
/// ```
///
/// Bind the keys as one array (`= ANY($1)`, or `unnest($1, $2)` for a
/// composite key) rather than building `IN ($1, $2, ...)`: an `IN` list is
/// a different statement for every batch size, which defeats the statement
/// cache.
pub trait BatchQuery: Send + Sync + 'static {
    /// What is looked up. `Debug`, so that an error about a key's row can
    /// name the key.
    type Key: Clone + Eq + Hash + fmt::Debug + Send + Sync + 'static;
    /// What a key maps to.
    type Value: Clone + Send + Sync + 'static;

    /// The statement for many keys. Every row it returns must map to one of
    /// the keys.
    fn batch_sql(&self) -> &str;
    /// The parameters of [`batch_sql`](Self::batch_sql) for `keys`.
    fn batch_params<'a>(&self, keys: &'a [Self::Key]) -> Params<'a>;
    /// The statement for one key: the naive path's query, and what the
    /// loader runs for a batch of one. It must return the same rows as
    /// [`batch_sql`](Self::batch_sql) would for that key.
    ///
    /// By default, [`batch_sql`](Self::batch_sql) itself. Give a plain
    /// equality (`WHERE pk = $1`, with
    /// [`single_params`](Self::single_params)) when lone lookups are common:
    /// it costs the server a little less than `= ANY` over one element.
    fn single_sql(&self) -> &str {
        self.batch_sql()
    }
    /// The parameters of [`single_sql`](Self::single_sql) for `key`; by
    /// default [`batch_params`](Self::batch_params) for that one key.
    fn single_params<'a>(&self, key: &'a Self::Key) -> Params<'a> {
        self.batch_params(std::slice::from_ref(key))
    }
    /// The key and value of a row returned by either statement.
    ///
    /// # Errors
    ///
    /// When a column is missing or has an unexpected type.
    fn map_row(&self, row: &Row) -> Result<(Self::Key, Self::Value), tokio_postgres::Error>;

    /// The key of a row that [`map_row`](Self::map_row) could not map,
    /// read on its own (`row.try_get(0).ok()`), so that the row fails its
    /// own key alone, with an error naming the key and the column. By
    /// default `None`: such a row then fails every key of its batch left
    /// without a value, since which key it was cannot be told (and none of
    /// them may read as "not found").
    fn row_key(&self, row: &Row) -> Option<Self::Key> {
        let _ = row;
        None
    }

    /// Whether a mapped value stands for a missing row (see
    /// [`Loader::is_absent`]): for a statement that answers every key, such
    /// as a `LEFT JOIN` telling "no such object" from "no such parent".
    /// By default no value is.
    fn is_absent(&self, value: &Self::Value) -> bool {
        let _ = value;
        false
    }
}

/// Why a Postgres load failed. Its `Display` names the cause (the
/// driver's or the pool's error) once; [`as_db_error`](Self::as_db_error)
/// and [`kind`](Self::kind) give it back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgError {
    /// No connection could be had from the pool in time, or opening one
    /// failed.
    #[error("no database connection available: {}", Chain(.0))]
    Pool(PoolError),
    /// The statement failed, or a row did not map to a key and value.
    #[error("database query failed: {}", Chain(.0))]
    Query(tokio_postgres::Error),
    /// A scoped load's statement failed, and the database's report quotes
    /// a value of the scope (a policy's failed cast of a setting, say):
    /// its `Display` gives the severity and SQLSTATE, not the message, so
    /// the value reaches no log. [`as_db_error`](Self::as_db_error) still
    /// gives the whole report back, value included.
    #[error("database query failed: {0}")]
    Withheld(Withheld),
    /// The scope cannot run on this loader: a setting the loader did not
    /// declare, or a role that row-level security does not apply to.
    #[error(transparent)]
    Scope(ScopeError),
}

/// A database report that quoted a value of a scope: its `Display` and
/// `Debug` give the severity and SQLSTATE, never the message.
pub struct Withheld(pub(crate) tokio_postgres::Error);

impl Withheld {
    /// The whole report, value included: handle it as a secret.
    pub fn as_db_error(&self) -> Option<&DbError> {
        self.0.as_db_error()
    }
}

impl fmt::Display for Withheld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_db_error() {
            Some(db) => write!(
                f,
                "{} (SQLSTATE {}): the message is withheld, since it quotes a value of the scope",
                db.severity(),
                db.code().code()
            ),
            None => write!(f, "{}", self.0),
        }
    }
}

impl fmt::Debug for Withheld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let code = self.0.as_db_error().map(|db| db.code().code());
        f.debug_struct("Withheld")
            .field("code", &code)
            .finish_non_exhaustive()
    }
}

impl PgError {
    /// Whether the pool had no free connection within its wait timeout: the
    /// database is saturated, and the caller should shed load.
    pub fn is_pool_timeout(&self) -> bool {
        matches!(
            self,
            PgError::Pool(PoolError::Timeout(deadpool_postgres::TimeoutType::Wait))
        )
    }

    /// Whether running the same work again may succeed: the pool had no
    /// connection free in time ([`is_pool_timeout`](Self::is_pool_timeout)),
    /// or the failure's [kind](Self::kind) is
    /// [retryable](DbErrorKind::is_retryable): a lost or refusing node, a
    /// serialization failure or deadlock, too many connections. False for
    /// rows the database refused, syntax and permission errors.
    ///
    /// A [`PgLoader`] has already retried a lost node once by itself.
    pub fn is_retryable(&self) -> bool {
        match self {
            PgError::Pool(e) => pool_error_is_retryable(e),
            PgError::Query(e) | PgError::Withheld(Withheld(e)) => super::classify(e).is_retryable(),
            PgError::Scope(_) => false,
        }
    }

    /// Whether the server cancelled the statement because it ran past
    /// `statement_timeout` (SQLSTATE 57014): a deadline, not a failure.
    pub fn is_statement_timeout(&self) -> bool {
        self.kind() == DbErrorKind::StatementTimeout
    }

    /// The kind of the failure, as [`classify`](super::classify) sorts
    /// it. A pool that could not open a connection in time (or at all)
    /// is [`DbErrorKind::Unavailable`]; one that had none free within its
    /// wait timeout is [`DbErrorKind::Other`] (see
    /// [`is_pool_timeout`](Self::is_pool_timeout)).
    pub fn kind(&self) -> DbErrorKind {
        match self {
            PgError::Query(e)
            | PgError::Withheld(Withheld(e))
            | PgError::Pool(PoolError::Backend(e)) => super::classify(e),
            PgError::Pool(PoolError::Timeout(deadpool_postgres::TimeoutType::Wait)) => {
                DbErrorKind::Other
            }
            PgError::Pool(PoolError::Timeout(_)) => DbErrorKind::Unavailable,
            PgError::Pool(_) | PgError::Scope(_) => DbErrorKind::Other,
        }
    }

    /// The server's error report, if the server returned one. For
    /// [`Withheld`](Self::Withheld), the whole report, with the scope's
    /// value its `Display` leaves out: handle it as a secret.
    pub fn as_db_error(&self) -> Option<&DbError> {
        match self {
            PgError::Query(e) | PgError::Withheld(Withheld(e)) => e.as_db_error(),
            PgError::Pool(PoolError::Backend(e)) => e.as_db_error(),
            PgError::Pool(_) | PgError::Scope(_) => None,
        }
    }

    /// Why the scope was refused, if it was.
    pub fn as_scope_error(&self) -> Option<&ScopeError> {
        match self {
            PgError::Scope(e) => Some(e),
            _ => None,
        }
    }
}

impl Classify for PgError {
    fn kind(&self) -> DbErrorKind {
        PgError::kind(self)
    }

    fn is_retryable(&self) -> bool {
        PgError::is_retryable(self)
    }
}

/// [`PgError::is_retryable`] for a pool's error: a wait timeout (the pool
/// was saturated), a create or recycle timeout, or a connection refused in a
/// retryable way.
pub(crate) fn pool_error_is_retryable(e: &PoolError) -> bool {
    match e {
        PoolError::Timeout(_) => true,
        PoolError::Backend(e) => super::classify(e).is_retryable(),
        _ => false,
    }
}

impl From<PoolError> for PgError {
    fn from(e: PoolError) -> Self {
        PgError::Pool(e)
    }
}

impl From<tokio_postgres::Error> for PgError {
    fn from(e: tokio_postgres::Error) -> Self {
        PgError::Query(e)
    }
}

/// Runs a [`BatchQuery`] on a connection pool; a [`Loader`] for a
/// [`Batcher`](crate::Batcher).
pub struct PgLoader<Q> {
    pool: Pool,
    query: Arc<Queries<Q>>,
}

/// The query, its two statements and how they are sent, shared by the
/// loader's clones (and the same loader on other pools).
struct Queries<Q> {
    query: Q,
    batch: Sql,
    single: Sql,
    statements: Statements,
}

impl<Q> Clone for PgLoader<Q> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            query: Arc::clone(&self.query),
        }
    }
}

impl<Q> fmt::Debug for PgLoader<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgLoader")
            .field("pool", &self.pool.status())
            .finish_non_exhaustive()
    }
}

impl<Q: BatchQuery> PgLoader<Q> {
    /// A loader running `query` on connections from `pool`, with prepared
    /// statements cached per connection.
    pub fn new(pool: Pool, query: Q) -> Self {
        Self::with_statements(pool, query, Statements::default())
    }

    /// A loader running `query` on connections from `pool`, sending its
    /// statements as `statements` say: unnamed through a transaction-mode
    /// pooler (see [`StatementMode`](super::StatementMode)).
    pub fn with_statements(pool: Pool, query: Q, statements: Statements) -> Self {
        Self {
            pool,
            query: Arc::new(Queries {
                batch: Sql::new(query.batch_sql()),
                single: Sql::new(query.single_sql()),
                query,
                statements,
            }),
        }
    }

    /// How this loader sends its statements.
    pub fn statements(&self) -> Statements {
        self.query.statements
    }

    /// The same query on another pool (a read replica's, say), sharing
    /// the query rather than copying it.
    #[must_use]
    pub fn with_pool(&self, pool: Pool) -> Self {
        Self {
            pool,
            ..self.clone()
        }
    }

    /// The pool the loader draws connections from.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The query this loader runs.
    pub fn query(&self) -> &Q {
        &self.query.query
    }

    /// Looks up one key with the single-key statement: one round trip per
    /// key, no batching.
    ///
    /// # Errors
    ///
    /// [`PgError`] when no connection is available or the statement fails.
    pub async fn load_one(&self, key: &Q::Key) -> Result<Option<Q::Value>, PgError> {
        self.load_one_as(key, None).await
    }

    /// [`load_one`](Self::load_one), in a scope's transaction if `start`
    /// is given.
    pub(super) async fn load_one_as(
        &self,
        key: &Q::Key,
        start: Option<Start<'_>>,
    ) -> Result<Option<Q::Value>, PgError> {
        let q = &*self.query;
        let params = q.query.single_params(key);
        let rows = self.run(&q.single, &as_refs(&params), start).await?;
        match rows.first() {
            Some(row) => Ok(Some(q.query.map_row(row)?.1)),
            None => Ok(None),
        }
    }

    /// Runs `sql` on a leased connection, in a scope's transaction if
    /// `start` is given; if the node turned out to be gone or no longer a
    /// primary, once more on a new connection (a read is safe to repeat;
    /// the pool has discarded the old node's connections, so the new one
    /// goes to whichever node its connector finds).
    pub(super) async fn run(
        &self,
        sql: &Sql,
        params: &[&(dyn ToSql + Sync)],
        start: Option<Start<'_>>,
    ) -> Result<Vec<Row>, PgError> {
        again_if_lost("reading", true, || async {
            let mut lease = super::Lease::get(&self.pool).await?;
            let rows = self
                .query
                .statements
                .query_as(&mut lease, sql, params, start)
                .await;
            lease.settle(&rows);
            Ok(rows?)
        })
        .await
    }

    /// Runs the batch statement for `keys` (the single-key one for one
    /// key), in a scope's transaction if `start` is given, and maps each
    /// row. A row that does not map fails its own key if
    /// [`row_key`](BatchQuery::row_key) can read it, else the keys left
    /// without a value: not the batch, and never a key read as missing
    /// that had a row.
    pub(super) async fn load_keys(
        &self,
        keys: Vec<Q::Key>,
        start: Option<Start<'_>>,
    ) -> Result<Loaded<Q::Key, Q::Value>, PgError> {
        let q = &*self.query;
        let (sql, params) = match keys.as_slice() {
            [key] => (&q.single, q.query.single_params(key)),
            _ => (&q.batch, q.query.batch_params(&keys)),
        };
        let rows = self.run(sql, &as_refs(&params), start).await?;
        let mut loaded = Loaded::with_capacity(rows.len());
        let mut bad = BadRows::default();
        for row in &rows {
            match q.query.map_row(row) {
                Ok((key, value)) => {
                    loaded.insert(key, value);
                }
                Err(e) => bad.add(&mut loaded, q.query.row_key(row), e),
            }
        }
        bad.settle(&mut loaded, PgError::Query);
        Ok(loaded)
    }
}

pub(crate) fn as_refs<'p>(params: &'p Params<'_>) -> Vec<&'p (dyn ToSql + Sync)> {
    params
        .iter()
        .map(|p| p.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

impl<Q: BatchQuery> Loader<Q::Key, Q::Value> for PgLoader<Q> {
    type Error = PgError;

    /// Runs [`batch_sql`](BatchQuery::batch_sql) for the keys, or
    /// [`single_sql`](BatchQuery::single_sql) for a batch of one: batches of
    /// one are what a lightly loaded batcher sends, and a plain equality
    /// costs the server less than `= ANY` over a one-element array. A row
    /// that does not map fails the keys left without a value, not the
    /// batch: the others get their values.
    async fn load(&self, keys: Vec<Q::Key>) -> Result<Loaded<Q::Key, Q::Value>, PgError> {
        self.load_keys(keys, None).await
    }

    fn is_absent(&self, value: &Q::Value) -> bool {
        self.query.query.is_absent(value)
    }
}
