//! The [`Cache`] itself: moka as the store, and the flights (one running
//! load per key) that coalesce concurrent misses.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};

use futures_util::FutureExt as _;
use moka::ops::compute::Op;
use tokio::sync::Notify;

use super::admission::Doorkeeper;
use super::CacheBuilder;
use crate::Error;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
pub(super) type LoadFn<K, V> = Arc<dyn Fn(K) -> BoxFuture<Result<Option<V>, Error>> + Send + Sync>;

/// What the store holds for a key.
#[derive(Debug, Clone)]
pub(super) enum Cached<V> {
    Found(V),
    /// Only stored with a negative TTL.
    NotFound,
}

/// The answer a flight delivers to its waiters.
type Answer<V> = Result<Option<V>, Error>;

/// A load in progress for one key.
struct Flight<V> {
    /// Set once, before `notify` wakes the waiters. (A watch channel
    /// notifies eight shards on every send, waiters or not: a measurable
    /// share of a miss.)
    answer: OnceLock<Answer<V>>,
    notify: Notify,
    /// Set by invalidation: the load must not store its result.
    stale: AtomicBool,
    /// [`Inner::epoch`] when the load started.
    epoch: u64,
}

struct Inner<K, V> {
    store: moka::future::Cache<K, Cached<V>>,
    /// std Mutex: held only for map operations, never across an await.
    flights: Mutex<HashMap<K, Arc<Flight<V>>>>,
    load: LoadFn<K, V>,
    cache_not_found: bool,
    /// With [`Admission::SecondMiss`](super::Admission::SecondMiss).
    doorkeeper: Option<Doorkeeper>,
    counters: Arc<Counters>,
    /// Bumped by `invalidate_all` before it clears the store. moka's
    /// `invalidate_all` is not serialized with a key's compute, so a load
    /// that saw no `stale` just before could still store after it; the
    /// load checks this after storing and removes its value itself.
    epoch: AtomicU64,
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    coalesced: AtomicU64,
    load_errors: AtomicU64,
    not_admitted: AtomicU64,
    pub(super) evictions: AtomicU64,
    pub(super) expirations: AtomicU64,
    invalidations: AtomicU64,
}

/// A point-in-time copy of a cache's counters, from [`Cache::stats`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that started a load (one per load).
    pub misses: u64,
    /// Lookups that waited for a load another lookup had started.
    pub coalesced: u64,
    /// Loads that failed (their errors are not cached).
    pub load_errors: u64,
    /// Loaded values not stored because it was their key's first miss in
    /// the window ([`Admission::SecondMiss`](super::Admission::SecondMiss)).
    pub not_admitted: u64,
    /// Entries evicted to stay within capacity.
    pub evictions: u64,
    /// Entries that expired.
    pub expirations: u64,
    /// Entries removed by `invalidate` or `invalidate_all`.
    pub invalidations: u64,
    /// Entries held now (approximate; see moka's `entry_count`).
    pub entries: u64,
}

/// A coalescing TTL cache; see the [module docs](super). Cheap to clone.
pub struct Cache<K, V> {
    inner: Arc<Inner<K, V>>,
}

impl<K, V> Clone for Cache<K, V> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K, V> fmt::Debug for Cache<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("name", &self.inner.store.name())
            .field("entries", &self.inner.store.entry_count())
            .finish_non_exhaustive()
    }
}

