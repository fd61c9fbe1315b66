//! Micro-batched upserts: concurrent single-row writes become one statement
//! per batch, and each caller is acknowledged only once its batch has
//! committed.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio_postgres::error::DbError;
use tokio_postgres::Row;

use super::error::classify;
use super::loader::{as_refs, Params, PgError};
use super::statements::{Sql, Statements};
use crate::db::{self, again_if_lost, write_batch, Outcomes, Upsert, WriteRequest};
use crate::{Loaded, Loader};

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

/// Why one row was refused (the rest of its batch was committed).
pub type RowError = db::RowError<tokio_postgres::Error>;

impl RowError {
    /// The server's report: constraint, SQLSTATE, detail.
    pub fn as_db_error(&self) -> Option<&DbError> {
        self.driver_error().as_db_error()
    }
}

/// The per-caller answer of a batch: written, or this row refused.
pub type WriteResult = db::WriteResult<tokio_postgres::Error>;

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

    async fn upsert_on(
        &self,
        client: &mut deadpool_postgres::ClientWrapper,
        rows: &[Q::Row],
    ) -> Result<Outcomes<Q::Key, tokio_postgres::Error>, PgError> {
        let tx = client.transaction().await?;
        self.statements.begin(&tx).await?;
        let params = self.query.batch_params(rows);
        match self
            .statements
            .query_in(&tx, &self.batch, &as_refs(&params))
            .await
        {
            Ok(returned) => {
                let out = db::returned(&returned, |r| self.query.map_returned(r))?;
                tx.commit().await?;
                Ok(out)
            }
            Err(e) if classify(&e).is_row_fault() => {
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
    ) -> Result<Outcomes<Q::Key, tokio_postgres::Error>, PgError> {
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
            let written = written.and_then(|r| Ok(self.query.map_returned(&r)?.1));
            out.insert(key, db::settle_row(savepoint, written).await?);
        }
        tx.commit().await?;
        Ok(out)
    }
}

impl db::Savepoint<tokio_postgres::Error> for deadpool_postgres::Transaction<'_> {
    async fn release(self) -> Result<(), tokio_postgres::Error> {
        self.commit().await
    }

    async fn undo(self) -> Result<(), tokio_postgres::Error> {
        self.rollback().await
    }
}

/// Writes a batch (distinct keys, in key order) in one transaction; on a
/// row fault, writes its rows one by one under savepoints so only the
/// faulty rows fail. If the node turned out to be gone or no longer a
/// primary and the query [is idempotent](UpsertQuery::is_idempotent), the
/// batch is written once more on a new connection (it may have committed
/// before the connection was lost; a row it created reads as updated
/// then).
impl<Q: UpsertQuery> Upsert for PgWriter<Q> {
    type Key = Q::Key;
    type Row = Q::Row;
    type RowFault = tokio_postgres::Error;
    type Error = PgError;

    fn key(&self, row: &Q::Row) -> Q::Key {
        self.query.key(row)
    }

    async fn upsert(&self, rows: &[Q::Row]) -> Result<Outcomes<Q::Key, Self::RowFault>, PgError> {
        again_if_lost("writing the batch", self.query.is_idempotent(), || async {
            let mut lease = super::Lease::get(&self.pool).await?;
            let written = self.upsert_on(&mut lease, rows).await;
            lease.settle(&written);
            written
        })
        .await
    }
}

impl<Q: UpsertQuery> Loader<WriteRequest<Q::Row>, WriteResult> for PgWriter<Q> {
    type Error = PgError;

    async fn load(
        &self,
        requests: Vec<WriteRequest<Q::Row>>,
    ) -> Result<Loaded<WriteRequest<Q::Row>, WriteResult>, PgError> {
        write_batch(self, requests).await
    }
}

/// Concurrent single-row upserts of rows `R` on a tokio-postgres pool,
/// coalesced into batches by a [`Batcher`](crate::Batcher): see
/// [`db::Writer`](crate::pg::Writer). Cheap to clone.
pub type Writer<R> = db::Writer<R, tokio_postgres::Error>;
