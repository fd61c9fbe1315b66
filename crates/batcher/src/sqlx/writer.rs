//! Micro-batched upserts over sqlx: concurrent single-row writes become one
//! statement per batch, and each caller is acknowledged only once its batch
//! has committed. What `pgbatch::pg`'s writer does for tokio-postgres, with
//! the same names.

use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use ::sqlx::postgres::{PgConnection, PgDatabaseError, PgPool, PgRow, Postgres};
use ::sqlx::{Connection, Executor};

use super::error::classify;
use super::loader::{PgQuery, StatementMode};
use crate::sqlstate::DbErrorKind;
use crate::{Batcher, BatcherBuilder, BuildError, Error, Loader};

/// How to upsert rows of one table with sqlx: one statement for many rows,
/// how a batch's rows are bound to it, optionally one statement for a
/// single row (used to find which rows of a failed batch are at fault), and
/// how to read back what each did.
///
/// Both statements must `RETURNING` each written row's key and whether it
/// was inserted rather than updated; `(xmax = 0)` is the usual way to tell.
///
/// ```no_run
/// use pgbatch::sqlx::{PgQuery, UpsertQuery, Writer, Written};
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
/// let writer = Writer::new(pool, Counters, Writer::<Counters>::builder())?;
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

/// What an acknowledged write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The key did not exist before.
    Created,
    /// The key existed and its row was replaced.
    Updated,
}

/// Why one row was refused (the rest of its batch was committed).
#[derive(Debug, thiserror::Error)]
#[error("the database refused the row")]
pub struct RowError(#[source] ::sqlx::Error);

impl RowError {
    /// The server's report: SQLSTATE (`code()`), constraint, table,
    /// detail.
    pub fn as_db_error(&self) -> Option<&PgDatabaseError> {
        self.0
            .as_database_error()?
            .try_downcast_ref::<PgDatabaseError>()
    }

    /// sqlx's error, as the statement for the row returned it.
    pub fn as_sqlx_error(&self) -> &::sqlx::Error {
        &self.0
    }

    /// Why the row was refused (always a row fault: a duplicate key, a
    /// missing referenced row, or another constraint or bad value).
    pub fn kind(&self) -> DbErrorKind {
        classify(&self.0)
    }
}

/// One caller's write. Unique per call, so two writes of one key in a
/// batch both reach the loader, which keeps the later one.
#[derive(Clone)]
pub struct WriteRequest<R> {
    seq: u64,
    row: R,
}

impl<R> PartialEq for WriteRequest<R> {
    fn eq(&self, other: &Self) -> bool {
        self.seq == other.seq
    }
}

impl<R> Eq for WriteRequest<R> {}

impl<R> Hash for WriteRequest<R> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.seq.hash(state);
    }
}

impl<R> fmt::Debug for WriteRequest<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteRequest")
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

/// The per-caller answer of a batch: written, or this row refused.
pub type WriteResult = Result<Written, Arc<RowError>>;

/// Per key of a batch: inserted (rather than updated), or refused.
type Outcomes<K> = HashMap<K, Result<bool, Arc<RowError>>>;

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

