//! A [`Loader`] that runs one sqlx query per batch.

use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use ::sqlx::pool::PoolConnection;
use ::sqlx::postgres::{PgArguments, PgConnection, PgHasArrayType, PgPool, PgRow, Postgres};
use ::sqlx::query::Query;
use ::sqlx::{Connection, Encode, Executor, FromRow, Type};

use super::prologue::Start;
use crate::db::{
    again_if_lost, gather_lists, gather_pages, BadRows, DbErrorKind, List, Page, PageError,
    PageKey, PageSql, Paged, Single, StatementMode, CLEAN_START,
};
use crate::{Loaded, Loader};

/// A Postgres query whose parameters are bound one by one with
/// `bind`: what sqlx's `sqlx::query(sql)` returns for Postgres, and what
/// a [`BatchQuery`] binds its keys to.
pub type PgQuery<'q> = Query<'q, Postgres, PgArguments>;

/// How to look keys up in Postgres with sqlx: the statement for a batch of
/// keys, how the keys are bound to it, and how a row maps to a key and its
/// value.
///
/// ```
/// use pgbatch::sqlx::{BatchQuery, PgQuery};
///
/// /// `random_read_test(pk text PRIMARY KEY, payload text NOT NULL)`.
/// struct Payloads;
///
/// impl BatchQuery for Payloads {
///     type Key = String;
///     type Row = (String, String);
///     type Value = String;
///
///     fn batch_sql(&self) -> &str {
///         "SELECT pk, payload FROM random_read_test WHERE pk = ANY($1)"
///     }
///     fn bind_batch<'q>(&self, query: PgQuery<'q>, keys: &'q [String]) -> PgQuery<'q> {
///         query.bind(keys)
///     }
///     fn map_row(&self, (pk, payload): (String, String)) -> (String, String) {
///         (pk, payload)
///     }
///
///     // Optional: a plain equality for a batch of one.
///     fn single_sql(&self) -> &str {
///         "SELECT pk, payload FROM random_read_test WHERE pk = $1"
///     }
///     fn bind_single<'q>(&self, query: PgQuery<'q>, key: &'q String) -> PgQuery<'q> {
///         query.bind(key)
///     }
/// }
/// ```
///
/// Bind the keys as one array (`= ANY($1)`, or one array per column and
/// `unnest($1, $2)` for a composite key) rather than building
/// `IN ($1, $2, ...)`: an `IN` list is a different statement for every
/// batch size, which defeats the statement cache.
pub trait BatchQuery: Send + Sync + 'static {
    /// What is looked up. `Debug`, so that an error about a key's row can
    /// name the key.
    type Key: Clone + Eq + Hash + fmt::Debug + Send + Sync + 'static;
    /// What a returned row is read into: a tuple such as `(i64, String)`,
    /// or a type of yours implementing `FromRow` (by hand, or derived with
    /// sqlx's `derive` feature).
    type Row: for<'r> FromRow<'r, PgRow> + Send + Unpin + 'static;
    /// What a key maps to.
    type Value: Clone + Send + Sync + 'static;

    /// The statement for many keys. Every row it returns must map to one of
    /// the keys.
    fn batch_sql(&self) -> &str;
    /// Binds `keys` to `query`, a query of [`batch_sql`](Self::batch_sql):
    /// as one array (`query.bind(keys)`), or one array per column of a
    /// composite key.
    fn bind_batch<'q>(&self, query: PgQuery<'q>, keys: &'q [Self::Key]) -> PgQuery<'q>;
    /// The key and value of a row returned by either statement.
    fn map_row(&self, row: Self::Row) -> (Self::Key, Self::Value);

    /// The statement for one key: what [`SqlxLoader::load_one`] runs, and
    /// what the loader runs for a batch of one. It must return the same
    /// rows as [`batch_sql`](Self::batch_sql) would for that key. By
    /// default it is `batch_sql`, with a one-element array.
    fn single_sql(&self) -> &str {
        self.batch_sql()
    }
    /// Binds `key` to `query`, a query of
    /// [`single_sql`](Self::single_sql). By default, as
    /// [`bind_batch`](Self::bind_batch) binds a batch of that one key.
    fn bind_single<'q>(&self, query: PgQuery<'q>, key: &'q Self::Key) -> PgQuery<'q> {
        self.bind_batch(query, std::slice::from_ref(key))
    }

    /// The key of a row that could not be read into
    /// [`Row`](Self::Row), read on its own
    /// (`sqlx::Row::try_get(row, 0).ok()`), so that the row fails its own
    /// key alone, with an error naming the key and the column. By default
    /// `None`: such a row then fails every key of its batch left without a
    /// value, since which key it was cannot be told (and none of them may
    /// read as "not found").
    fn row_key(&self, row: &PgRow) -> Option<Self::Key> {
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

/// Runs a [`BatchQuery`] on a sqlx `PgPool`; a [`Loader`] for a
/// [`Batcher`](crate::Batcher).
///
/// A batch of one key runs [`single_sql`](BatchQuery::single_sql), a larger
/// one [`batch_sql`](BatchQuery::batch_sql); a batch that failed because
/// its connection was lost ([`DbErrorKind::Unavailable`](crate::db::DbErrorKind::Unavailable)) runs once more on
/// another connection.
///
/// # Cancel safety
///
/// A load dropped before it ends (a batcher's timeout) leaves its
/// connection to sqlx's pool, which tests it before reuse; an
/// [`Unnamed`](StatementMode::Unnamed) load's transaction is rolled back.
pub struct SqlxLoader<Q, R = Single> {
    pool: PgPool,
    inner: Arc<Inner<Q>>,
    acquire_timeout: Duration,
    rows: PhantomData<fn() -> R>,
}

/// How long a load waits for a connection by default: well inside the
/// batcher's default 5 s deadline, so a load that gets none fails with a
/// retryable error its callers see, not with their own deadline.
pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long the loader's own connection attempt may take when it asks why
/// the pool had none to give.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// The query and how it is sent, shared by the loader's clones (and the
/// same loader on other pools).
struct Inner<Q> {
    query: Q,
    mode: StatementMode,
}

impl<Q, R> Clone for SqlxLoader<Q, R> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            inner: Arc::clone(&self.inner),
            acquire_timeout: self.acquire_timeout,
            rows: PhantomData,
        }
    }
}

