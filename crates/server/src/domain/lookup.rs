//! The one read abstraction: a [`Lookup`] answers keys of one query kind
//! through the read path chosen at start (naive, batched or cached), so no
//! caller repeats that choice.
//!
//! The service builds one per query kind, in its read registry; the load
//! generators build them too, so they measure the paths the service runs.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use pgbatch::cache::{Cache, CacheStats};
use pgbatch::pg::{BatchQuery, PgError};
use pgbatch::{Batcher, BuildError, Loader as _, StatsSnapshot};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::types::PgLsn;

use crate::cluster::coherence::Coherence;
use crate::cluster::replicas::{Needs, ReadRouter, RoutedLoader};
use crate::domain::failure::{Failure, Work};
use crate::settings::{ReadPath, ReadSettings};

/// Keys of one [`BatchQuery`], looked up through one read path.
///
/// Cheap to clone: clones share the batcher and the cache.
///
/// # Admission
///
/// A request is admitted whole or refused whole before any of its keys is
/// queued: it reserves room for all its keys among the
/// [`queue_capacity`](crate::settings::BatchSettings::queue_capacity) keys
/// a lookup holds in flight, and gets [`Failure::Overloaded`] at once when
/// there is none. Without this, a request of a thousand keys under
/// overload would queue some, find the queue full for the rest, fail, and
/// throw away the work done for the ones it queued. A request waits for
/// room at most [`admission_wait`](ReadSettings::admission_wait), in
/// arrival order: a short wait keeps every slot busy as requests finish,
/// and keeps clients that retry at once from spending the CPU on
/// refusals. A handler whose keys arrive in a body
/// [`reserve`](Self::reserve)s room for the most it may hold before reading
/// the body, so refusing it costs next to nothing.
pub struct Lookup<Q: BatchQuery> {
    name: &'static str,
    timeout: Duration,
    source: Source<Q>,
    /// One permit per key in flight through this lookup.
    admission: Arc<Semaphore>,
    capacity: usize,
    admission_wait: Duration,
    /// Off while cross-instance invalidations may have been missed: the
    /// cached path then reads through its batcher.
    coherence: Coherence,
    /// For reads at a client's position: straight to a database that has
    /// replayed it, past the cache and the batcher.
    direct: RoutedLoader<Q>,
    /// Every read no older than the invalidations applied (credentials:
    /// see `Invalidated::FRESH`).
    fresh: bool,
}

/// Where a lookup's values come from: the read path it was built for.
enum Source<Q: BatchQuery> {
    /// One statement per key, on a pooled connection.
    Naive(RoutedLoader<Q>),
    /// Keys coalesced into batched statements.
    Batched(Batcher<Q::Key, Q::Value>),
    /// A cache whose misses go through the batcher (kept for its stats and
    /// shutdown).
    Cached {
        cache: Cache<Q::Key, Q::Value>,
        batcher: Batcher<Q::Key, Q::Value>,
    },
}

impl<Q: BatchQuery> Clone for Source<Q> {
    fn clone(&self) -> Self {
        match self {
            Self::Naive(loader) => Self::Naive(loader.clone()),
            Self::Batched(batcher) => Self::Batched(batcher.clone()),
            Self::Cached { cache, batcher } => Self::Cached {
                cache: cache.clone(),
                batcher: batcher.clone(),
            },
        }
    }
}

impl<Q: BatchQuery> Clone for Lookup<Q> {
    fn clone(&self) -> Self {
        Self {
            name: self.name,
            timeout: self.timeout,
            source: self.source.clone(),
            admission: Arc::clone(&self.admission),
            capacity: self.capacity,
            admission_wait: self.admission_wait,
            coherence: self.coherence.clone(),
            direct: self.direct.clone(),
            fresh: self.fresh,
        }
    }
}

