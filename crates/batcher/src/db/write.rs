//! Micro-batched upserts, whatever the driver: a caller's write, what it
//! did, a refused row, the batch's plan (the last write of a key wins, rows
//! in key order) and the [`Writer`] that batches them. Each driver only
//! runs a planned batch on its connections (`Upsert`).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use super::classify::Classify;
use super::sqlstate::DbErrorKind;
use crate::error::Chain;
use crate::{Batcher, BatcherBuilder, BuildError, Error, Loaded, Loader};

/// What an acknowledged write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The key did not exist before.
    Created,
    /// The key existed and its row was replaced.
    Updated,
}

/// Why one row was refused (the rest of its batch was committed): the
/// driver's error `E` for the statement that wrote it, and its kind. Its
/// `Display` names the database's reason.
#[derive(Debug)]
pub struct RowError<E> {
    error: E,
    kind: DbErrorKind,
}

impl<E: std::error::Error + 'static> fmt::Display for RowError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the database refused the row: {}", Chain(&self.error))
    }
}

impl<E: std::error::Error + 'static> std::error::Error for RowError<E> {}

impl<E> RowError<E> {
    pub(crate) fn new(error: E, kind: DbErrorKind) -> Self {
        Self { error, kind }
    }

    /// Why the row was refused (always a row fault: a duplicate key, a
    /// missing referenced row, or another constraint or bad value).
    pub fn kind(&self) -> DbErrorKind {
        self.kind
    }

    /// The driver's error, as the statement for the row returned it.
    pub fn driver_error(&self) -> &E {
        &self.error
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

/// The per-caller answer of a batch: written, or this row refused (with
/// the driver's error `E`).
pub type WriteResult<E> = Result<Written, Arc<RowError<E>>>;

/// Per key of a written batch: inserted (rather than updated), or refused.
pub(crate) type Outcomes<K, E> = HashMap<K, Result<bool, Arc<RowError<E>>>>;

/// The rows a batch's statement returned, each read by `map` into its key
/// and whether it was inserted.
pub(crate) fn returned<R, K: Eq + Hash, E, M>(
    rows: &[R],
    map: impl Fn(&R) -> Result<(K, bool), M>,
) -> Result<Outcomes<K, E>, M> {
    rows.iter()
        .map(|r| map(r).map(|(key, inserted)| (key, Ok(inserted))))
        .collect()
}

/// A driver's savepoint, under which one row of a refused batch is
/// written again alone.
pub(crate) trait Savepoint<E>: Send {
    /// Keeps what was written under it (`RELEASE`).
    fn release(self) -> impl Future<Output = Result<(), E>> + Send;
    /// Undoes what was written under it (`ROLLBACK TO`).
    fn undo(self) -> impl Future<Output = Result<(), E>> + Send;
}

/// Ends the `savepoint` a row was `written` under: kept if the row was
/// written, undone if the database refused the row; any other error fails
/// the whole batch.
pub(crate) async fn settle_row<E: Classify, S: Savepoint<E>>(
    savepoint: S,
    written: Result<bool, E>,
) -> Result<Result<bool, Arc<RowError<E>>>, E> {
    match written {
        Ok(inserted) => {
            savepoint.release().await?;
            Ok(Ok(inserted))
        }
        Err(e) if e.kind().is_row_fault() => {
            savepoint.undo().await?;
            let kind = e.kind();
            Ok(Err(Arc::new(RowError::new(e, kind))))
        }
        Err(e) => Err(e),
    }
}

/// What a driver's writer does with a planned batch: rows with distinct
/// keys, in key order, written in one transaction, each answered with
/// whether it was inserted, or why it was refused.
pub(crate) trait Upsert: Send + Sync + 'static {
    /// What identifies a row (its conflict target).
    type Key: Clone + Ord + Hash + Send + Sync + 'static;
    /// A row to write.
    type Row: Clone + Send + Sync + 'static;
    /// The driver's error for a refused row.
    type RowFault;
    /// The driver's error for a batch that failed as a whole.
    type Error;

    /// The key of `row`.
    fn key(&self, row: &Self::Row) -> Self::Key;

    /// Writes `rows` (distinct keys, in key order).
    fn upsert(
        &self,
        rows: &[Self::Row],
    ) -> impl Future<Output = Result<Outcomes<Self::Key, Self::RowFault>, Self::Error>> + Send;
}

/// Plans a batch of writes, has `upsert` write it, and answers each
/// caller: the loader of every driver's writer.
///
/// Per key, the last write of the batch is the one written; rows go in
/// key order, so two of a writer's batches running at once take their
/// common rows' locks in one order and cannot deadlock each other, as they
/// could in arrival order.
pub(crate) async fn write_batch<U: Upsert>(
    upsert: &U,
    mut requests: Vec<WriteRequest<U::Row>>,
) -> Result<Loaded<WriteRequest<U::Row>, WriteResult<U::RowFault>>, U::Error> {
    requests.sort_unstable_by_key(|r| r.seq);
    let mut latest: HashMap<U::Key, usize> = HashMap::with_capacity(requests.len());
    for (i, r) in requests.iter().enumerate() {
        latest.insert(upsert.key(&r.row), i);
    }
    let mut winners: Vec<(U::Key, usize)> = latest.into_iter().collect();
    winners.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let rows: Vec<U::Row> = winners
        .iter()
        .map(|&(_, i)| requests[i].row.clone())
        .collect();

    let results = upsert.upsert(&rows).await?;

    // The first write of a key in the batch created it if the final row
    // was inserted; every later write of that key updated it.
    let mut seen: HashSet<U::Key> = HashSet::with_capacity(winners.len());
    let mut out = Loaded::with_capacity(requests.len());
    for r in requests {
        let key = upsert.key(&r.row);
        let first = seen.insert(key.clone());
        let answer = match results.get(&key) {
            Some(Ok(true)) if first => Ok(Written::Created),
            Some(Ok(_)) => Ok(Written::Updated),
            Some(Err(e)) => Err(Arc::clone(e)),
            // Every row is either returned or refused; a statement that
            // returns fewer rows breaks the query's contract.
            None => continue,
        };
        out.insert(r, answer);
    }
    Ok(out)
}

/// Concurrent single-row upserts, coalesced into batches by a [`Batcher`]:
/// `pgbatch::pg::Writer` over tokio-postgres, `pgbatch::sqlx::Writer` over
/// sqlx, both this type with the driver's error `E`. Cheap to clone.
///
/// Each caller of [`write`](Self::write) is answered once the batch holding
/// its row has committed; a row the database refuses (a constraint, a
/// value its column cannot hold) fails only its own caller, and the rest
/// of its batch is committed. Within a batch, the last write of a key is
/// the one written.
pub struct Writer<R, E> {
    batcher: Batcher<WriteRequest<R>, WriteResult<E>>,
    seq: Arc<AtomicU64>,
}

impl<R, E> Clone for Writer<R, E> {
    fn clone(&self) -> Self {
        Self {
            batcher: self.batcher.clone(),
            seq: Arc::clone(&self.seq),
        }
    }
}

impl<R, E> fmt::Debug for Writer<R, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Writer")
            .field("batcher", &self.batcher)
            .finish_non_exhaustive()
    }
}