/// A refusal of the data, rather than of the connection or the server:
/// integrity constraint violations (class 23) and data exceptions (22).
fn is_row_fault(e: &::sqlx::Error) -> bool {
    classify(e).is_row_fault()
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
        Self { pool, query, mode }
    }

    /// How this writer sends its statements.
    pub fn statement_mode(&self) -> StatementMode {
        self.mode
    }

    /// Writes `rows` (distinct keys) in one transaction; on a row fault,
    /// writes them one by one under savepoints so only the faulty rows fail.
    ///
    /// If the connection turned out to be lost and the query
    /// [is idempotent](UpsertQuery::is_idempotent), the batch is written
    /// once more on another of the pool's connections (it may have
    /// committed before the connection was lost; a row it created reads as
    /// updated then).
    async fn upsert(&self, rows: &[Q::Row]) -> Result<Outcomes<Q::Key>, ::sqlx::Error> {
        match self.upsert_once(rows).await {
            Err(e) if classify(&e) == DbErrorKind::Unavailable && self.query.is_idempotent() => {
                tracing::debug!(error = %e, "database connection lost; writing the batch again on another");
                self.upsert_once(rows).await
            }
            done => done,
        }
    }

    /// One attempt on one connection. The connection goes back to the pool
    /// when this returns; the pool tests it there (sqlx pings a returned
    /// connection, which also sends a rollback left queued) and closes it
    /// if it is broken, so a second attempt gets another.
    async fn upsert_once(&self, rows: &[Q::Row]) -> Result<Outcomes<Q::Key>, ::sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        self.upsert_on(&mut conn, rows).await
    }

    async fn upsert_on(
        &self,
        conn: &mut PgConnection,
        rows: &[Q::Row],
    ) -> Result<Outcomes<Q::Key>, ::sqlx::Error> {
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
                let mut out = HashMap::with_capacity(rows.len());
                for r in &returned {
                    let (key, inserted) = q.map_returned(r)?;
                    out.insert(key, Ok(inserted));
                }
                tx.commit().await?;
                Ok(out)
            }
            Err(e) if is_row_fault(&e) => {
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
    ) -> Result<Outcomes<Q::Key>, ::sqlx::Error> {
        let q = &self.query;
        let mut tx = Connection::begin(&mut *conn).await?;
        let mut out = HashMap::with_capacity(rows.len());
        for row in rows {
            let key = q.key(row);
            // Inside a transaction sqlx's `begin` is a `SAVEPOINT`, its
            // `commit` a `RELEASE` and its `rollback` a `ROLLBACK TO`.
            let mut savepoint = Connection::begin(&mut *tx).await?;
            let statement =
                self.persistence(q.bind_single(::sqlx::query::<Postgres>(q.single_sql()), row));
            let written = Executor::fetch_one(&mut *savepoint, statement).await;
            match written {
                Ok(r) => {
                    let (_, inserted) = q.map_returned(&r)?;
                    savepoint.commit().await?;
                    out.insert(key, Ok(inserted));
                }
                Err(e) if is_row_fault(&e) => {
                    savepoint.rollback().await?;
                    out.insert(key, Err(Arc::new(RowError(e))));
                }
                Err(e) => return Err(e),
            }
        }
        tx.commit().await?;
        Ok(out)
    }

    /// `statement`, prepared and cached or unnamed as the mode says.
    fn persistence<'q>(&self, statement: PgQuery<'q>) -> PgQuery<'q> {
        statement.persistent(self.mode == StatementMode::Prepared)
    }
}

impl<Q: UpsertQuery> Loader<WriteRequest<Q::Row>, WriteResult> for SqlxWriter<Q> {
    type Error = ::sqlx::Error;

    async fn load(
        &self,
        mut requests: Vec<WriteRequest<Q::Row>>,
    ) -> Result<HashMap<WriteRequest<Q::Row>, WriteResult>, ::sqlx::Error> {
        // Arrival order; per key the last arrival's row is the one written.
        requests.sort_unstable_by_key(|r| r.seq);
        let mut latest: HashMap<Q::Key, usize> = HashMap::with_capacity(requests.len());
        for (i, r) in requests.iter().enumerate() {
            latest.insert(self.query.key(&r.row), i);
        }
        // Key order, so that concurrent batches take row locks in one
        // order (see UpsertQuery::Key).
        let mut winners: Vec<(Q::Key, usize)> = latest.into_iter().collect();
        winners.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let rows: Vec<Q::Row> = winners
            .iter()
            .map(|&(_, i)| requests[i].row.clone())
            .collect();

        let results = self.upsert(&rows).await?;

        // The first write of a key in the batch created it if the final
        // row was inserted; every later write of that key updated it.
        let mut seen: HashMap<Q::Key, ()> = HashMap::with_capacity(winners.len());
        let mut out = HashMap::with_capacity(requests.len());
        for r in requests {
            let key = self.query.key(&r.row);
            let first = seen.insert(key.clone(), ()).is_none();
            let answer = match results.get(&key) {
                Some(Ok(true)) if first => Ok(Written::Created),
                Some(Ok(_)) => Ok(Written::Updated),
                Some(Err(e)) => Err(Arc::clone(e)),
                // Every row is either returned or refused; a statement that
                // returns fewer rows breaks the UpsertQuery contract.
                None => continue,
            };
            out.insert(r, answer);
        }
        Ok(out)
    }
}