impl<Q, R> fmt::Debug for SqlxLoader<Q, R> {
    // Not the pool's own `Debug`: the loader's is for logs, and the
    // pool's size says what matters there.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxLoader")
            .field("pool_size", &self.pool.size())
            .field("pool_idle", &self.pool.num_idle())
            .field("pool_closed", &self.pool.is_closed())
            .field("mode", &self.inner.mode)
            .field("rows", &std::any::type_name::<R>())
            .finish_non_exhaustive()
    }
}

impl<Q: BatchQuery> SqlxLoader<Q> {
    /// A loader running `query` on connections from `pool`, as statements
    /// prepared and cached per connection.
    pub fn new(pool: PgPool, query: Q) -> Self {
        Self::with_statement_mode(pool, query, StatementMode::default())
    }

    /// A loader running `query` on connections from `pool`, sending its
    /// statements as `mode` says: [`StatementMode::Unnamed`] through a
    /// transaction-mode pooler.
    pub fn with_statement_mode(pool: PgPool, query: Q, mode: StatementMode) -> Self {
        Self::made(pool, query, mode)
    }

    /// This loader, answering each key with all of its rows' values, in
    /// the order the statement returns them (an empty list for a key with
    /// none): a parent's children, say, with `ORDER BY parent_id, ...` in
    /// the statement. A row that does not map fails its own key's list
    /// (with [`row_key`](BatchQuery::row_key)).
    #[must_use]
    pub fn lists(self) -> SqlxLoader<Q, List> {
        SqlxLoader {
            pool: self.pool,
            inner: self.inner,
            acquire_timeout: self.acquire_timeout,
            rows: PhantomData,
        }
    }
}

impl<Q, R> SqlxLoader<Q, R> {
    fn made(pool: PgPool, query: Q, mode: StatementMode) -> Self {
        Self {
            pool,
            inner: Arc::new(Inner { query, mode }),
            acquire_timeout: DEFAULT_ACQUIRE_TIMEOUT,
            rows: PhantomData,
        }
    }

    /// How this loader sends its statements.
    pub fn statement_mode(&self) -> StatementMode {
        self.inner.mode
    }

