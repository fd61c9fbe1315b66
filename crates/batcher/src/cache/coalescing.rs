//! The [`Cache`] itself: moka as the store, and where misses go. Over a
//! [`Batcher`] (the fast path), each miss is a stamped request to the
//! batcher, whose worker keeps one load per key and fills the store from
//! the load's completion (see `FillFrom`); over any other loader, the
//! flights here (one running load per key) coalesce concurrent misses.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};

use futures_util::future::Shared as SharedFuture;
use futures_util::FutureExt as _;
use moka::ops::compute::Op;

use super::admission::Doorkeeper;
use super::epochs::Epochs;
use crate::batcher::{Fill, FillFn, Filled, Stamp};
use crate::stats::Count;
use crate::{Batcher, Error};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
pub(super) type MissFn<K, V> = Arc<dyn Fn(K) -> BoxFuture<Result<Option<V>, Error>> + Send + Sync>;

/// What the store holds for a key.
#[derive(Debug, Clone)]
pub(super) enum Cached<V> {
    Found(V),
    /// Only stored with a negative TTL.
    NotFound,
}

impl<V> Cached<V> {
    fn into_option(self) -> Option<V> {
        match self {
            Cached::Found(v) => Some(v),
            Cached::NotFound => None,
        }
    }
}

/// The answer a flight delivers to its waiters.
type Answer<V> = Result<Option<V>, Error>;

/// A load in progress for one key, as the flights map holds it.
struct Flight<V> {
    state: Arc<FlightState>,
    /// Polled by every caller waiting for it, so whichever of them runs
    /// drives it: no task per miss (that cost more than the batched load
    /// it wraps), and a caller that stops polling without being dropped
    /// holds nobody up. Its output never panics (see `run_flight`).
    load: SharedFuture<BoxFuture<Answer<V>>>,
}

/// What invalidation tells a running load.
struct FlightState {
    /// Set by invalidation: the load must not store its result.
    stale: AtomicBool,
    /// [`Epochs::generation`] when the load started.
    generation: u64,
}

/// Where misses go.
pub(super) enum Source<K, V> {
    /// A batcher that fills the store itself (see `FillFrom`).
    Batcher(Batcher<K, V>),
    /// Any loader, coalesced by the flights.
    Load(MissFn<K, V>),
}

struct Inner<K, V> {
    store: moka::future::Cache<K, Cached<V>>,
    /// std Mutex: held only for map operations, never across an await.
    /// Only [`Source::Load`] has flights.
    flights: Mutex<HashMap<K, Flight<V>>>,
    source: Source<K, V>,
    /// The cache's hash of a key, and what tells a load whether an
    /// invalidation came after it began: a key's stamp over a batcher,
    /// the generation for the flights.
    epochs: Epochs,
    cache_not_found: bool,
    /// With [`Admission::SecondMiss`](super::Admission::SecondMiss).
    doorkeeper: Option<Doorkeeper>,
    counters: Arc<Counters>,
}

