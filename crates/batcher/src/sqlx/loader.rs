//! A [`Loader`] that runs one sqlx query per batch.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use ::sqlx::postgres::{PgArguments, PgPool, PgRow, Postgres};
use ::sqlx::query::Query;
use ::sqlx::{Executor, FromRow};

use crate::db::{again_if_lost, StatementMode};
use crate::Loader;

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
    /// What is looked up.
    type Key: Clone + Eq + Hash + Send + Sync + 'static;
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
/// its connection was lost ([`DbErrorKind::Unavailable`]) runs once more on
/// another connection.
///
/// # Cancel safety
///
/// A load dropped before it ends (a batcher's timeout) leaves its
/// connection to sqlx's pool, which tests it before reuse; an
/// [`Unnamed`](StatementMode::Unnamed) load's transaction is rolled back.
pub struct SqlxLoader<Q> {
    pool: PgPool,
    inner: Arc<Inner<Q>>,
}

/// The query and how it is sent, shared by the loader's clones (and the
/// same loader on other pools).
struct Inner<Q> {
    query: Q,
    mode: StatementMode,
}

impl<Q> Clone for SqlxLoader<Q> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<Q> fmt::Debug for SqlxLoader<Q> {
    // Not the pool's own `Debug`: the loader's is for logs, and the
    // pool's size says what matters there.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxLoader")
            .field("pool_size", &self.pool.size())
            .field("pool_idle", &self.pool.num_idle())
            .field("pool_closed", &self.pool.is_closed())
            .field("mode", &self.inner.mode)
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
        Self {
            pool,
            inner: Arc::new(Inner { query, mode }),
        }
    }

    /// How this loader sends its statements.
    pub fn statement_mode(&self) -> StatementMode {
        self.inner.mode
    }

    /// The same query on another pool (a read replica's, say), sharing
    /// the query rather than copying it.
    #[must_use]
    pub fn with_pool(&self, pool: PgPool) -> Self {
        Self {
            pool,
            inner: Arc::clone(&self.inner),
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

    /// Looks up one key with the single-key statement: one round trip per
    /// key (with [`StatementMode::Prepared`]), no batching.
    ///
    /// # Errors
    ///
    /// When no connection is available, the statement fails, or a row
    /// cannot be read into [`BatchQuery::Row`].
    pub async fn load_one(&self, key: &Q::Key) -> Result<Option<Q::Value>, ::sqlx::Error> {
        let rows = self.fetch(std::slice::from_ref(key)).await?;
        match rows.first() {
            Some(row) => Ok(Some(self.map(row)?.1)),
            None => Ok(None),
        }
    }

    /// Runs the statement for `keys`; if the connection was lost, once
    /// more: a read is safe to repeat, and the pool does not hand out the
    /// lost connection again (it tests a connection coming back).
    async fn fetch(&self, keys: &[Q::Key]) -> Result<Vec<PgRow>, ::sqlx::Error> {
        again_if_lost("reading", true, || self.fetch_once(keys)).await
    }

    async fn fetch_once(&self, keys: &[Q::Key]) -> Result<Vec<PgRow>, ::sqlx::Error> {
        // `Executor::fetch_all` returns a boxed `Send` future, so the
        // loader's future is `Send` without the compiler having to prove
        // it through sqlx's generic executors.
        match self.inner.mode {
            StatementMode::Prepared => Executor::fetch_all(&self.pool, self.statement(keys)).await,
            StatementMode::Unnamed => {
                // The transaction keeps the statement's parse and its
                // execution on one server connection behind a pooler. A
                // failure drops `tx`, which rolls it back.
                let mut tx = self.pool.begin().await?;
                let rows = Executor::fetch_all(&mut *tx, self.statement(keys)).await?;
                tx.commit().await?;
                Ok(rows)
            }
        }
    }

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

impl<Q: BatchQuery> Loader<Q::Key, Q::Value> for SqlxLoader<Q> {
    type Error = ::sqlx::Error;

    /// Runs [`batch_sql`](BatchQuery::batch_sql) for the keys, or
    /// [`single_sql`](BatchQuery::single_sql) for a batch of one: batches of
    /// one are what a lightly loaded batcher sends.
    async fn load(&self, keys: Vec<Q::Key>) -> Result<HashMap<Q::Key, Q::Value>, ::sqlx::Error> {
        let rows = self.fetch(&keys).await?;
        let mut found = HashMap::with_capacity(rows.len());
        for row in &rows {
            let (key, value) = self.map(row)?;
            found.insert(key, value);
        }
        Ok(found)
    }

    fn is_absent(&self, value: &Q::Value) -> bool {
        self.inner.query.is_absent(value)
    }
}