impl<K, V> Cache<K, V>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Starts configuring a cache.
    pub fn builder() -> CacheBuilder<K, V> {
        CacheBuilder::default()
    }

    /// A cache over a configured moka `store`; [`CacheBuilder`] makes both.
    pub(super) fn new(
        store: moka::future::Cache<K, Cached<V>>,
        load: LoadFn<K, V>,
        cache_not_found: bool,
        doorkeeper: Option<Doorkeeper>,
        counters: Arc<Counters>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                flights: Mutex::new(HashMap::new()),
                load,
                cache_not_found,
                doorkeeper,
                counters,
                epoch: AtomicU64::new(0),
            }),
        }
    }

    /// The value for `key`: from the cache, or loaded (once, however many
    /// callers ask at the same time) and then cached. `Ok(None)` means the
    /// loader found nothing.
    ///
    /// # Errors
    ///
    /// The loader's error, shared by every caller that waited for that load;
    /// [`Error::LoaderPanicked`] if the load panicked. Neither is cached.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future is safe and affects no other caller. The first
    /// caller to miss drives the load in its own task (a task per miss
    /// would cost more than the batched load it wraps); dropped before the
    /// load finishes, it hands the rest to a spawned task, which still
    /// answers the other callers and fills the cache.
    pub async fn get(&self, key: K) -> Result<Option<V>, Error> {
        let inner = &self.inner;
        if let Some(cached) = inner.store.get(&key).await {
            inner.counters.hits.fetch_add(1, Relaxed);
            return Ok(match cached {
                Cached::Found(v) => Some(v),
                Cached::NotFound => None,
            });
        }
        let run = match self.join_or_start(key) {
            Role::Follower(flight) => return flight.wait().await,
            Role::Leader(run) => run,
        };
        // The first caller drives the load itself: a task per miss cost
        // more than the batched load it wraps. If this caller is dropped
        // first, `Lead` hands the rest of the load to a task.
        let mut lead = Lead(Some(run));
        let answer = match lead.0.as_mut() {
            Some(run) => run.await,
            None => Err(Error::Closed),
        };
        lead.0 = None;
        answer
    }

    /// Removes `key`. A load for it already running still answers its
    /// callers but does not store its result, so later lookups load afresh.
    pub async fn invalidate(&self, key: &K) {
        let flight = self.lock_flights().remove(key);
        if let Some(flight) = flight {
            flight.stale.store(true, Relaxed);
        }
        self.inner.counters.invalidations.fetch_add(1, Relaxed);
        // Through the same per-key serialization as the loads' puts, so
        // a put either sees `stale` or is removed here.
        self.inner
            .store
            .entry(key.clone())
            .and_compute_with(|_| async { Op::Remove })
            .await;
    }

    /// Removes every entry; running loads do not store their results.
    pub fn invalidate_all(&self) {
        // Before the store is cleared: see `Inner::epoch`.
        self.inner.epoch.fetch_add(1, SeqCst);
        for (_, flight) in self.lock_flights().drain() {
            flight.stale.store(true, Relaxed);
        }
        self.inner.counters.invalidations.fetch_add(1, Relaxed);
        self.inner.store.invalidate_all();
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> CacheStats {
        let c = &self.inner.counters;
        CacheStats {
            hits: c.hits.load(Relaxed),
            misses: c.misses.load(Relaxed),
            coalesced: c.coalesced.load(Relaxed),
            load_errors: c.load_errors.load(Relaxed),
            not_admitted: c.not_admitted.load(Relaxed),
            evictions: c.evictions.load(Relaxed),
            expirations: c.expirations.load(Relaxed),
            invalidations: c.invalidations.load(Relaxed),
            entries: self.inner.store.entry_count(),
        }
    }

    /// Runs moka's pending housekeeping (expirations, evictions, counts)
    /// now instead of lazily; useful in tests and before reading stats.
    pub async fn run_pending_tasks(&self) {
        self.inner.store.run_pending_tasks().await;
    }

    fn lock_flights(&self) -> std::sync::MutexGuard<'_, HashMap<K, Arc<Flight<V>>>> {
        // A panic while holding this lock cannot leave the map half-updated
        // (single inserts and removes), so a poisoned lock is still usable.
        self.inner
            .flights
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Joins the running load for `key`, or makes the caller the leader
    /// of a new one: it gets the load to drive.
    fn join_or_start(&self, key: K) -> Role<V> {
        let mut flights = self.lock_flights();
        if let Some(flight) = flights.get(&key) {
            self.inner.counters.coalesced.fetch_add(1, Relaxed);
            return Role::Follower(Arc::clone(flight));
        }
        self.inner.counters.misses.fetch_add(1, Relaxed);
        let flight = Arc::new(Flight {
            answer: OnceLock::new(),
            notify: Notify::new(),
            stale: AtomicBool::new(false),
            epoch: self.inner.epoch.load(SeqCst),
        });
        flights.insert(key.clone(), Arc::clone(&flight));
        drop(flights);
        Role::Leader(Box::pin(run_flight(Arc::clone(&self.inner), key, flight)))
    }
}

/// What a miss does: wait for another caller's load, or drive its own.
enum Role<V> {
    Follower(Arc<Flight<V>>),
    Leader(BoxFuture<Result<Option<V>, Error>>),
}

impl<V: Clone> Flight<V> {
    /// The flight's answer, once its leader (or the task it handed the
    /// load to) has set it.
    async fn wait(&self) -> Answer<V> {
        loop {
            let notified = self.notify.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check, so a wake-up between the check
            // and the await is not lost.
            notified.as_mut().enable();
            if let Some(answer) = self.answer.get() {
                return answer.clone();
            }
            notified.await;
        }
    }
}

