//! The caller-facing handle of a batcher.

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::iter;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use tokio::sync::oneshot;
use tokio::time::{timeout_at, Instant};
use tracing::Instrument as _;

use super::config::{Config, Overflow};
use super::ledger::{self, Idle};
use super::loader::Loader;
use super::message::{Message, Reply, Rx};
#[cfg(feature = "cache")]
use super::observer::ObserverFn;
use super::observer::{ObserverSlot, Stamp};
use super::policy;
use super::queue::{self, PushError, Sender};
use super::run::{self, Answered, LoadFn};
use super::shared::{LoadSlot, Shared};
use super::worker::Worker;
use crate::error::{TimedOut, Waited};
use crate::stats::{Stats, StatsSnapshot};
use crate::Error;

/// Coalesces concurrent single-key lookups into batched loads.
///
/// A `Batcher` is a cheap handle (`Clone + Send + Sync`): clone it into every
/// task that needs lookups. Each [`load`](Self::load) sends its key over a
/// bounded queue to one worker task, which groups keys into batches,
/// hands each batch to the [`Loader`], and routes every value back to the
/// callers that asked for it.
///
/// ```
/// use std::collections::HashMap;
/// use std::convert::Infallible;
/// use pgbatch::{loader_fn, Batcher};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), pgbatch::Error> {
/// // In real use this is one `SELECT ... WHERE key = ANY($1)`.
/// let loader = loader_fn(|keys: Vec<u64>| async move {
///     Ok::<_, Infallible>(
///         keys.into_iter()
///             .filter(|k| k % 2 == 0)
///             .map(|k| (k, format!("row {k}")))
///             .collect::<HashMap<_, _>>(),
///     )
/// });
/// let batcher = Batcher::new(loader);
///
/// // Concurrent lookups are served by as few loader calls as possible.
/// let (a, b) = tokio::join!(batcher.load(2), batcher.load(3));
/// assert_eq!(a?, Some("row 2".to_string()));
/// assert_eq!(b?, None); // not found
///
/// batcher.shutdown().await;
/// # Ok(()) }
/// ```
///
/// The worker stops when [`shutdown`](Self::shutdown) is called or the last
/// handle is dropped; requests already queued are still loaded and
/// answered, and later ones fail with [`Error::Closed`].
///
/// # Scopes
///
/// A batcher built with
/// [`build_scoped`](crate::BatcherBuilder::build_scoped) over a
/// [`ScopedLoader`](crate::ScopedLoader) is a `Batcher<K, V, S>`: each
/// caller says who it loads as, a scope `S` (a tenant, a database role and
/// its settings), with [`load_as`](Self::load_as). Keys of different
/// scopes never share a load, and a load's answers reach only its scope's
/// callers; scopes with waiting keys take turns at the loads in flight, so
/// a busy one cannot starve the others. Unscoped, `S` is `()` and
/// [`load`](Self::load) needs none.
pub struct Batcher<K, V, S = ()> {
    // One `Arc` for everything, so a clone (one per task, often one per
    // request) is one atomic increment instead of one per field. Padded so
    // that increment, from every core, does not evict the fields each
    // request reads: they sit on a cache line of their own.
    inner: Arc<CachePadded<Inner<K, V, S>>>,
}

struct Inner<K, V, S> {
    tx: Sender<Message<S, K, V>>,
    shared: Arc<Shared>,
    /// For direct loads (see [`BatcherBuilder::direct_when_idle`](crate::BatcherBuilder::direct_when_idle)).
    load: LoadFn<S, K, V>,
    /// Whoever watches the loads (a cache built over this batcher), if any
    /// (see [`super::observer`]).
    #[cfg_attr(not(feature = "cache"), allow(dead_code))]
    observer: ObserverSlot<S, K, V>,
}

impl<K, V, S> Clone for Batcher<K, V, S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K, V, S> fmt::Debug for Batcher<K, V, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batcher")
            .field("name", &self.inner.shared.config.name)
            .field("closed", &self.inner.tx.is_closed())
            .finish_non_exhaustive()
    }
}