    /// The longest a load waits for a connection, whatever the pool's own
    /// `acquire_timeout` (sqlx's default is 30 s, longer than a batcher's
    /// deadline). Default [`DEFAULT_ACQUIRE_TIMEOUT`], 1 s. Keep it below
    /// the batcher's [`timeout`](crate::BatcherBuilder::timeout): a load
    /// that gets no connection then fails with a retryable error that says
    /// why (the database refused or did not answer a connection, or the
    /// pool is saturated: `PoolTimedOut`), where waiting longer would end
    /// in the callers' own deadline, which is not retryable.
    #[must_use]
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// The same query on another pool (a read replica's, say), sharing
    /// the query rather than copying it.
    #[must_use]
    pub fn with_pool(&self, pool: PgPool) -> Self {
        Self {
            pool,
            ..self.clone()
        }
    }

    /// The pool the loader draws connections from.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The query this loader runs.
    pub fn query(&self) -> &Q {
        &self.inner.query
    }
}

impl<Q: BatchQuery> SqlxLoader<Q> {
    /// Looks up one key with the single-key statement: one round trip per
    /// key (with [`StatementMode::Prepared`]), no batching.
    ///
    /// # Errors
    ///
    /// When no connection is available, the statement fails, or a row
    /// cannot be read into [`BatchQuery::Row`].
    pub async fn load_one(&self, key: &Q::Key) -> Result<Option<Q::Value>, ::sqlx::Error> {
        self.load_one_as(key, None).await
    }

    /// [`load_one`](Self::load_one), in a scope's transaction if `start`
    /// is given.
    pub(super) async fn load_one_as(
        &self,
        key: &Q::Key,
        start: Option<&Start<'_>>,
    ) -> Result<Option<Q::Value>, ::sqlx::Error> {
        let keys = std::slice::from_ref(key);
        let rows = self.fetch(|| self.statement(keys), start).await?;
        match rows.first() {
            Some(row) => Ok(Some(self.map(row)?.1)),
            None => Ok(None),
        }
    }
}

impl<Q, R> SqlxLoader<Q, R> {
    /// Runs the statement for `keys`, in a scope's transaction if `start`
    /// is given; if the connection was lost, once more: a read is safe to
    /// repeat, and the pool does not hand out the lost connection again
    /// (it tests a connection coming back).
    async fn fetch<'q>(
        &'q self,
        statement: impl Fn() -> PgQuery<'q> + Sync,
        start: Option<&Start<'_>>,
    ) -> Result<Vec<PgRow>, ::sqlx::Error> {
        // `Executor::fetch_all` returns a boxed `Send` future, so the
        // loader's future is `Send` without the compiler having to prove
        // it through sqlx's generic executors.
        again_if_lost("reading", true, || async {
            let mut conn = acquire(&self.pool, self.acquire_timeout).await?;
            match (self.inner.mode, start) {
                (_, Some(start)) => self.fetch_as(conn, statement(), start).await,
                (StatementMode::Prepared, None) => {
                    Executor::fetch_all(&mut *conn, statement()).await
                }
                (StatementMode::Unnamed, None) => {
                    // The transaction keeps the statement's parse and its
                    // execution on one server connection behind a pooler.
                    // A failure drops `tx`, which rolls it back.
                    let mut tx = Connection::begin(&mut *conn).await?;
                    let rows = Executor::fetch_all(&mut *tx, statement()).await?;
                    tx.commit().await?;
                    Ok(rows)
                }
            }
        })
        .await
    }

    /// Runs the statement for `keys` in a transaction of its own that
    /// starts as the scope (`start`: its role checked the first time, then
    /// the prologue), on a connection that goes back to the pool only once
    /// that transaction has ended: committed, or rolled back after a
    /// failure. Otherwise (a load dropped at its deadline, a connection
    /// that failed) it is closed, so nothing of the scope can reach the
    /// pool's next user.
    ///
    /// Not sqlx's `begin_with`: sqlx counts a transaction only once its
    /// first statement succeeded, so a role the database refused left the
    /// connection inside the failed transaction, and the pool handed it on
    /// (the next load got "current transaction is aborted").
    async fn fetch_as(
        &self,
        conn: PoolConnection<Postgres>,
        statement: PgQuery<'_>,
        start: &Start<'_>,
    ) -> Result<Vec<PgRow>, ::sqlx::Error> {
        let mut conn = CloseUnlessEnded(Some(conn));
        let c: &mut PgConnection = conn.0.as_mut().expect("held until released");
        let mode = self.inner.mode;
        let done = async {
            // One round trip: `BEGIN` and the clean start, as a simple
            // query (no value in it).
            let begin = format!("BEGIN; {CLEAN_START}");
            Executor::execute(&mut *c, ::sqlx::raw_sql(&begin)).await?;
            start.run(&mut *c, mode).await?;
            let rows = Executor::fetch_all(&mut *c, statement).await?;
            Executor::execute(&mut *c, ::sqlx::raw_sql("COMMIT")).await?;
            Ok(rows)
        }
        .await;
        if done.is_err()
            && Executor::execute(&mut *c, ::sqlx::raw_sql("ROLLBACK"))
                .await
                .is_err()
        {
            return done; // the connection is closed, not pooled
        }
        // Its transaction ended: back to the pool.
        drop(conn.0.take());
        done
    }
}