impl<V> Flight<V> {
    /// Sets the answer (unless set already) and wakes the waiters.
    fn answer(&self, answer: Answer<V>) {
        let _ = self.answer.set(answer);
        self.notify.notify_waiters();
    }
}

/// A leader's load, handed to a task if the leader is dropped before it
/// finishes, so the callers waiting on it still get their answer and the
/// cache is still filled (a cancelled caller hurts nobody).
struct Lead<V: Send + 'static>(Option<BoxFuture<Result<Option<V>, Error>>>);

impl<V: Send + 'static> Drop for Lead<V> {
    fn drop(&mut self) {
        let Some(run) = self.0.take() else { return };
        // Outside a runtime (the runtime itself shutting down) the load is
        // dropped; its waiters then get an error instead of hanging.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = run.await;
            });
        }
    }
}

/// Removes a flight from the map when its load ends, however it ends
/// (panics and drops included), unless invalidation already replaced it.
struct FlightGuard<K: Eq + Hash, V> {
    inner: Arc<Inner<K, V>>,
    key: K,
    flight: Arc<Flight<V>>,
}

impl<K: Eq + Hash, V> Drop for FlightGuard<K, V> {
    fn drop(&mut self) {
        let mut flights = self
            .inner
            .flights
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if flights
            .get(&self.key)
            .is_some_and(|f| Arc::ptr_eq(f, &self.flight))
        {
            flights.remove(&self.key);
        }
        drop(flights);
        // A load dropped before answering (its leader dropped where no
        // runtime could take it over): its waiters must not hang.
        if self.flight.answer.get().is_none() {
            self.flight.answer(Err(Error::LoaderPanicked(
                "cache load ended without an answer".into(),
            )));
        }
    }
}

/// Loads `key`, stores the result unless invalidated meanwhile, and
/// answers the flight's waiters; returns the result to its leader.
async fn run_flight<K, V>(
    inner: Arc<Inner<K, V>>,
    key: K,
    flight: Arc<Flight<V>>,
) -> Result<Option<V>, Error>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    let guard = FlightGuard {
        inner: Arc::clone(&inner),
        key: key.clone(),
        flight: Arc::clone(&flight),
    };
    // The load runs in its leader's task now, so its panic must not
    // become the caller's: it fails this load's waiters instead.
    let result = AssertUnwindSafe((inner.load)(key.clone()))
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            Err(Error::LoaderPanicked(
                crate::error::panic_message(&*panic).into(),
            ))
        });
    let to_store = match &result {
        Ok(Some(v)) => Some(Cached::Found(v.clone())),
        Ok(None) if inner.cache_not_found => Some(Cached::NotFound),
        Ok(None) => None,
        Err(_) => {
            inner.counters.load_errors.fetch_add(1, Relaxed);
            None
        }
    };
    let to_store = to_store.filter(|_| {
        let admitted = inner.doorkeeper.as_ref().is_none_or(|d| d.admit(&key));
        if !admitted {
            inner.counters.not_admitted.fetch_add(1, Relaxed);
        }
        admitted
    });
    if let Some(value) = to_store {
        // Boxed: moka's compute future is large, and inline it would make
        // every miss's future a large allocation, filled or not.
        Box::pin(store(&inner, &key, &flight, value)).await;
    }
    // Stored before answering, so a caller that got this answer and asks
    // again finds it in the cache.
    flight.answer(result.clone());
    drop(guard);
    result
}

/// Puts a loaded `value` for `key` unless invalidation marked its flight
/// stale (or `invalidate_all` ran) since the load started.
async fn store<K, V>(inner: &Inner<K, V>, key: &K, flight: &Flight<V>, value: Cached<V>)
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    let current = |flight: &Flight<V>| {
        !flight.stale.load(Relaxed) && inner.epoch.load(SeqCst) == flight.epoch
    };
    let stored = inner
        .store
        .entry(key.clone())
        .and_compute_with(|_| {
            let op = if current(flight) {
                Op::Put(value)
            } else {
                Op::Nop
            };
            async move { op }
        })
        .await;
    // An `invalidate_all` between the check and the put: the store may
    // have been cleared before the put landed (see `Inner::epoch`).
    if matches!(
        stored,
        moka::ops::compute::CompResult::Inserted(_)
            | moka::ops::compute::CompResult::ReplacedWith(_)
    ) && !current(flight)
    {
        inner.store.invalidate(key).await;
    }
}
