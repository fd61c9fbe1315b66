//! A [`Loader`] that runs one prepared statement per batch.

use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::Arc;

use deadpool_postgres::{Pool, PoolError};
use tokio_postgres::error::DbError;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::error::DbErrorKind;
use super::statements::{Sql, Start, Statements};
use crate::db::{again_if_lost, Classify, List, Page, PageKey, PageSql, Paged, ScopeError, Single};
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
    /// A scoped load's statement failed: the database's report as
    /// [`Withheld`] shows it (its message, unless it quotes a value of the
    /// scope; never the parts where Postgres quotes what it was given), so
    /// no value reaches a log. [`as_db_error`](Self::as_db_error) still
    /// gives the whole report back.
    #[error("database query failed: {0}")]
    Withheld(Withheld),
    /// The scope cannot run on this loader: a setting the loader did not
    /// declare, or a role that row-level security does not apply to.
    #[error(transparent)]
    Scope(ScopeError),
}

/// A database report of a scoped load, as the scope's callers and logs may
/// see it: its severity, SQLSTATE and message, and never its detail, hint,
/// context or internal query, where Postgres quotes pieces of what it was
/// given (a window of a JSON claim it failed to parse, the text of a
/// dynamic statement). The message too is withheld when it quotes a value
/// of the scope (a policy's failed cast of a setting).
pub struct Withheld {
    pub(crate) error: tokio_postgres::Error,
    /// Whether the message may be shown: it quotes no value of the scope.
    pub(crate) message_shown: bool,
}

impl Withheld {
    /// The whole report, value included: handle it as a secret.
    pub fn as_db_error(&self) -> Option<&DbError> {
        self.error.as_db_error()
    }
}

impl fmt::Display for Withheld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.error.as_db_error() {
            Some(db) if self.message_shown => write!(
                f,
                "{}: {} (SQLSTATE {})",
                db.severity(),
                db.message(),
                db.code().code()
            ),
            Some(db) => write!(
                f,
                "{} (SQLSTATE {}): the message is withheld, since it quotes a value of the scope",
                db.severity(),
                db.code().code()
            ),
            None => write!(f, "{}", self.error),
        }
    }
}

impl fmt::Debug for Withheld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let db = self.error.as_db_error();
        f.debug_struct("Withheld")
            .field("code", &db.map(|db| db.code().code()))
            .field(
                "message",
                &db.filter(|_| self.message_shown).map(DbError::message),
            )
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
            PgError::Query(e) | PgError::Withheld(Withheld { error: e, .. }) => {
                super::classify(e).is_retryable()
            }
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
            | PgError::Withheld(Withheld { error: e, .. })
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
            PgError::Query(e) | PgError::Withheld(Withheld { error: e, .. }) => e.as_db_error(),
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

/// How to read pages of each parent's children (see [`PageSql`]): the
/// statement, the parent's type, and how a row's columns (from position 0,
/// in [`PageSqlBuilder::columns`](crate::db::PageSqlBuilder::columns)'s
/// order) map to an item. Run by [`PgLoader::pages`].
///
/// ```
/// use pgbatch::pg::{PageQuery, PageSql, PageError};
/// use pgbatch::pg::tokio_postgres::{Error, Row};
///
/// /// `reviews(id bigint PRIMARY KEY, book_id bigint, stars int, created_at timestamptz)`.
/// struct ReviewsOfBook(PageSql);
///
/// impl ReviewsOfBook {
///     fn new() -> Result<Self, PageError> {
///         Ok(Self(
///             PageSql::builder("reviews")
///                 .parent("book_id", "bigint")
///                 .columns(["id", "stars"])
///                 .order_by("created_at", "timestamptz")
///                 .order_by("id", "bigint")
///                 .build()?,
///         ))
///     }
/// }
///
/// impl PageQuery for ReviewsOfBook {
///     type Parent = i64;
///     type Value = (i64, i32);
///
///     fn page_sql(&self) -> &PageSql {
///         &self.0
///     }
///     fn map_row(&self, row: &Row) -> Result<(i64, i32), Error> {
///         Ok((row.try_get(0)?, row.try_get(1)?))
///     }
/// }
/// ```
pub trait PageQuery: Send + Sync + 'static {
    /// The parent column's type (bound as an array of them).
    type Parent: ToSql + Clone + Eq + Hash + fmt::Debug + Send + Sync + 'static;
    /// What an item maps to.
    type Value: Clone + Send + Sync + 'static;

    /// The statement.
    fn page_sql(&self) -> &PageSql;
    /// The item of a row, read from its columns at positions 0 and on.
    ///
    /// # Errors
    ///
    /// When a column is missing or has an unexpected type.
    fn map_row(&self, row: &Row) -> Result<Self::Value, tokio_postgres::Error>;
}

/// Runs a [`BatchQuery`] (or, [`Paged`], a [`PageQuery`]) on a connection
/// pool; a [`Loader`] for a [`Batcher`](crate::Batcher).
///
/// `R` says how rows answer keys: [`Single`] (made by [`new`](Self::new):
/// a key's row), [`List`] (made by [`lists`](Self::lists): every row of a
/// key, in the statement's order, an empty list for none), or [`Paged`]
/// (made by [`pages`](PgLoader::pages): a page of a parent's children).
pub struct PgLoader<Q, R = Single> {
    pool: Pool,
    query: Arc<Queries<Q>>,
    rows: PhantomData<fn() -> R>,
}

/// The query, its two statements and how they are sent, shared by the
/// loader's clones (and the same loader on other pools).
struct Queries<Q> {
    query: Q,
    batch: Sql,
    single: Sql,
    statements: Statements,
}

