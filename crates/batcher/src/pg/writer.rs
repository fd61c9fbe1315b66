//! Micro-batched upserts: concurrent single-row writes become one statement
//! per batch, and each caller is acknowledged only once its batch has
//! committed.

use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio_postgres::error::DbError;
use tokio_postgres::Row;

use super::error::{classify, DbErrorKind};
use super::loader::{as_refs, Params, PgError};
use super::statements::{Sql, Statements};
use crate::{Batcher, BatcherBuilder, BuildError, Error, Loader};

/// How to upsert rows of one table: one statement for many rows, one for a
/// single row (used to find which rows of a failed batch are at fault), and
/// how to read back what each did.
///
/// Both statements must `RETURNING` each written row's key and whether it
/// was inserted rather than updated; `(xmax = 0)` is the usual way to tell.
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
    /// The parameters of [`batch_sql`](Self::batch_sql) for `rows`.
    fn batch_params<'a>(&self, rows: &'a [Self::Row]) -> Params<'a>;
    /// The statement for one row: what a row is written with, under a
    /// savepoint of its own, after its batch met a row fault. By default,
    /// [`batch_sql`](Self::batch_sql) itself.
    fn single_sql(&self) -> &str {
        self.batch_sql()
    }
    /// The parameters of [`single_sql`](Self::single_sql) for `row`; by
    /// default [`batch_params`](Self::batch_params) for that one row.
    fn single_params<'a>(&self, row: &'a Self::Row) -> Params<'a> {
        self.batch_params(std::slice::from_ref(row))
    }
    /// The key and the "inserted" flag of a returned row.
    ///
    /// # Errors
    ///
    /// When a column is missing or has an unexpected type.
    fn map_returned(&self, row: &Row) -> Result<(Self::Key, bool), tokio_postgres::Error>;

    /// Whether writing a batch twice leaves what writing it once does (a
    /// plain `ON CONFLICT ... DO UPDATE SET col = EXCLUDED.col`, with no
    /// trigger that counts). Then a batch whose connection was lost (its
    /// node failed over) is written again on a new connection rather than
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
pub struct RowError(#[source] tokio_postgres::Error);

impl RowError {
    /// The server's report: constraint, SQLSTATE, detail.
    pub fn as_db_error(&self) -> Option<&DbError> {
        self.0.as_db_error()
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

/// Runs an [`UpsertQuery`] for a batch of [`WriteRequest`]s; the loader
/// behind a [`Writer`].
pub struct PgWriter<Q> {
    pool: Pool,
    query: Arc<Q>,
    batch: Sql,
    single: Sql,
    statements: Statements,
}

impl<Q> fmt::Debug for PgWriter<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgWriter").finish_non_exhaustive()
    }
}

/// A refusal of the data, rather than of the connection or the server:
/// integrity constraint violations (class 23) and data exceptions (22).
fn is_row_fault(e: &tokio_postgres::Error) -> bool {
    classify(e).is_row_fault()
}

impl<Q: UpsertQuery> PgWriter<Q> {
    /// A writer loader running `query` on connections from `pool`, with
    /// prepared statements cached per connection.
    pub fn new(pool: Pool, query: Q) -> Self {
        Self::with_statements(pool, query, Statements::default())
    }

    /// A writer loader running `query` on connections from `pool`, sending
    /// its statements as `statements` say (unnamed through a
    /// transaction-mode pooler; a statement timeout set in each batch's
    /// transaction).
    pub fn with_statements(pool: Pool, query: Q, statements: Statements) -> Self {
        Self {
            pool,
            batch: Sql::new(query.batch_sql()),
            single: Sql::new(query.single_sql()),
            query: Arc::new(query),
            statements,
        }
    }

    /// Writes `rows` (distinct keys) in one transaction; on a row fault,
    /// writes them one by one under savepoints so only the faulty rows fail.
    ///
    /// If the node turned out to be gone or no longer a primary and the
    /// query [is idempotent](UpsertQuery::is_idempotent), the batch is
    /// written once more on a new connection (it may have committed before
    /// the connection was lost; a row it created reads as updated then).
    async fn upsert(
        &self,
        rows: &[Q::Row],
    ) -> Result<HashMap<Q::Key, Result<bool, Arc<RowError>>>, PgError> {
        match self.upsert_once(rows).await {
            Err(e) if e.kind() == DbErrorKind::Unavailable && self.query.is_idempotent() => {
                tracing::debug!(error = %e, "database node lost; writing the batch again on a new connection");
                self.upsert_once(rows).await
            }
            done => done,
        }
    }

    async fn upsert_once(
        &self,
        rows: &[Q::Row],
    ) -> Result<HashMap<Q::Key, Result<bool, Arc<RowError>>>, PgError> {
        let mut lease = super::Lease::get(&self.pool).await?;
        let written = self.upsert_on(&mut lease, rows).await;
        lease.settle(&written);
        written
    }

    async fn upsert_on(
        &self,
        client: &mut deadpool_postgres::ClientWrapper,
        rows: &[Q::Row],
    ) -> Result<HashMap<Q::Key, Result<bool, Arc<RowError>>>, PgError> {
        let tx = client.transaction().await?;
        self.statements.begin(&tx).await?;
        let params = self.query.batch_params(rows);
        match self
            .statements
            .query_in(&tx, &self.batch, &as_refs(&params))
            .await
        {
            Ok(returned) => {
                let mut out = HashMap::with_capacity(rows.len());
                for r in &returned {
                    let (key, inserted) = self.query.map_returned(r)?;
                    out.insert(key, Ok(inserted));
                }
                tx.commit().await?;
                Ok(out)
            }
            Err(e) if is_row_fault(&e) => {
                tx.rollback().await?;
                self.upsert_one_by_one(client, rows).await
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn upsert_one_by_one(
        &self,
        client: &mut deadpool_postgres::ClientWrapper,
        rows: &[Q::Row],
    ) -> Result<HashMap<Q::Key, Result<bool, Arc<RowError>>>, PgError> {
        let mut tx = client.transaction().await?;
        self.statements.begin(&tx).await?;
        let mut out = HashMap::with_capacity(rows.len());
        for row in rows {
            let key = self.query.key(row);
            let savepoint = tx.savepoint("write_row").await?;
            let params = self.query.single_params(row);
            let written = self
                .statements
                .query_one_in(&savepoint, &self.single, &as_refs(&params))
                .await;
            match written {
                Ok(r) => {
                    let (_, inserted) = self.query.map_returned(&r)?;
                    savepoint.commit().await?;
                    out.insert(key, Ok(inserted));
                }
                Err(e) if is_row_fault(&e) => {
                    savepoint.rollback().await?;
                    out.insert(key, Err(Arc::new(RowError(e))));
                }
                Err(e) => return Err(e.into()),
            }
        }
        tx.commit().await?;
        Ok(out)
    }
}

impl<Q: UpsertQuery> Loader<WriteRequest<Q::Row>, WriteResult> for PgWriter<Q> {
    type Error = PgError;

    async fn load(
        &self,
        mut requests: Vec<WriteRequest<Q::Row>>,
    ) -> Result<HashMap<WriteRequest<Q::Row>, WriteResult>, PgError> {
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

/// Concurrent single-row upserts, coalesced into batches by a
/// [`Batcher`]. Cheap to clone.
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
    /// flush policy, batch size, concurrency, queue and deadline apply).
    ///
    /// # Errors
    ///
    /// [`BuildError`] for invalid batcher settings or outside a runtime.
    pub fn new(
        pool: Pool,
        query: Q,
        builder: BatcherBuilder<WriteRequest<Q::Row>, WriteResult>,
    ) -> Result<Self, BuildError> {
        Ok(Self {
            batcher: builder.build(PgWriter::new(pool, query))?,
            seq: Arc::new(AtomicU64::new(0)),
        })
    }

    /// As [`new`](Self::new), sending statements as `statements` say
    /// (see [`StatementMode`](super::StatementMode)).
    ///
    /// # Errors
    ///
    /// [`BuildError`] for invalid batcher settings or outside a runtime.
    pub fn with_statements(
        pool: Pool,
        query: Q,
        statements: Statements,
        builder: BatcherBuilder<WriteRequest<Q::Row>, WriteResult>,
    ) -> Result<Self, BuildError> {
        Ok(Self {
            batcher: builder.build(PgWriter::with_statements(pool, query, statements))?,
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
    /// when the batch as a whole failed or was not run (then nothing of it
    /// was committed), as for [`Batcher::load`].
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