impl<Q: BatchQuery, R> SqlxLoader<Q, R> {
    /// The statement for `keys` with the keys bound: the single-key one
    /// for one key.
    fn statement<'a>(&'a self, keys: &'a [Q::Key]) -> PgQuery<'a> {
        let q = &self.inner.query;
        let query = match keys {
            [key] => q.bind_single(::sqlx::query::<Postgres>(q.single_sql()), key),
            _ => q.bind_batch(::sqlx::query::<Postgres>(q.batch_sql()), keys),
        };
        query.persistent(self.inner.mode == StatementMode::Prepared)
    }

    fn map(&self, row: &PgRow) -> Result<(Q::Key, Q::Value), ::sqlx::Error> {
        let row = <Q::Row as FromRow<'_, PgRow>>::from_row(row)?;
        Ok(self.inner.query.map_row(row))
    }
}

/// A connection from `pool` within `timeout`, whatever the pool's own
/// `acquire_timeout`.
///
/// # Errors
///
/// sqlx's error; when none came in time, why (see [`why_no_connection`]).
pub(super) async fn acquire(
    pool: &PgPool,
    timeout: Duration,
) -> Result<PoolConnection<Postgres>, ::sqlx::Error> {
    match tokio::time::timeout(timeout, pool.acquire()).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(::sqlx::Error::PoolTimedOut)) | Err(_) => Err(why_no_connection(pool).await),
        Ok(Err(e)) => Err(e),
    }
}

/// Why `pool` had no connection to give in time. With none open at all,
/// sqlx was retrying its connects until its own timeout, and only reports
/// `PoolTimedOut`: a connect of the loader's own then says why (refused,
/// unanswered, a server starting up or refusing the login), as an error
/// [`classify`](super::classify) sorts as it would the pool's. With
/// connections open, the pool is saturated: `PoolTimedOut`.
async fn why_no_connection(pool: &PgPool) -> ::sqlx::Error {
    if pool.size() > 0 || pool.is_closed() {
        return ::sqlx::Error::PoolTimedOut;
    }
    let options = pool.connect_options();
    match tokio::time::timeout(PROBE_TIMEOUT, PgConnection::connect_with(&options)).await {
        Ok(Err(refused)) => refused,
        Ok(Ok(probe)) => {
            // The database answers again: the pool will connect.
            let _ = probe.close().await;
            ::sqlx::Error::PoolTimedOut
        }
        Err(_) => ::sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the database did not answer a connection attempt",
        )),
    }
}

/// A pooled connection inside a scoped transaction: closed when dropped,
/// unless taken out once the transaction ended.
struct CloseUnlessEnded(Option<PoolConnection<Postgres>>);

impl Drop for CloseUnlessEnded {
    fn drop(&mut self) {
        if let Some(mut conn) = self.0.take() {
            conn.close_on_drop();
        }
    }
}