pub(crate) fn pair<K, V, S>(
    config: Config,
    load: LoadFn<S, K, V>,
) -> (Batcher<K, V, S>, Worker<K, V, S>)
where
    K: Clone + Eq + Hash + Send + 'static,
    V: Clone + Send + 'static,
    S: Clone + Eq + Hash + Send + Sync + 'static,
{
    let (tx, rx) = queue::queue(config.channel_capacity, config.overflow == Overflow::Wait);
    let shared = Arc::new(Shared::new(config));
    #[cfg(feature = "metrics")]
    shared.stats.export(&shared.config.name);
    if shared.config.scope_stats > 0 {
        let counts = crate::stats::ScopeCounts::new(shared.config.scope_stats, &shared.config.name);
        let _ = shared.stats.by_scope.set(counts); // set once, here
    }
    let observer = ObserverSlot::default();
    let worker = Worker::new(
        rx,
        Arc::clone(&load),
        Arc::clone(&shared),
        Arc::clone(&observer),
    );
    let inner = Arc::new(CachePadded::new(Inner {
        tx,
        shared,
        load,
        observer,
    }));
    (Batcher { inner }, worker)
}

#[cfg(feature = "cache")]
impl<K, V, S> Batcher<K, V, S> {
    /// Whether the loader counts `value` as "not found" (an empty list or
    /// page, a `LEFT JOIN`'s empty side): a cache shares none such between
    /// scopes.
    pub(crate) fn is_absent(&self, value: &V) -> bool {
        !self.inner.load.found(Some(value))
    }
}

impl<K, V> Batcher<K, V>
where
    K: Clone + Eq + Hash + Send + 'static,
    V: Clone + Send + 'static,
{
    /// A batcher with the default settings, its worker spawned on the
    /// current Tokio runtime. Use [`builder`](Self::builder) to configure.
    ///
    /// # Panics
    ///
    /// When called outside a Tokio runtime, like [`tokio::spawn`].
    /// [`BatcherBuilder::build`](crate::BatcherBuilder::build) reports that as an error instead.
    pub fn new<L: Loader<K, V>>(loader: L) -> Self {
        let (batcher, worker) = Self::pair(loader);
        tokio::spawn(worker.run());
        batcher
    }

    /// A batcher with the default settings and its worker, not spawned:
    /// the batcher answers nothing until [`Worker::run`] is polled.
    pub fn pair<L: Loader<K, V>>(loader: L) -> (Self, Worker<K, V>) {
        pair(Config::default(), run::load_fn(loader))
    }

    /// Looks up one key: `Ok(Some(value))` if the loader returned it,
    /// `Ok(None)` if the loader was asked and did not return it.
    ///
    /// # Errors
    ///
    /// - [`Error::Overloaded`] when the queue is full, or the worker already
    ///   holds as many waiters as it may, and the overflow policy is
    ///   [`Overflow::Reject`] (the default);
    /// - [`Error::Timeout`] when the [`timeout`](crate::BatcherBuilder::timeout)
    ///   passes first;
    /// - [`Error::Load`], [`Error::LoaderPanicked`] or [`Error::LoadTimeout`]
    ///   when this key's batch failed (every caller in it gets the same
    ///   error), or [`Error::Load`] when the loader failed this key alone;
    /// - [`Error::Closed`] after shutdown.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future is safe. Dropped before its batch is dispatched,
    /// the key is not loaded unless another caller also wants it; dropped
    /// later, the load goes on for the other callers of the batch, which are
    /// not affected.
    pub async fn load(&self, key: K) -> Result<Option<V>, Error> {
        self.load_as(&(), key).await
    }

    /// Looks up several keys, returning one result per key in the order
    /// given. All keys are queued before any answer is awaited, so they
    /// share batches; one deadline covers the whole call.
    ///
    /// Each result is what [`load`](Self::load) would have returned for that
    /// key; with [`Overflow::Reject`], keys that found the queue full get
    /// [`Error::Overloaded`] while the others are still loaded.
    ///
    /// # Cancel safety
    ///
    /// As for [`load`](Self::load).
    pub async fn load_many<I>(&self, keys: I) -> Vec<Result<Option<V>, Error>>
    where
        I: IntoIterator<Item = K>,
    {
        self.load_many_as(&(), keys).await
    }
}

