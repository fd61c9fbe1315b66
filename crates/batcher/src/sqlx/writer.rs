//! Micro-batched upserts over sqlx: concurrent single-row writes become one
//! statement per batch, and each caller is acknowledged only once its batch
//! has committed. What `pgbatch::pg`'s writer does for tokio-postgres, with
//! the same names.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use ::sqlx::postgres::{PgConnection, PgDatabaseError, PgPool, PgRow, Postgres};
use ::sqlx::{Connection, Executor};

use super::error::classify;
use super::loader::{acquire, PgQuery, DEFAULT_ACQUIRE_TIMEOUT};
use crate::db::{self, again_if_lost, write_batch, Outcomes, StatementMode, Upsert, WriteRequest};
use crate::{Loaded, Loader};

/// How to upsert rows of one table with sqlx: one statement for many rows,
/// how a batch's rows are bound to it, optionally one statement for a
/// single row (used to find which rows of a failed batch are at fault), and
/// how to read back what each did.
///
/// Both statements must `RETURNING` each written row's key and whether it
/// was inserted rather than updated; `(xmax = 0)` is the usual way to tell.
///
/// ```no_run
/// use pgbatch::sqlx::{PgQuery, SqlxWriter, UpsertQuery, Writer, Written};
/// use sqlx::postgres::PgRow;
/// use sqlx::Row;
///
/// /// `counters(name text PRIMARY KEY, hits bigint NOT NULL)`.
/// struct Counters;
///
/// impl UpsertQuery for Counters {
///     type Key = String;
///     type Row = (String, i64);
///
///     fn key(&self, row: &(String, i64)) -> String {
///         row.0.clone()
///     }
///     fn batch_sql(&self) -> &str {
///         "INSERT INTO counters (name, hits) \
///          SELECT * FROM unnest($1::text[], $2::int8[]) \
///          ON CONFLICT (name) DO UPDATE SET hits = EXCLUDED.hits \
///          RETURNING name, (xmax = 0)"
///     }
///     fn bind_batch<'q>(&self, query: PgQuery<'q>, rows: &'q [(String, i64)]) -> PgQuery<'q> {
///         // One array per column.
///         let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
///         let hits: Vec<i64> = rows.iter().map(|r| r.1).collect();
///         query.bind(names).bind(hits)
///     }
///     fn map_returned(&self, row: &PgRow) -> Result<(String, bool), sqlx::Error> {
///         Ok((row.try_get(0)?, row.try_get(1)?))
///     }
///     // `SET col = EXCLUDED.col` and no trigger: writing twice is harmless.
///     fn is_idempotent(&self) -> bool {
///         true
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::PgPool::connect(&std::env::var("DATABASE_URL")?).await?;
/// let writer = Writer::new(SqlxWriter::new(pool, Counters), Writer::builder())?;
///
/// // Concurrent writes share one statement and one transaction.
/// let (home, about) = tokio::join!(
///     writer.write(("home".to_owned(), 10)),
///     writer.write(("about".to_owned(), 3)),
/// );
/// if home? == Written::Created {
///     println!("first count for the home page");
/// }
/// # let _ = about?;
/// # Ok(()) }
/// ```
///
/// Bind the rows as one array per column and read them with `unnest`
/// rather than building `VALUES ($1, $2), ($3, $4), ...`: a `VALUES` list
/// is a different statement for every batch size, which defeats the
/// statement cache, and runs into Postgres's limit of 65,535 parameters.
/// A nullable column is bound as a `Vec<Option<T>>`.
pub trait UpsertQuery: Send + Sync + 'static {
    /// What identifies a row (its conflict target). Ordered because a
    /// batch's rows are written in key order: two of this writer's batches
    /// running at once then lock their common rows in the same order and
    /// cannot deadlock each other, as they could in arrival order. Other
    /// writers of the table (an import ordered by the database's collation,
    /// say) may still take the same locks in another order.
    type Key: Clone + Ord + Hash + Send + Sync + 'static;
    /// A row to write.
    type Row: Clone + Send + Sync + 'static;

    /// The key of `row`.
    fn key(&self, row: &Self::Row) -> Self::Key;
    /// The statement for many rows with distinct keys, for example
    /// `INSERT ... SELECT * FROM unnest($1::text[], ...) ON CONFLICT (...) DO UPDATE ...`.
    fn batch_sql(&self) -> &str;
    /// Binds `rows` to `query`, a query of [`batch_sql`](Self::batch_sql):
    /// one array per column (`query.bind(names).bind(counts)`).
    fn bind_batch<'q>(&self, query: PgQuery<'q>, rows: &'q [Self::Row]) -> PgQuery<'q>;
    /// The key and the "inserted" flag of a row returned by either
    /// statement.
    ///
    /// # Errors
    ///
    /// When a column is missing or has an unexpected type (what sqlx's
    /// `Row::try_get` reports).
    fn map_returned(&self, row: &PgRow) -> Result<(Self::Key, bool), ::sqlx::Error>;

    /// The statement for one row, run under a savepoint per row when a
    /// batch was refused, to find the rows at fault. It must return one
    /// row, as [`batch_sql`](Self::batch_sql) would for that row. By
    /// default it is `batch_sql`, with one-element arrays (an
    /// `INSERT ... VALUES ($1, $2)` costs the server a little less).
    fn single_sql(&self) -> &str {
        self.batch_sql()
    }
    /// Binds `row` to `query`, a query of
    /// [`single_sql`](Self::single_sql). By default, as
    /// [`bind_batch`](Self::bind_batch) binds a batch of that one row.
    fn bind_single<'q>(&self, query: PgQuery<'q>, row: &'q Self::Row) -> PgQuery<'q> {
        self.bind_batch(query, std::slice::from_ref(row))
    }

    /// Whether writing a batch twice leaves what writing it once does (a
    /// plain `ON CONFLICT ... DO UPDATE SET col = EXCLUDED.col`, with no
    /// trigger that counts). Then a batch whose connection was lost is
    /// written again on another of the pool's connections rather than
    /// failed; its commit may have gone through before, so say so only
    /// when a second write does no harm. By default it is not.
    fn is_idempotent(&self) -> bool {
        false
    }
}