impl<K, V> Inner<K, V> {
    fn load_fn(&self) -> &MissFn<K, V> {
        match &self.source {
            Source::Load(load) => load,
            // Only flights call it, and only `Source::Load` starts them.
            Source::Batcher(_) => unreachable!("a batcher's cache has no flights"),
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    hits: Count,
    misses: Count,
    coalesced: Count,
    fills: Count,
    load_errors: Count,
    not_admitted: Count,
    pub(super) evictions: Count,
    pub(super) expirations: Count,
    invalidations: Count,
}

impl Counters {
    /// Reports every count through the `metrics` facade too, under
    /// `cache="name"` (see [`crate::metrics`]).
    #[cfg(feature = "metrics")]
    pub(super) fn export(&self, name: &str) {
        crate::metrics::export_cache(
            name,
            [
                ("pgbatch_cache_hits_total", &self.hits),
                ("pgbatch_cache_misses_total", &self.misses),
                ("pgbatch_cache_coalesced_total", &self.coalesced),
                ("pgbatch_cache_fills_total", &self.fills),
                ("pgbatch_cache_load_errors_total", &self.load_errors),
                ("pgbatch_cache_not_admitted_total", &self.not_admitted),
                ("pgbatch_cache_evictions_total", &self.evictions),
                ("pgbatch_cache_expirations_total", &self.expirations),
                ("pgbatch_cache_invalidations_total", &self.invalidations),
            ],
        );
    }
}

/// A point-in-time copy of a cache's counters, from [`Cache::stats`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that started a load (one per load).
    pub misses: u64,
    /// Lookups that waited for a load another lookup had started (over a
    /// batcher: that joined a miss of their key pending or loading).
    pub coalesced: u64,
    /// Loaded values (or "not found"s) stored. [`Cache::insert`]s are not
    /// counted.
    pub fills: u64,
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
    /// A cache over a configured moka `store`; [`CacheBuilder`](super::CacheBuilder) makes both.
    pub(super) fn new(
        store: moka::future::Cache<K, Cached<V>>,
        source: Source<K, V>,
        cache_not_found: bool,
        doorkeeper: Option<Doorkeeper>,
        counters: Arc<Counters>,
    ) -> Self {
        let inner = Arc::new_cyclic(|weak: &Weak<Inner<K, V>>| {
            let source = match source {
                Source::Batcher(batcher) => {
                    // Weak: the batcher holds its fill, and the cache holds
                    // the batcher.
                    let weak = weak.clone();
                    let fill: FillFn<K, V> = Arc::new(FillFrom {
                        cache: weak,
                        counters: Arc::clone(&counters),
                    });
                    if batcher.install_fill(fill) {
                        Source::Batcher(batcher)
                    } else {
                        // Another cache fills from this batcher: this one
                        // coalesces its misses itself, in flights.
                        Source::Load(Arc::new(move |key| {
                            let batcher = batcher.clone();
                            Box::pin(async move { batcher.load(key).await })
                        }))
                    }
                }
                load @ Source::Load(_) => load,
            };
            Inner {
                store,
                flights: Mutex::new(HashMap::new()),
                source,
                epochs: Epochs::new(),
                cache_not_found,
                doorkeeper,
                counters,
            }
        });
        Self { inner }
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
    /// Dropping the future is safe and affects no other caller, and the
    /// load still fills the cache.
    ///
    /// - Over a batcher, the load runs in the batcher's own task; a miss
    ///   always goes through its worker (never a direct load when idle),
    ///   which alone knows which loads are running.
    /// - Over another loader, the load is a shared future that every
    ///   waiting caller polls, so no task is spawned per miss (that would
    ///   cost more than the batched load it wraps) and a caller that stops
    ///   polling holds nobody up. A caller dropped before the load finishes
    ///   hands it to a spawned task, which still answers the other callers
    ///   and fills the cache.
    pub async fn get(&self, key: K) -> Result<Option<V>, Error> {
        let inner = &self.inner;
        if let Some(cached) = inner.store.get(&key).await {
            inner.counters.hits.fetch_add(1, Relaxed);
            return Ok(cached.into_option());
        }
        if let Source::Batcher(batcher) = &inner.source {
            let stamp = inner.epochs.stamp(inner.epochs.hash(&key));
            return batcher.load_stamped(key, stamp).await;
        }
        let load = self.join_or_start(key);
        let mut waiting = Waiting(Some(load));
        let answer = match waiting.0.as_mut() {
            Some(load) => load.await,
            None => Err(Error::Closed),
        };
        // Taken out before `Waiting` drops: a `Shared` that has returned
        // its output can be neither peeked nor polled again.
        waiting.0 = None;
        answer
    }

    /// The values for `keys`, one result per key in the order given, as
    /// [`get`](Self::get) would return each. Hits are answered from the
    /// cache; over a batcher, the misses are queued together, so they go
    /// out in as few loads as the batcher's
    /// [`max_batch_size`](crate::BatcherBuilder::max_batch_size) allows,
    /// under one deadline. Over another loader, the misses load
    /// concurrently, each joining a running load of its key.
    ///
    /// # Cancel safety
    ///
    /// As for [`get`](Self::get).
    pub async fn get_many<I>(&self, keys: I) -> Vec<Result<Option<V>, Error>>
    where
        I: IntoIterator<Item = K>,
    {
        let inner = &self.inner;
        let keys = keys.into_iter();
        let mut answers: Vec<Option<Answer<V>>> = Vec::with_capacity(keys.size_hint().0);
        let mut misses: Vec<(usize, K)> = Vec::new();
        for key in keys {
            match inner.store.get(&key).await {
                Some(cached) => {
                    inner.counters.hits.fetch_add(1, Relaxed);
                    answers.push(Some(Ok(cached.into_option())));
                }
                None => {
                    misses.push((answers.len(), key));
                    answers.push(None);
                }
            }
        }
        let loaded = match &inner.source {
            Source::Batcher(batcher) => {
                let stamped = misses
                    .iter()
                    .map(|(_, key)| (key.clone(), inner.epochs.stamp(inner.epochs.hash(key))))
                    .collect();
                batcher.load_many_stamped(stamped).await
            }
            Source::Load(_) => {
                futures_util::future::join_all(misses.iter().map(|(_, key)| self.get(key.clone())))
                    .await
            }
        };
        for ((index, _), answer) in misses.into_iter().zip(loaded) {
            answers[index] = Some(answer);
        }
        answers
            .into_iter()
            .map(|answer| answer.unwrap_or(Err(Error::Closed)))
            .collect()
    }

    /// What the cache holds for `key`, without loading anything: `None`
    /// when it holds nothing, `Some(None)` when it holds "not found" (only
    /// with a [`negative_ttl`](super::CacheBuilder::negative_ttl)), else
    /// `Some(Some(value))`. A find counts as a hit; nothing else is
    /// counted.
    pub async fn get_if_present(&self, key: &K) -> Option<Option<V>> {
        let cached = self.inner.store.get(key).await?;
        self.inner.counters.hits.fetch_add(1, Relaxed);
        Some(cached.into_option())
    }

    /// Puts `value` for `key`: primes the cache with a row the caller
    /// already has (one it just wrote, or read some other way). The value
    /// is stored whatever the [admission](super::CacheBuilder::admission) policy,
    /// and wins over loads of the key already running: as after
    /// [`invalidate`](Self::invalidate), none of them can replace it with
    /// what it read, though each still answers its own callers.
    ///
    /// An `invalidate` of the key that returns before this put lands wins
    /// over it: the value is then not stored.
    pub async fn insert(&self, key: K, value: V) {
        let inner = &self.inner;
        // The same order as `invalidate`: the epoch first, so a running
        // load's put (checked under the key's lock) sees it.
        let hash = inner.epochs.hash(&key);
        inner.epochs.invalidate(hash);
        // Read after the bump: only a later invalidation makes it stale.
        let stamp = inner.epochs.stamp(hash);
        let flight = self.lock_flights().remove(&key);
        if let Some(flight) = flight {
            flight.state.stale.store(true, Relaxed);
        }
        put_if_current(inner, key, Cached::Found(value), || {
            inner.epochs.is_current(stamp)
        })
        .await;
    }

    /// Removes `key`. A load for it already running still answers its
    /// callers but does not store its result, so later lookups load afresh.
    pub async fn invalidate(&self, key: &K) {
        // Before the store's remove: see `Epochs::invalidate`.
        self.inner.epochs.invalidate(self.inner.epochs.hash(key));
        let flight = self.lock_flights().remove(key);
        if let Some(flight) = flight {
            flight.state.stale.store(true, Relaxed);
        }
        self.inner.counters.invalidations.fetch_add(1, Relaxed);
        // Through the same per-key lock as the loads' puts
        // (`put_if_current`), so a put either sees `stale` or the new
        // epoch, or is removed here.
        self.inner
            .store
            .entry(key.clone())
            .and_compute_with(|_| async { Op::Remove })
            .await;
    }

    /// Removes every entry; running loads do not store their results.
    pub fn invalidate_all(&self) {
        // Before the store is cleared: see `Epochs::generation`.
        self.inner.epochs.invalidate_all();
        for (_, flight) in self.lock_flights().drain() {
            flight.state.stale.store(true, Relaxed);
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
            fills: c.fills.load(Relaxed),
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

    fn lock_flights(&self) -> std::sync::MutexGuard<'_, HashMap<K, Flight<V>>> {
        // A panic while holding this lock cannot leave the map half-updated
        // (single inserts and removes), so a poisoned lock is still usable.
        self.inner
            .flights
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Joins the running load for `key`, or starts one.
    fn join_or_start(&self, key: K) -> SharedFuture<BoxFuture<Answer<V>>> {
        let mut flights = self.lock_flights();
        if let Some(flight) = flights.get(&key) {
            self.inner.counters.coalesced.fetch_add(1, Relaxed);
            return flight.load.clone();
        }
        self.inner.counters.misses.fetch_add(1, Relaxed);
        let state = Arc::new(FlightState {
            stale: AtomicBool::new(false),
            generation: self.inner.epochs.generation(),
        });
        // Made here, not on the first poll, so a load dropped unpolled
        // still leaves the map.
        let guard = FlightGuard {
            inner: Arc::clone(&self.inner),
            key: key.clone(),
            state: Arc::clone(&state),
        };
        let run: BoxFuture<Answer<V>> = Box::pin(run_flight(
            Arc::clone(&self.inner),
            key.clone(),
            Arc::clone(&state),
            guard,
        ));
        let load = run.shared();
        flights.insert(
            key,
            Flight {
                state,
                load: load.clone(),
            },
        );
        load
    }
}

/// A caller's wait for a load. Dropped before the load finishes, it hands
/// the load to a task, so the other callers still get their answer and
/// the cache is still filled (a cancelled caller hurts nobody).
struct Waiting<V: Clone + Send + Sync + 'static>(Option<SharedFuture<BoxFuture<Answer<V>>>>);

impl<V: Clone + Send + Sync + 'static> Drop for Waiting<V> {
    fn drop(&mut self) {
        let Some(load) = self.0.take() else { return };
        if load.peek().is_some() {
            return;
        }
        // Without a runtime here the load is left to its other callers,
        // and to later ones for the same key, which join it.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = load.await;
            });
        }
    }
}