impl<K, V, S> Batcher<K, V, S>
where
    K: Clone + Eq + Hash + Send + 'static,
    V: Clone + Send + 'static,
    S: Clone + Eq + Hash + Send + Sync + 'static,
{
    /// Looks up one key as `scope`: as [`load`](Batcher::load), in a load
    /// of that scope alone. Its answer never comes from a load of another
    /// scope.
    ///
    /// # Errors
    ///
    /// As [`load`](Batcher::load); a load that failed for `scope` (a role
    /// the database refuses, say) fails that scope's callers alone.
    ///
    /// # Cancel safety
    ///
    /// As for [`load`](Batcher::load): dropping the future never cancels a
    /// load other callers wait for.
    pub async fn load_as(&self, scope: &S, key: K) -> Result<Option<V>, Error> {
        let now = Instant::now();
        let deadline = self.inner.shared.config.deadline(now);
        if let Some(slot) = self.direct_slot() {
            return self
                .load_direct(scope.clone(), key, now, deadline, slot)
                .await;
        }
        let rx = self
            .enqueue(scope.clone(), key, now, deadline, None)
            .await?;
        self.wait(rx, deadline).await
    }

    /// Looks up several keys as `scope`: as
    /// [`load_many`](Batcher::load_many), in loads of that scope alone.
    ///
    /// # Cancel safety
    ///
    /// As for [`load`](Batcher::load).
    pub async fn load_many_as<I>(&self, scope: &S, keys: I) -> Vec<Result<Option<V>, Error>>
    where
        I: IntoIterator<Item = K>,
    {
        self.load_all(
            scope,
            keys.into_iter().map(|key| (key, None)),
            Instant::now(),
        )
        .await
    }

    /// An observer's [`load_as`](Self::load_as) (a cache miss): `stamp` is
    /// the observer's for `key` when the caller asked (see
    /// [`super::observer`]), and `asked_at` when it looked for the key and
    /// missed: what a load stored since, the worker may answer from.
    /// Always through the worker, which alone knows which loads are
    /// running, so concurrent requests of a key share one load.
    #[cfg(feature = "cache")]
    pub(crate) async fn load_stamped(
        &self,
        scope: &S,
        key: K,
        stamp: Stamp,
        asked_at: Instant,
    ) -> Result<Option<V>, Error> {
        let deadline = self.inner.shared.config.deadline(asked_at);
        let rx = self
            .enqueue(scope.clone(), key, asked_at, deadline, Some(stamp))
            .await?;
        self.wait(rx, deadline).await
    }

    /// Makes `observer` the one told of every load's stamped keys; `false`
    /// if another already is.
    #[cfg(feature = "cache")]
    pub(crate) fn observe(&self, observer: ObserverFn<S, K, V>) -> bool {
        self.inner.observer.set(observer).is_ok()
    }

    /// An observer's [`load_many_as`](Self::load_many_as), each key with
    /// its stamp, all asked at `asked_at` (see
    /// [`load_stamped`](Self::load_stamped)).
    #[cfg(feature = "cache")]
    pub(crate) async fn load_many_stamped(
        &self,
        scope: &S,
        keys: Vec<(K, Stamp)>,
        asked_at: Instant,
    ) -> Vec<Result<Option<V>, Error>> {
        self.load_all(
            scope,
            keys.into_iter().map(|(key, stamp)| (key, Some(stamp))),
            asked_at,
        )
        .await
    }

    /// Queues every key before awaiting any answer, so they share batches.
    async fn load_all(
        &self,
        scope: &S,
        keys: impl Iterator<Item = (K, Option<Stamp>)>,
        now: Instant,
    ) -> Vec<Result<Option<V>, Error>> {
        let deadline = self.inner.shared.config.deadline(now);
        let mut queued = Vec::with_capacity(keys.size_hint().0);
        for (key, stamp) in keys {
            queued.push(self.enqueue(scope.clone(), key, now, deadline, stamp).await);
        }
        let mut out = Vec::with_capacity(queued.len());
        for rx in queued {
            out.push(match rx {
                Ok(rx) => self.wait(rx, deadline).await,
                Err(e) => Err(e),
            });
        }
        out
    }

    /// Stops the worker and waits for it to finish: requests already queued
    /// are loaded and answered, new ones fail with [`Error::Closed`].
    ///
    /// Every handle sees the shutdown. Returns at once if the worker has
    /// already stopped; for a worker from [`pair`](Self::pair), only
    /// returns once that worker has run to completion or been dropped.
    pub async fn shutdown(&self) {
        self.inner.shared.shutdown.cancel();
        self.inner.shared.done.cancelled().await;
    }

    /// Whether the worker no longer accepts requests (shut down or gone).
    pub fn is_closed(&self) -> bool {
        self.inner.tx.is_closed()
    }

    /// A snapshot of this batcher's counters and histograms.
    pub fn stats(&self) -> StatsSnapshot {
        let queued = self.inner.tx.len();
        let shared = &self.inner.shared;
        shared.stats.snapshot(queued, shared.limit())
    }

    /// A load slot for a caller that found the batcher idle (no load
    /// running, nothing queued or pending at the worker), if the settings
    /// allow direct loads and the worker is there to take over once the
    /// batcher is busy.
    fn direct_slot(&self) -> Option<LoadSlot> {
        let shared = &self.inner.shared;
        let idle = || Idle {
            serving: shared.is_worker_running()
                && !shared.shutdown.is_cancelled()
                && !self.inner.tx.is_closed(),
            waiting: shared.stats.pending_keys.load(Relaxed) as usize + self.inner.tx.len(),
        };
        if !ledger::loads_directly(&shared.config, shared.running_loads(), idle) {
            return None;
        }
        LoadSlot::try_take_first(shared)
    }

    /// A load of one key in the caller's task: the same answers, errors,
    /// statistics and span as through the worker, without the hand-offs.
    async fn load_direct(
        &self,
        scope: S,
        key: K,
        now: Instant,
        deadline: Option<Instant>,
        _slot: LoadSlot,
    ) -> Result<Option<V>, Error> {
        let (shared, load) = (&self.inner.shared, &self.inner.load);
        Stats::incr(&shared.stats.requests, 1);
        let none = tracing::Span::none();
        let label = |_| load.label(&scope).map(Into::into);
        let span = run::begin(shared, true, &[1], label, iter::once((now, &none)), now);
        let started = Instant::now();
        let outcome = run::contain(
            load.start(vec![(scope, vec![key.clone()])]),
            shared.config.load_timeout,
        )
        .instrument(span.clone());
        let outcome = self.within(deadline, outcome).await.map_err(|e| match e {
            Error::Timeout(t) => {
                Error::Timeout(TimedOut::new(t.after(), Waited::InALoad(started.elapsed())))
            }
            e => e,
        })?;
        let stats = &shared.stats;
        Stats::record_duration(&stats.load_duration, started.elapsed());
        let _enter = span.enter();
        let settled = outcome.settle(stats, &[1]).pop().expect("one group");
        let answer = settled?.take(&key);
        let mut answered = Answered::default();
        let found = answer.as_ref().is_ok_and(|v| load.found(v.as_ref()));
        answered.count(&answer, found);
        answered.record(stats);
        answer.map_err(Error::Load)
    }

    /// `work`'s output, or the caller's timeout (counted) once `deadline`
    /// passes.
    async fn within<T>(
        &self,
        deadline: Option<Instant>,
        work: impl Future<Output = T>,
    ) -> Result<T, Error> {
        let Some(deadline) = deadline else {
            return Ok(work.await);
        };
        timeout_at(deadline, work).await.map_err(|_| {
            Stats::incr(&self.inner.shared.stats.timed_out, 1);
            let after = self.inner.shared.config.timeout.unwrap_or_default();
            Error::Timeout(TimedOut::new(after, Waited::Unknown))
        })
    }

    async fn enqueue(
        &self,
        scope: S,
        key: K,
        now: Instant,
        deadline: Option<Instant>,
        stamp: Option<Stamp>,
    ) -> Result<Rx<V>, Error> {
        let (tx, rx) = oneshot::channel();
        let msg = Message {
            scope,
            key,
            tx,
            enqueued_at: now,
            span: tracing::Span::current(),
            stamp,
        };
        match self.inner.shared.config.overflow {
            Overflow::Reject => self.inner.tx.try_push(msg).map_err(|e| match e {
                PushError::Full(_) => {
                    Stats::incr(&self.inner.shared.stats.overloaded, 1);
                    Error::Overloaded
                }
                PushError::Closed(_) => Error::Closed,
            })?,
            Overflow::Wait => self
                .within(deadline, self.inner.tx.push(msg))
                .await?
                .map_err(|_| Error::Closed)?,
        }
        Ok(rx)
    }

    async fn wait(&self, rx: Rx<V>, deadline: Option<Instant>) -> Result<Option<V>, Error> {
        let shared = &self.inner.shared;
        // A running worker that enforces deadlines answers the timeout
        // itself; a worker not yet run cannot, so the caller keeps its own.
        let worker_times_out =
            policy::worker_enforces_deadlines(&shared.config) && shared.is_worker_running();
        let deadline = deadline.filter(|_| !worker_times_out);
        let reply: Result<Reply<V>, _> = self.within(deadline, rx).await?;
        // The worker dropped our sender without answering: it is gone.
        reply.unwrap_or(Err(Error::Closed))
    }
}