/// Why one row was refused (the rest of its batch was committed).
pub type RowError = db::RowError<::sqlx::Error>;

impl RowError {
    /// The server's report: SQLSTATE (`code()`), constraint, table,
    /// detail.
    pub fn as_db_error(&self) -> Option<&PgDatabaseError> {
        self.driver_error()
            .as_database_error()?
            .try_downcast_ref::<PgDatabaseError>()
    }

    /// sqlx's error, as the statement for the row returned it.
    pub fn as_sqlx_error(&self) -> &::sqlx::Error {
        self.driver_error()
    }
}

/// The per-caller answer of a batch: written, or this row refused.
pub type WriteResult = db::WriteResult<::sqlx::Error>;

/// Runs an [`UpsertQuery`] for a batch of [`WriteRequest`]s on a sqlx
/// `PgPool`; the loader behind a [`Writer`].
///
/// Each batch is one transaction on one connection: `BEGIN`, the batch
/// statement, `COMMIT`. With [`StatementMode::Prepared`] the statement is
/// prepared once per connection and cached there (sqlx's statement
/// cache); with [`StatementMode::Unnamed`] it is sent unnamed
/// (`persistent(false)`), which sqlx parses and executes in two round
/// trips, both inside the batch's transaction and so on one server
/// connection behind a transaction-mode pooler.
///
/// # Cancel safety
///
/// A batch dropped before it ends (a batcher's `load_timeout`) leaves its
/// transaction to be rolled back: sqlx queues the `ROLLBACK` and sends it
/// when the connection goes back to the pool, which also tests the
/// connection and closes it if it is broken. A batch dropped while its
/// `COMMIT` was on the way may have committed.
pub struct SqlxWriter<Q> {
    pool: PgPool,
    query: Q,
    mode: StatementMode,
    acquire_timeout: Duration,
}