/// Concurrent single-row upserts on a sqlx `PgPool`, coalesced into
/// batches by a [`Batcher`]. Cheap to clone.
///
/// Each caller of [`write`](Self::write) is answered once the batch holding
/// its row has committed; a row the database refuses (a constraint, a
/// value its column cannot hold) fails only its own caller, and the rest
/// of its batch is committed. Within a batch, the last write of a key is
/// the one written.
pub struct Writer<Q: UpsertQuery> {
    batcher: Batcher<WriteRequest<Q::Row>, WriteResult>,
    seq: Arc<AtomicU64>,
}

impl<Q: UpsertQuery> Clone for Writer<Q> {
    fn clone(&self) -> Self {
        Self {
            batcher: self.batcher.clone(),
            seq: Arc::clone(&self.seq),
        }
    }
}

impl<Q: UpsertQuery> fmt::Debug for Writer<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Writer")
            .field("batcher", &self.batcher)
            .finish_non_exhaustive()
    }
}

impl<Q: UpsertQuery> Writer<Q> {
    /// A writer for `query` over `pool`, batching as `builder` says (its
    /// flush policy, batch size, concurrency, queue and deadline apply),
    /// with statements prepared and cached per connection.
    ///
    /// # Errors
    ///
    /// [`BuildError`] for invalid batcher settings or outside a runtime.
    pub fn new(
        pool: PgPool,
        query: Q,
        builder: BatcherBuilder<WriteRequest<Q::Row>, WriteResult>,
    ) -> Result<Self, BuildError> {
        Self::with_statement_mode(pool, query, StatementMode::default(), builder)
    }

    /// As [`new`](Self::new), sending statements as `mode` says
    /// ([`StatementMode::Unnamed`] through a transaction-mode pooler).
    ///
    /// # Errors
    ///
    /// [`BuildError`] for invalid batcher settings or outside a runtime.
    pub fn with_statement_mode(
        pool: PgPool,
        query: Q,
        mode: StatementMode,
        builder: BatcherBuilder<WriteRequest<Q::Row>, WriteResult>,
    ) -> Result<Self, BuildError> {
        Ok(Self {
            batcher: builder.build(SqlxWriter::with_statement_mode(pool, query, mode))?,
            seq: Arc::new(AtomicU64::new(0)),
        })
    }

    /// A builder for [`new`](Self::new)'s batching settings.
    pub fn builder() -> BatcherBuilder<WriteRequest<Q::Row>, WriteResult> {
        Batcher::builder()
    }

    /// Writes `row`, returning once the batch holding it has committed.
    ///
    /// # Errors
    ///
    /// [`Error::Load`] with a [`RowError`] source when the database refused
    /// this row (the rest of its batch was committed); any other [`Error`]
    /// when the batch as a whole failed or was not run, as for
    /// [`Batcher::load`]: then nothing of it was committed, unless the
    /// connection was lost while its `COMMIT` was on the way (a lost
    /// connection, [`DbErrorKind::Unavailable`](super::DbErrorKind::Unavailable),
    /// leaves that unknown: write again only an idempotent row). A failed batch's error is
    /// sqlx's own: [`Error::load_error`]`::<sqlx::Error>()` gets it back,
    /// and [`classify`](super::classify) sorts it.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future does not cancel the write once it is queued: it
    /// may still be committed.
    pub async fn write(&self, row: Q::Row) -> Result<Written, Error> {
        let seq = self.seq.fetch_add(1, Relaxed);
        match self.batcher.load(WriteRequest { seq, row }).await? {
            Some(Ok(written)) => Ok(written),
            Some(Err(refused)) => Err(Error::Load(refused)),
            None => Err(Error::LoaderPanicked(
                "upsert statement returned no row for a written key".into(),
            )),
        }
    }

    /// The batcher's statistics.
    pub fn stats(&self) -> crate::StatsSnapshot {
        self.batcher.stats()
    }

    /// Stops the writer after committing and acknowledging what it holds.
    pub async fn shutdown(&self) {
        self.batcher.shutdown().await;
    }
}