impl<R, E> Writer<R, E>
where
    R: Clone + Send + Sync + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    /// A writer whose batches `loader` writes, batching as `builder` says
    /// (its flush policy, batch size, concurrency, queue and deadline
    /// apply): the driver's `PgWriter` or `SqlxWriter`, which says how
    /// statements are sent.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn f(pool: pgbatch::pg::Pool, query: impl pgbatch::pg::UpsertQuery<Row = (String, i64)>)
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// use pgbatch::pg::{PgWriter, Writer};
    ///
    /// let writer = Writer::new(PgWriter::new(pool, query), Writer::builder().name("counters"))?;
    /// writer.write(("home".to_owned(), 10)).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`BuildError`] for invalid batcher settings or outside a runtime.
    pub fn new(
        loader: impl Loader<WriteRequest<R>, WriteResult<E>>,
        builder: BatcherBuilder<WriteRequest<R>, WriteResult<E>>,
    ) -> Result<Self, BuildError> {
        Ok(Self {
            batcher: builder.build(loader)?,
            seq: Arc::new(AtomicU64::new(0)),
        })
    }

    /// A builder for the writer's batching settings (its flush policy,
    /// batch size, concurrency, queue and deadline apply).
    pub fn builder() -> BatcherBuilder<WriteRequest<R>, WriteResult<E>> {
        Batcher::builder()
    }

    /// Writes `row`, returning once the batch holding it has committed.
    ///
    /// # Errors
    ///
    /// - [`Error::Load`] with a [`RowError`] source when the database
    ///   refused this row (the rest of its batch was committed);
    ///   [`Error::load_error`] gets it back;
    /// - any other [`Error`] when the batch as a whole failed or was not
    ///   run, as for [`Batcher::load`]: then nothing of it was committed,
    ///   unless the connection was lost while its `COMMIT` was on the way
    ///   (a lost connection,
    ///   [`DbErrorKind::Unavailable`], leaves that unknown: write again
    ///   only an idempotent row). A failed batch's error is the driver's
    ///   own, as its loader reports it.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future does not cancel the write once it is queued: it
    /// may still be committed.
    pub async fn write(&self, row: R) -> Result<Written, Error> {
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