impl<Q: BatchQuery> fmt::Debug for Lookup<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = match self.source {
            Source::Naive(_) => ReadPath::Naive,
            Source::Batched(_) => ReadPath::Batched,
            Source::Cached { .. } => ReadPath::Cached,
        };
        f.debug_struct("Lookup")
            .field("name", &self.name)
            .field("path", &path)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<Q: BatchQuery> Lookup<Q> {
    /// Lookups of `query` through the path `settings` choose, on the
    /// databases `router` routes to (a [`Pool`](pgbatch::pg::Pool) alone:
    /// that one); `name` labels the batcher and cache in traces and
    /// metrics. The batched and cached paths start their batcher on the
    /// current runtime. A cache's misses are loaded only where
    /// [`Needs::CacheFill`] allows.
    ///
    /// # Errors
    ///
    /// When a batcher or cache setting is invalid (a batch size of 0, say),
    /// or there is no runtime to start the batcher on.
    pub fn new(
        name: &'static str,
        query: Q,
        router: impl Into<ReadRouter>,
        settings: &ReadSettings,
    ) -> Result<Self, BuildError> {
        Self::with_freshness(name, query, router, settings, false)
    }

    /// As [`new`](Self::new); if `fresh`, every read, cached or not, is no
    /// older than the invalidations this instance has applied (reads on
    /// any path need what a cache fill needs, and reads at a position
    /// that too), and a key a replica does not know is asked of the
    /// primary: for credentials.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn with_freshness(
        name: &'static str,
        query: Q,
        router: impl Into<ReadRouter>,
        settings: &ReadSettings,
        fresh: bool,
    ) -> Result<Self, BuildError> {
        let needs = if fresh { Needs::CacheFill } else { Needs::Any };
        let loader = RoutedLoader::new(router.into(), query, needs).confirming_misses(fresh);
        // Every database the router reads from has a pool this size.
        let connections = loader.router().primary().status().max_size;
        let batch = settings.batch.bounded_by(connections);
        let batcher = |needs| {
            batch
                .builder(name, settings.timeout)
                .build(loader.needing(needs))
        };
        let source = match settings.path {
            ReadPath::Naive => Source::Naive(loader.clone()),
            ReadPath::Batched => Source::Batched(batcher(needs)?),
            ReadPath::Cached => {
                let batcher = batcher(Needs::CacheFill)?;
                Source::Cached {
                    cache: settings
                        .cache
                        .builder(name)
                        .build_with_batcher(batcher.clone())?,
                    batcher,
                }
            }
        };
        // The batcher validates its queue capacity; the naive path has none
        // to validate, so the value is kept in the semaphore's range here.
        let capacity = settings
            .batch
            .queue_capacity
            .clamp(1, Semaphore::MAX_PERMITS);
        Ok(Self {
            name,
            timeout: settings.timeout,
            source,
            admission: Arc::new(Semaphore::new(capacity)),
            capacity,
            admission_wait: settings.admission_wait,
            coherence: Coherence::default(),
            direct: loader,
            fresh,
        })
    }

    /// This lookup, its cache used only while `coherence` says the caches
    /// are usable (see [`crate::cluster::coherence`]).
    #[must_use]
    pub fn with_coherence(mut self, coherence: Coherence) -> Self {
        self.coherence = coherence;
        self
    }

    /// The name given at construction.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The value of `key`, or `None` if the query returns no row for it.
    ///
    /// # Errors
    ///
    /// [`Failure::Overloaded`], [`Failure::Timeout`] past the deadline, or
    /// [`Failure::Unavailable`].
    pub async fn get(&self, key: Q::Key) -> Result<Option<Q::Value>, Failure> {
        self.get_at(key, None).await
    }

    /// As [`get`](Self::get), and with a `position` (a write's WAL
    /// position the client presents), from a database that has replayed
    /// it: a replica that has, else the primary; never from the cache or
    /// a batch, which could be older.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get).
    pub async fn get_at(
        &self,
        key: Q::Key,
        position: Option<PgLsn>,
    ) -> Result<Option<Q::Value>, Failure> {
        let _admitted = self.reserve(1).await?;
        if let Some(lsn) = position {
            let direct = self.direct.needing(self.at(lsn));
            return self.within_deadline(direct.load_one(&key)).await;
        }
        match &self.source {
            Source::Naive(loader) => self.within_deadline(loader.load_one(&key)).await,
            Source::Batched(batcher) => Ok(batcher.load(key).await?),
            Source::Cached { batcher, .. } if !self.coherence.caches_usable() => {
                Ok(batcher.load(key).await?)
            }
            Source::Cached { cache, .. } => Ok(cache.get(key).await?),
        }
    }

    /// The values of `keys`, in order. The batched and cached paths ask for
    /// all of them at once, so their misses share batches; the naive path
    /// asks one after another under one deadline.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get): the first key's failure fails the call.
    /// [`Failure::Overloaded`] comes before any key is queued.
    pub async fn get_many(&self, keys: Vec<Q::Key>) -> Result<Vec<Option<Q::Value>>, Failure> {
        let reservation = self.reserve(keys.len()).await?;
        self.get_many_reserved(keys, reservation, None).await
    }

    /// Room for up to `keys` keys of a later
    /// [`get_many_reserved`](Self::get_many_reserved), taken now, for
    /// example before the request's body is read. A request of more keys
    /// than the whole capacity takes all of it.
    ///
    /// # Errors
    ///
    /// [`Failure::Overloaded`] when there is not that much room within
    /// the admission wait.
    pub async fn reserve(&self, keys: usize) -> Result<Reservation, Failure> {
        let permits = u32::try_from(keys.clamp(1, self.capacity)).unwrap_or(u32::MAX);
        let admission = Arc::clone(&self.admission);
        // The common case, room at once, sets no timer.
        if let Ok(permit) = Arc::clone(&admission).try_acquire_many_owned(permits) {
            return Ok(Reservation(permit));
        }
        match tokio::time::timeout(self.admission_wait, admission.acquire_many_owned(permits)).await
        {
            Ok(Ok(permit)) => Ok(Reservation(permit)),
            // Timed out, or the semaphore closed (never done here).
            _ => Err(Failure::Overloaded),
        }
    }

    /// As [`get_many`](Self::get_many), in room already reserved; room
    /// beyond what `keys` need is given back at once. With a `position`,
    /// as [`get_at`](Self::get_at): all keys in one statement on a
    /// database that has replayed it.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get).
    pub async fn get_many_reserved(
        &self,
        keys: Vec<Q::Key>,
        mut reservation: Reservation,
        position: Option<PgLsn>,
    ) -> Result<Vec<Option<Q::Value>>, Failure> {
        let needed = keys.len().clamp(1, self.capacity);
        // Dropped here: the surplus returns to other requests now, not
        // when this one finishes.
        let _surplus = reservation
            .0
            .split(reservation.0.num_permits().saturating_sub(needed));
        if let Some(lsn) = position {
            let direct = self.direct.needing(self.at(lsn));
            let found = self.within_deadline(direct.load(keys.clone())).await?;
            return keys
                .iter()
                .map(|key| match found.answer(key) {
                    Ok(value) => Ok(value.cloned()),
                    Err(e) => Err(Failure::from(pgbatch::Error::Load(Arc::clone(e)))),
                })
                .collect();
        }
        match &self.source {
            Source::Naive(loader) => {
                self.within_deadline(async {
                    let mut out = Vec::with_capacity(keys.len());
                    for key in &keys {
                        out.push(loader.load_one(key).await?);
                    }
                    Ok(out)
                })
                .await
            }
            Source::Batched(batcher) => collect(batcher.load_many(keys).await),
            Source::Cached { batcher, .. } if !self.coherence.caches_usable() => {
                collect(batcher.load_many(keys).await)
            }
            // Polled together in this task: a cache load runs in a task of
            // its own, so nothing is gained by spawning one per key.
            Source::Cached { cache, .. } => {
                collect(join_all(keys.into_iter().map(|key| cache.get(key))).await)
            }
        }
    }

    /// What a read at a client's position `lsn` needs: that position, and
    /// for a fresh lookup what a cache fill needs too (an old or forged
    /// position must not let a replica answer that has not replayed a
    /// revocation this instance has applied).
    fn at(&self, lsn: PgLsn) -> Needs {
        if self.fresh {
            Needs::CacheFillAt(lsn)
        } else {
            Needs::Position(lsn)
        }
    }

    /// The query this lookup runs.
    pub fn query(&self) -> &Q {
        self.direct.query()
    }

    /// Drops `key` from the cache, if there is one (after a write to it).
    /// Once this returns, no load that started before can put an old value
    /// back.
    pub async fn invalidate(&self, key: &Q::Key) {
        if let Source::Cached { cache, .. } = &self.source {
            self.direct.router().begin_invalidation();
            cache.invalidate(key).await;
        }
    }

    /// Drops every cached value (after a write whose keys are not tracked).
    pub fn invalidate_all(&self) {
        if let Source::Cached { cache, .. } = &self.source {
            self.direct.router().begin_invalidation();
            cache.invalidate_all();
        }
    }

    /// The batcher's statistics (batched and cached paths).
    pub fn batcher_stats(&self) -> Option<StatsSnapshot> {
        match &self.source {
            Source::Naive(_) => None,
            Source::Batched(batcher) | Source::Cached { batcher, .. } => Some(batcher.stats()),
        }
    }

    /// Applies the cache's pending bookkeeping (cached path), so its entry
    /// count is current: moka counts inserts lazily.
    pub async fn sync_cache(&self) {
        if let Source::Cached { cache, .. } = &self.source {
            cache.run_pending_tasks().await;
        }
    }

    /// The cache's statistics (cached path).
    pub fn cache_stats(&self) -> Option<CacheStats> {
        match &self.source {
            Source::Cached { cache, .. } => Some(cache.stats()),
            _ => None,
        }
    }

    /// Stops the batcher, if any, after answering what it holds.
    pub async fn shutdown(&self) {
        if let Source::Batched(batcher) | Source::Cached { batcher, .. } = &self.source {
            batcher.shutdown().await;
        }
    }

    /// Gives a naive lookup the deadline the batcher gives its requests.
    async fn within_deadline<T>(
        &self,
        lookup: impl Future<Output = Result<T, PgError>>,
    ) -> Result<T, Failure> {
        match tokio::time::timeout(self.timeout, lookup).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(Failure::Timeout(Work::Read)),
        }
    }
}

/// Room reserved for keys in flight through a [`Lookup`], from
/// [`Lookup::reserve`]; given back when dropped.
#[derive(Debug)]
pub struct Reservation(OwnedSemaphorePermit);

/// All values, or the first failure.
fn collect<V>(results: Vec<Result<Option<V>, pgbatch::Error>>) -> Result<Vec<Option<V>>, Failure> {
    results
        .into_iter()
        .map(|r| r.map_err(Failure::from))
        .collect()
}