/// Removes a flight from the map when its load ends, however it ends
/// (panics and drops included), unless invalidation already replaced it.
struct FlightGuard<K: Eq + Hash, V> {
    inner: Arc<Inner<K, V>>,
    key: K,
    state: Arc<FlightState>,
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
            .is_some_and(|f| Arc::ptr_eq(&f.state, &self.state))
        {
            flights.remove(&self.key);
        }
    }
}

/// Loads `key` and stores the result unless invalidated meanwhile: the
/// answer of every caller waiting for it. Never panics: the load is
/// polled by whichever caller waits, and a shared future's panic would
/// reach all of them.
async fn run_flight<K, V>(
    inner: Arc<Inner<K, V>>,
    key: K,
    state: Arc<FlightState>,
    guard: FlightGuard<K, V>,
) -> Answer<V>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    // The whole body: the loader's synchronous part and the store's
    // weigher included.
    let answer = AssertUnwindSafe(load_and_store(&inner, &key, &state))
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            Err(Error::LoaderPanicked(
                crate::error::panic_message(&*panic).into(),
            ))
        });
    // Stored before answering, so a caller that got this answer and asks
    // again finds it in the cache.
    drop(guard);
    answer
}

async fn load_and_store<K, V>(inner: &Inner<K, V>, key: &K, state: &FlightState) -> Answer<V>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    let result = (inner.load_fn())(key.clone()).await;
    if result.is_err() {
        inner.counters.load_errors.fetch_add(1, Relaxed);
    }
    let hash = inner.epochs.hash(key);
    let value = result
        .as_ref()
        .ok()
        .and_then(|v| inner.to_store(hash, v.as_ref()));
    if let Some(value) = value {
        // Boxed: moka's compute future is large, and inline it would make
        // every miss's future a large allocation, filled or not.
        Box::pin(store(inner, key, state, value)).await;
    }
    result
}