impl<Q, R> Clone for PgLoader<Q, R> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            query: Arc::clone(&self.query),
            rows: PhantomData,
        }
    }
}

impl<Q, R> fmt::Debug for PgLoader<Q, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgLoader")
            .field("pool", &self.pool.status())
            .field("rows", &std::any::type_name::<R>())
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
        let (batch, single) = (Sql::new(query.batch_sql()), Sql::new(query.single_sql()));
        Self::made(pool, query, batch, single, statements)
    }

    /// This loader, answering each key with all of its rows' values, in
    /// the order the statement returns them (an empty list for a key with
    /// none): a parent's children, say, with `ORDER BY parent_id, ...` in
    /// the statement. A row that does not map fails its own key's list
    /// (with [`row_key`](BatchQuery::row_key)).
    #[must_use]
    pub fn lists(self) -> PgLoader<Q, List> {
        PgLoader {
            pool: self.pool,
            query: self.query,
            rows: PhantomData,
        }
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
}

impl<Q: PageQuery> PgLoader<Q, Paged> {
    /// A loader of pages of each parent's children, running `query` on
    /// connections from `pool`, with prepared statements cached per
    /// connection. Its keys are [`PageKey`]s, from the query's
    /// [`PageSql::key`]; keys of any size and cursor share a load.
    pub fn pages(pool: Pool, query: Q) -> Self {
        Self::pages_with_statements(pool, query, Statements::default())
    }

    /// [`pages`](Self::pages), sending its statements as `statements` say.
    pub fn pages_with_statements(pool: Pool, query: Q, statements: Statements) -> Self {
        let sql = Sql::new(query.page_sql().sql());
        let single = Sql::new(query.page_sql().sql());
        Self::made(pool, query, sql, single, statements)
    }

    /// Each key's page. A key another page statement made fails alone
    /// ([`PageError::OtherStatement`]). A load whose statement the
    /// database refuses as a data error (a forged cursor whose value does
    /// not cast) is run again key by key, so only that key fails; each
    /// such key's error as `shown` makes it (a scope's withheld).
    pub(super) async fn load_pages(
        &self,
        keys: Vec<PageKey<Q::Parent>>,
        start: Option<Start<'_>>,
        shown: impl Fn(PgError) -> PgError,
    ) -> Result<Loaded<PageKey<Q::Parent>, Page<Q::Value>>, PgError> {
        match self.load_with(keys.clone(), start).await {
            Err(e) if self.is_data_fault(&e, &keys) => {
                Ok(self.pages_one_by_one(keys, start, shown).await)
            }
            done => done.map_err(shown),
        }
    }

    /// Whether a load of `keys` failed as a data error another load of
    /// fewer of them may not meet.
    pub(super) fn is_data_fault(&self, e: &PgError, keys: &[PageKey<Q::Parent>]) -> bool {
        let page = self.query.query.page_sql();
        e.kind() == DbErrorKind::OtherRowFault && keys.iter().filter(|k| page.made(k)).count() > 1
    }

    /// `keys`' pages, each in a statement of its own: only a key at fault
    /// fails, with its error as `shown` makes it.
    pub(super) async fn pages_one_by_one(
        &self,
        keys: Vec<PageKey<Q::Parent>>,
        start: Option<Start<'_>>,
        shown: impl Fn(PgError) -> PgError,
    ) -> Loaded<PageKey<Q::Parent>, Page<Q::Value>> {
        let mut loaded = Loaded::with_capacity(keys.len());
        for key in keys {
            match self.load_with(vec![key.clone()], start).await {
                Ok(mut one) => match one.take(&key) {
                    Ok(Some(page)) => {
                        loaded.insert(key, page);
                    }
                    Ok(None) => {}
                    Err(e) => loaded.fail_shared(key, e),
                },
                Err(e) => loaded.fail(key, shown(e)),
            }
        }
        loaded
    }
}

impl<Q, R> PgLoader<Q, R> {
    fn made(pool: Pool, query: Q, batch: Sql, single: Sql, statements: Statements) -> Self {
        Self {
            pool,
            query: Arc::new(Queries {
                batch,
                single,
                query,
                statements,
            }),
            rows: PhantomData,
        }
    }

    /// Its query, its batch statement and its single-key one.
    pub(super) fn queries(&self) -> (&Q, &Sql, &Sql) {
        (&self.query.query, &self.query.batch, &self.query.single)
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
        self.load_with(keys, None).await
    }

    fn is_absent(&self, value: &Q::Value) -> bool {
        self.query.query.is_absent(value)
    }
}

/// Every row of each key, in the statement's order.
impl<Q: BatchQuery> Loader<Q::Key, Vec<Q::Value>> for PgLoader<Q, List> {
    type Error = PgError;

    async fn load(&self, keys: Vec<Q::Key>) -> Result<Loaded<Q::Key, Vec<Q::Value>>, PgError> {
        self.load_with(keys, None).await
    }

    /// An empty list counts as "not found" in the statistics.
    fn is_absent(&self, value: &Vec<Q::Value>) -> bool {
        value.is_empty()
    }
}

/// Each key's page of its parent's children.
impl<Q: PageQuery> Loader<PageKey<Q::Parent>, Page<Q::Value>> for PgLoader<Q, Paged> {
    type Error = PgError;

    async fn load(
        &self,
        keys: Vec<PageKey<Q::Parent>>,
    ) -> Result<Loaded<PageKey<Q::Parent>, Page<Q::Value>>, PgError> {
        self.load_pages(keys, None, |e| e).await
    }

    /// An empty page counts as "not found" in the statistics.
    fn is_absent(&self, value: &Page<Q::Value>) -> bool {
        value.items.is_empty()
    }
}