impl<Q: BatchQuery> SqlxLoader<Q> {
    /// Runs the statement for `keys`, in a scope's transaction if `start`
    /// is given, and maps each row. A row that does not read into
    /// [`BatchQuery::Row`] fails its own key if
    /// [`row_key`](BatchQuery::row_key) can read it, else the keys left
    /// without a value: not the batch, and never a key read as missing
    /// that had a row.
    pub(super) async fn load_keys(
        &self,
        keys: Vec<Q::Key>,
        start: Option<&Start<'_>>,
    ) -> Result<Loaded<Q::Key, Q::Value>, ::sqlx::Error> {
        let rows = self.fetch(|| self.statement(&keys), start).await?;
        let mut loaded = Loaded::with_capacity(rows.len());
        let mut bad = BadRows::default();
        for row in &rows {
            match self.map(row) {
                Ok((key, value)) => {
                    loaded.insert(key, value);
                }
                Err(e) => bad.add(&mut loaded, self.inner.query.row_key(row), e),
            }
        }
        bad.settle(&mut loaded, |e| e);
        Ok(loaded)
    }
}

impl<Q: BatchQuery> Loader<Q::Key, Q::Value> for SqlxLoader<Q> {
    type Error = ::sqlx::Error;

    /// Runs [`batch_sql`](BatchQuery::batch_sql) for the keys, or
    /// [`single_sql`](BatchQuery::single_sql) for a batch of one: batches of
    /// one are what a lightly loaded batcher sends. A row that does not
    /// map fails the keys left without a value, not the batch.
    async fn load(&self, keys: Vec<Q::Key>) -> Result<Loaded<Q::Key, Q::Value>, ::sqlx::Error> {
        self.load_keys(keys, None).await
    }

    fn is_absent(&self, value: &Q::Value) -> bool {
        self.inner.query.is_absent(value)
    }
}

impl<Q: BatchQuery> SqlxLoader<Q, List> {
    /// Each key's list: every row of it, in the statement's order.
    pub(super) async fn load_lists(
        &self,
        keys: Vec<Q::Key>,
        start: Option<&Start<'_>>,
    ) -> Result<Loaded<Q::Key, Vec<Q::Value>>, ::sqlx::Error> {
        let rows = self.fetch(|| self.statement(&keys), start).await?;
        let q = &self.inner.query;
        let rows = rows
            .iter()
            .map(|row| self.map(row).map_err(|e| (q.row_key(row), e)));
        Ok(gather_lists(&keys, rows))
    }
}

/// Every row of each key, in the statement's order.
impl<Q: BatchQuery> Loader<Q::Key, Vec<Q::Value>> for SqlxLoader<Q, List> {
    type Error = ::sqlx::Error;

    async fn load(
        &self,
        keys: Vec<Q::Key>,
    ) -> Result<Loaded<Q::Key, Vec<Q::Value>>, ::sqlx::Error> {
        self.load_lists(keys, None).await
    }

    /// An empty list counts as "not found" in the statistics.
    fn is_absent(&self, value: &Vec<Q::Value>) -> bool {
        value.is_empty()
    }
}

/// How to read pages of each parent's children with sqlx (see
/// [`PageSql`]): the statement, the parent's type, and how a row (read
/// into [`Row`](Self::Row) from its columns at positions 0 and on, in
/// [`PageSqlBuilder::columns`](crate::db::PageSqlBuilder::columns)'s
/// order: a tuple, or your `FromRow` type) maps to an item. Run by
/// [`SqlxLoader::pages`].
///
/// ```
/// use pgbatch::sqlx::{PageQuery, PageSql, PageError};
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
///     type Row = (i64, i32);
///     type Value = (i64, i32);
///
///     fn page_sql(&self) -> &PageSql {
///         &self.0
///     }
///     fn map_row(&self, row: (i64, i32)) -> (i64, i32) {
///         row
///     }
/// }
/// ```
pub trait PageQuery: Send + Sync + 'static {
    /// The parent column's type (bound as an array of them).
    type Parent: for<'q> Encode<'q, Postgres>
        + Type<Postgres>
        + PgHasArrayType
        + Clone
        + Eq
        + Hash
        + fmt::Debug
        + Send
        + Sync
        + 'static;
    /// What a returned row is read into.
    type Row: for<'r> FromRow<'r, PgRow> + Send + Unpin + 'static;
    /// What an item maps to.
    type Value: Clone + Send + Sync + 'static;

    /// The statement.
    fn page_sql(&self) -> &PageSql;
    /// The item of a row.
    fn map_row(&self, row: Self::Row) -> Self::Value;
}

impl<Q: PageQuery> SqlxLoader<Q, Paged> {
    /// A loader of pages of each parent's children, running `query` on
    /// connections from `pool` as statements prepared and cached per
    /// connection. Its keys are [`PageKey`]s, from the query's
    /// [`PageSql::key`]; keys of any size and cursor share a load.
    pub fn pages(pool: PgPool, query: Q) -> Self {
        Self::pages_with_statement_mode(pool, query, StatementMode::default())
    }