impl<Q> fmt::Debug for SqlxWriter<Q> {
    // Not the pool's own `Debug`: its size says what matters in a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxWriter")
            .field("pool_size", &self.pool.size())
            .field("pool_idle", &self.pool.num_idle())
            .field("pool_closed", &self.pool.is_closed())
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl<Q: UpsertQuery> SqlxWriter<Q> {
    /// A writer loader running `query` on connections from `pool`, as
    /// statements prepared and cached per connection.
    pub fn new(pool: PgPool, query: Q) -> Self {
        Self::with_statement_mode(pool, query, StatementMode::default())
    }

    /// A writer loader running `query` on connections from `pool`, sending
    /// its statements as `mode` says: [`StatementMode::Unnamed`] through a
    /// transaction-mode pooler that does not track prepared statements.
    pub fn with_statement_mode(pool: PgPool, query: Q, mode: StatementMode) -> Self {
        Self {
            pool,
            query,
            mode,
            acquire_timeout: DEFAULT_ACQUIRE_TIMEOUT,
        }
    }

    /// The longest a batch waits for a connection, whatever the pool's
    /// own `acquire_timeout`: as [`SqlxLoader::acquire_timeout`](super::SqlxLoader::acquire_timeout).
    /// Default [`DEFAULT_ACQUIRE_TIMEOUT`], 1 s.
    #[must_use]
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// How this writer sends its statements.
    pub fn statement_mode(&self) -> StatementMode {
        self.mode
    }

    async fn upsert_on(
        &self,
        conn: &mut PgConnection,
        rows: &[Q::Row],
    ) -> Result<Outcomes<Q::Key, ::sqlx::Error>, ::sqlx::Error> {
        // A failure drops `tx`, which rolls it back.
        let mut tx = Connection::begin(&mut *conn).await?;
        let q = &self.query;
        let statement =
            self.persistence(q.bind_batch(::sqlx::query::<Postgres>(q.batch_sql()), rows));
        // `Executor::fetch_all` on the connection itself returns a boxed
        // `Send` future, as in the loader.
        let written = Executor::fetch_all(&mut *tx, statement).await;
        match written {
            Ok(returned) => {
                let out = db::returned(&returned, |r| q.map_returned(r))?;
                tx.commit().await?;
                Ok(out)
            }
            Err(e) if classify(&e).is_row_fault() => {
                tx.rollback().await?;
                self.upsert_one_by_one(conn, rows).await
            }
            Err(e) => Err(e),
        }
    }

    async fn upsert_one_by_one(
        &self,
        conn: &mut PgConnection,
        rows: &[Q::Row],
    ) -> Result<Outcomes<Q::Key, ::sqlx::Error>, ::sqlx::Error> {
        let q = &self.query;
        let mut tx = Connection::begin(&mut *conn).await?;
        let mut out = HashMap::with_capacity(rows.len());
        for row in rows {
            let key = q.key(row);
            let mut savepoint = Connection::begin(&mut *tx).await?;
            let statement =
                self.persistence(q.bind_single(::sqlx::query::<Postgres>(q.single_sql()), row));
            let written = Executor::fetch_one(&mut *savepoint, statement).await;
            let written = written.and_then(|r| Ok(q.map_returned(&r)?.1));
            out.insert(key, db::settle_row(savepoint, written).await?);
        }
        tx.commit().await?;
        Ok(out)
    }

    /// `statement`, prepared and cached or unnamed as the mode says.
    fn persistence<'q>(&self, statement: PgQuery<'q>) -> PgQuery<'q> {
        statement.persistent(self.mode == StatementMode::Prepared)
    }
}

// Inside a transaction sqlx's `begin` is a `SAVEPOINT`, its `commit` a
// `RELEASE` and its `rollback` a `ROLLBACK TO`.
impl db::Savepoint<::sqlx::Error> for ::sqlx::Transaction<'_, Postgres> {
    async fn release(self) -> Result<(), ::sqlx::Error> {
        self.commit().await
    }

    async fn undo(self) -> Result<(), ::sqlx::Error> {
        self.rollback().await
    }
}

/// Writes a batch (distinct keys, in key order) in one transaction; on a
/// row fault, writes its rows one by one under savepoints so only the
/// faulty rows fail. If the connection turned out to be lost and the
/// query [is idempotent](UpsertQuery::is_idempotent), the batch is written
/// once more on another of the pool's connections (it may have committed
/// before the connection was lost; a row it created reads as updated
/// then).
impl<Q: UpsertQuery> Upsert for SqlxWriter<Q> {
    type Key = Q::Key;
    type Row = Q::Row;
    type RowFault = ::sqlx::Error;
    type Error = ::sqlx::Error;

    fn key(&self, row: &Q::Row) -> Q::Key {
        self.query.key(row)
    }

    async fn upsert(
        &self,
        rows: &[Q::Row],
    ) -> Result<Outcomes<Q::Key, ::sqlx::Error>, ::sqlx::Error> {
        // One attempt on one connection. The connection goes back to the
        // pool when it ends; the pool tests it there (sqlx pings a returned
        // connection, which also sends a rollback left queued) and closes
        // it if it is broken, so a second attempt gets another.
        again_if_lost("writing the batch", self.query.is_idempotent(), || async {
            let mut conn = acquire(&self.pool, self.acquire_timeout).await?;
            self.upsert_on(&mut conn, rows).await
        })
        .await
    }
}

impl<Q: UpsertQuery> Loader<WriteRequest<Q::Row>, WriteResult> for SqlxWriter<Q> {
    type Error = ::sqlx::Error;

    async fn load(
        &self,
        requests: Vec<WriteRequest<Q::Row>>,
    ) -> Result<Loaded<WriteRequest<Q::Row>, WriteResult>, ::sqlx::Error> {
        write_batch(self, requests).await
    }
}

/// Concurrent single-row upserts of rows `R` on a sqlx `PgPool`,
/// coalesced into batches by a [`Batcher`](crate::Batcher): see
/// [`pg::Writer`](crate::pg::Writer) for the contract, which is the
/// same. Cheap to clone.
pub type Writer<R> = db::Writer<R, ::sqlx::Error>;