/// Puts a loaded `value` for `key` unless invalidation marked its flight
/// stale (or `invalidate_all` ran) since the load started.
async fn store<K, V>(inner: &Inner<K, V>, key: &K, flight: &FlightState, value: Cached<V>)
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    let current = || !flight.stale.load(Relaxed) && inner.epochs.generation() == flight.generation;
    if put_if_current(inner, key.clone(), value, current).await {
        inner.counters.fills.fetch_add(1, Relaxed);
    }
}

/// Puts `value` for `key` if `current()` holds, checked under moka's lock
/// of the key, which `invalidate` takes for its remove too: a put either
/// comes before that remove or sees the invalidation.
async fn put_if_current<K, V>(
    inner: &Inner<K, V>,
    key: K,
    value: Cached<V>,
    current: impl Fn() -> bool,
) -> bool
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    // Read before the check: an `invalidate_all` after it moves it on.
    let generation = inner.epochs.generation();
    let stored = inner
        .store
        .entry(key.clone())
        .and_compute_with(|_| {
            let op = if current() { Op::Put(value) } else { Op::Nop };
            async move { op }
        })
        .await;
    let put = matches!(
        stored,
        moka::ops::compute::CompResult::Inserted(_)
            | moka::ops::compute::CompResult::ReplacedWith(_)
    );
    // `invalidate_all` clears the store without the key's lock: one that
    // came between the check and the put may have cleared the store
    // before the put landed (see `Epochs::generation`). Only the
    // generation is checked again here: a key's own invalidation takes
    // the key's lock, so it came before the check (which saw it) or
    // removes the value itself, and an `insert` after this put (which
    // also moves the key's epoch) must not be removed by it.
    if put && inner.epochs.generation() != generation {
        inner.store.invalidate(&key).await;
        return false;
    }
    put
}