    /// [`pages`](Self::pages), sending its statements as `mode` says.
    pub fn pages_with_statement_mode(pool: PgPool, query: Q, mode: StatementMode) -> Self {
        Self::made(pool, query, mode)
    }

    /// Each key's page. A key another page statement made fails alone
    /// ([`PageError::OtherStatement`]). A load whose statement the
    /// database refuses as a data error (a forged cursor whose value does
    /// not cast) is run again key by key, so only that key fails.
    pub(super) async fn load_pages(
        &self,
        keys: Vec<PageKey<Q::Parent>>,
        start: Option<&Start<'_>>,
    ) -> Result<Loaded<PageKey<Q::Parent>, Page<Q::Value>>, ::sqlx::Error> {
        let page = self.inner.query.page_sql();
        let (ours, others): (Vec<_>, Vec<_>) = keys.into_iter().partition(|k| page.made(k));
        let mut loaded = match self.pages_at_once(ours.clone(), start).await {
            Err(e) if ours.len() > 1 && super::classify(&e) == DbErrorKind::OtherRowFault => {
                let mut loaded = Loaded::with_capacity(ours.len());
                for key in ours {
                    match self.pages_at_once(vec![key.clone()], start).await {
                        Ok(mut one) => match one.take(&key) {
                            Ok(Some(page)) => {
                                loaded.insert(key, page);
                            }
                            Ok(None) => {}
                            Err(e) => loaded.fail_shared(key, e),
                        },
                        Err(e) => loaded.fail(key, e),
                    }
                }
                loaded
            }
            done => done?,
        };
        for key in others {
            loaded.fail(key, PageError::OtherStatement);
        }
        Ok(loaded)
    }

    /// `keys`' pages, in one statement.
    async fn pages_at_once(
        &self,
        keys: Vec<PageKey<Q::Parent>>,
        start: Option<&Start<'_>>,
    ) -> Result<Loaded<PageKey<Q::Parent>, Page<Q::Value>>, ::sqlx::Error> {
        if keys.is_empty() {
            return Ok(Loaded::new());
        }
        let q = &self.inner.query;
        let page = q.page_sql();
        let parents: Vec<Q::Parent> = keys.iter().map(|k| k.parent().clone()).collect();
        let (limits, afters) = page.bounds(&keys);
        let prepared = self.inner.mode == StatementMode::Prepared;
        let statement = || {
            let query = ::sqlx::query::<Postgres>(page.sql())
                .bind(&parents[..])
                .bind(&limits[..]);
            afters
                .iter()
                .fold(query, |query, after| query.bind(&after[..]))
                .persistent(prepared)
        };
        let rows = self.fetch(statement, start).await?;
        let at = page.value_columns();
        let mut read = Vec::with_capacity(rows.len());
        for row in &rows {
            // The key's position first: a row whose value does not read
            // still fails its own key.
            let position: i64 = ::sqlx::Row::try_get(row, at)?;
            // `None` if an order column is NULL: the key then fails.
            let order: Option<Vec<String>> = (0..page.order_columns())
                .map(|i| ::sqlx::Row::try_get::<Option<String>, _>(row, at + 1 + i))
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .collect();
            let value = <Q::Row as FromRow<'_, PgRow>>::from_row(row).map(|r| q.map_row(r));
            let index = usize::try_from(position - 1).unwrap_or(usize::MAX);
            read.push((index, order, value));
        }
        Ok(gather_pages(keys, read))
    }
}

/// Each key's page of its parent's children.
impl<Q: PageQuery> Loader<PageKey<Q::Parent>, Page<Q::Value>> for SqlxLoader<Q, Paged> {
    type Error = ::sqlx::Error;

    async fn load(
        &self,
        keys: Vec<PageKey<Q::Parent>>,
    ) -> Result<Loaded<PageKey<Q::Parent>, Page<Q::Value>>, ::sqlx::Error> {
        self.load_pages(keys, None).await
    }

    /// An empty page counts as "not found" in the statistics.
    fn is_absent(&self, value: &Page<Q::Value>) -> bool {
        value.items.is_empty()
    }
}