impl<K: Hash, V: Clone> Inner<K, V> {
    /// What the store keeps of a loaded `value` for the key hashed
    /// `hash`, if anything: "not found" only with a negative TTL, and
    /// nothing the doorkeeper turns away (whose values are not cloned).
    fn to_store(&self, hash: u64, value: Option<&V>) -> Option<Cached<V>> {
        if value.is_none() && !self.cache_not_found {
            return None;
        }
        if self.doorkeeper.as_ref().is_some_and(|d| !d.admit(hash)) {
            self.counters.not_admitted.fetch_add(1, Relaxed);
            return None;
        }
        Some(value.map_or(Cached::NotFound, |v| Cached::Found(v.clone())))
    }
}

/// A cache's side of the batcher it is built over (see
/// [`crate::batcher::Filled`]). Weak: the batcher holds it, and the cache
/// holds the batcher.
struct FillFrom<K, V> {
    cache: Weak<Inner<K, V>>,
    counters: Arc<Counters>,
}

impl<K, V> Fill<K, V> for FillFrom<K, V>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Takes what a load returned for the cache's misses and returns the
    /// stores to make, which the load's task awaits before its callers
    /// are answered: a caller that got its answer and asks again finds it
    /// here. A key is stored only while its stamp is current, checked
    /// under moka's lock of the key, which `invalidate` takes too: a load
    /// that began before an invalidation never stores after it.
    fn fill(&self, filled: Filled<'_, K, V>) -> Option<BoxFuture<()>> {
        let inner = self.cache.upgrade()?; // None: the cache is gone
        let c = &inner.counters;
        let (stamped, values) = match filled {
            Filled::Loaded { stamped, values } => (stamped, values),
            Filled::Failed(keys) => {
                c.misses.fetch_add(keys as u64, Relaxed);
                c.load_errors.fetch_add(keys as u64, Relaxed);
                return None;
            }
        };
        c.misses.fetch_add(stamped.len() as u64, Relaxed);
        let puts: Vec<(K, Stamp, Cached<V>)> = stamped
            .into_iter()
            .filter(|(_, stamp)| inner.epochs.is_current(*stamp))
            .filter_map(|(key, stamp)| {
                let value = inner.to_store(stamp.hash, values.get(&key))?;
                Some((key, stamp, value))
            })
            .collect();
        if puts.is_empty() {
            return None;
        }
        Some(Box::pin(async move {
            for (key, stamp, value) in puts {
                if put_if_current(&inner, key, value, || inner.epochs.is_current(stamp)).await {
                    inner.counters.fills.fetch_add(1, Relaxed);
                }
            }
        }))
    }

    fn coalesced(&self) {
        self.counters.coalesced.fetch_add(1, Relaxed);
    }

    fn cached(&self, key: &K) -> Option<Option<V>> {
        let inner = self.cache.upgrade()?;
        // moka's `get` only waits to run its housekeeping, which it
        // resumes later if this future is dropped (it is cancel safe); a
        // look that would wait is given up, and the key loaded.
        let cached = inner.store.get(key).now_or_never()??;
        Some(cached.into_option())
    }
}
