//! The [`Cache`] handle: hits, and where its misses go. Over a
//! [`Batcher`](crate::Batcher) (the fast path), each miss is a stamped
//! request to the batcher, whose worker keeps one load per key and fills
//! the store from the load's completion (`fill`); over any other loader,
//! the flights (`flights`) coalesce concurrent misses. Also what wins
//! over both strategies' loads (`insert`, invalidation), and the counters.
//!
//! The one module that uses both strategies: each uses only `shared`, so
//! neither knows the other or the handle.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, Weak};

use moka::ops::compute::Op;
use tokio::time::Instant;

use super::accepted::Accepted;
use super::admission::Doorkeeper;
use super::epochs::Epochs;
use super::expiry::JitteredExpiry;
use super::fill::{FillFrom, RecentFills};
use super::flights;
use super::shared::{put_if_current, Answer, Counters, Inner, SharedWhen, Source};
use super::slot::{Cached, Held, Owner, Slot};
use crate::batcher::ObserverFn;
use crate::Error;

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
///
/// Over a scoped batcher, or with [`build_scoped`](super::CacheBuilder::build_scoped),
/// a cache is a `Cache<K, V, S>`: each caller reads as a scope `S`
/// ([`get_as`](Self::get_as)), and a value read as one scope is never
/// served to another, unless
/// [`shared_when`](super::CacheBuilder::shared_when) marks it the same for
/// every scope. [`invalidate`](Self::invalidate) removes every scope's
/// copy of a key. Unscoped, `S` is `()` and [`get`](Self::get) needs none.
pub struct Cache<K, V, S = ()> {
    inner: Arc<Inner<K, V, S>>,
}

impl<K, V, S> Clone for Cache<K, V, S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K, V, S> fmt::Debug for Cache<K, V, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("name", &self.inner.store.name())
            .field("entries", &self.inner.store.entry_count())
            .finish_non_exhaustive()
    }
}

impl<K, V, S> Cache<K, V, S>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: Clone + Eq + Hash + Send + Sync + 'static,
{
    /// A cache over a configured moka `store`; [`CacheBuilder`](super::CacheBuilder) makes both.
    pub(super) fn new(
        store: moka::future::Cache<K, Slot<S, V>>,
        source: Source<S, K, V>,
        cache_not_found: bool,
        doorkeeper: Option<Doorkeeper>,
        lifetimes: JitteredExpiry,
        shared_when: Option<SharedWhen<V>>,
        counters: Arc<Counters>,
    ) -> Self {
        let accepted = Accepted::new(lifetimes.longest());
        let inner = Arc::new_cyclic(|weak: &Weak<Inner<K, V, S>>| {
            let source = match source {
                Source::Batcher(batcher) => {
                    // Weak: the batcher holds its observer, and the cache
                    // holds the batcher.
                    let observer: ObserverFn<S, K, V> = Arc::new(FillFrom {
                        cache: weak.clone(),
                        counters: Arc::clone(&counters),
                        recent: RecentFills::new(),
                    });
                    if batcher.observe(observer) {
                        Source::Batcher(batcher)
                    } else {
                        // Another cache fills from this batcher: this one
                        // coalesces its misses itself, in flights.
                        Source::Load(Arc::new(move |scope, key| {
                            let batcher = batcher.clone();
                            Box::pin(async move { batcher.load_as(&scope, key).await })
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
                lifetimes,
                shared_when,
                accepted,
                counters,
            }
        });
        Self { inner }
    }

    /// The value for `key` as `scope` sees it: from the cache (what was
    /// read as `scope`, or shared by every scope), or loaded as `scope`
    /// (once, however many callers of that scope ask at the same time) and
    /// then cached for it. `Ok(None)` means the loader found nothing.
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
    pub async fn get_as(&self, scope: &S, key: K) -> Result<Option<V>, Error> {
        let inner = &self.inner;
        // Before the look: a load that stores the key after it, but
        // before the miss reaches the worker, must count as since.
        let asked_at = Instant::now();
        if let Some(found) = self.lookup(scope, &key).await {
            return Ok(found);
        }
        if let Source::Batcher(batcher) = &inner.source {
            let stamp = inner.epochs.stamp(inner.epochs.hash(&key));
            return batcher.load_stamped(scope, key, stamp, asked_at).await;
        }
        flights::load(&self.inner, scope, key).await
    }

    /// What the store holds for `key` that `scope` may be served (`Some(None)`:
    /// "not found"), counted as a hit.
    ///
    /// A hit spends a unit of the task's tokio budget: moka answers at
    /// once, so a caller looping over hits never reached a point where
    /// tokio could switch tasks, and held its worker thread for as long as
    /// it looped. A load's waiters on that thread then waited as long:
    /// 300 callers over 100,000 keys saw a read take 17.9 s. With the
    /// budget, such a caller yields every 128 hits. A miss spends none of
    /// it here: a GraphQL query's burst of misses, polled in one pass,
    /// still reaches the batcher together instead of in several loads.
    async fn lookup(&self, scope: &S, key: &K) -> Option<Option<V>> {
        let inner = &self.inner;
        let slot = inner.store.get(key).await?;
        let found = slot.find(scope, |s| inner.accepted.is_accepted(s))?;
        self.inner.counters.hits.fetch_add(1, Relaxed);
        tokio::task::coop::consume_budget().await;
        Some(found.into_option())
    }

    /// The values for `keys` as `scope` sees them, one result per key in
    /// the order given, as [`get_as`](Self::get_as) would return each.
    /// Hits are answered from the
    /// cache; over a batcher, the misses are queued together, so they go
    /// out in as few loads as the batcher's
    /// [`max_batch_size`](crate::BatcherBuilder::max_batch_size) allows,
    /// under one deadline. Over another loader, the misses load
    /// concurrently, each joining a running load of its key.
    ///
    /// # Cancel safety
    ///
    /// As for [`get_as`](Self::get_as).
    pub async fn get_many_as<I>(&self, scope: &S, keys: I) -> Vec<Result<Option<V>, Error>>
    where
        I: IntoIterator<Item = K>,
    {
        let inner = &self.inner;
        // Before the looks, as in `get_as`.
        let asked_at = Instant::now();
        let keys = keys.into_iter();
        let mut answers: Vec<Option<Answer<V>>> = Vec::with_capacity(keys.size_hint().0);
        let mut misses: Vec<(usize, K)> = Vec::new();
        for key in keys {
            match self.lookup(scope, &key).await {
                Some(found) => answers.push(Some(Ok(found))),
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
                batcher.load_many_stamped(scope, stamped, asked_at).await
            }
            Source::Load(_) => {
                futures_util::future::join_all(
                    misses
                        .iter()
                        .map(|(_, key)| self.get_as(scope, key.clone())),
                )
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

    /// What the cache holds for `key` that `scope` may be served, without
    /// loading anything: `None` when it holds nothing, `Some(None)` when it
    /// holds "not found" (only with a
    /// [`negative_ttl`](super::CacheBuilder::negative_ttl)), else
    /// `Some(Some(value))`. A find counts as a hit; nothing else is
    /// counted.
    pub async fn get_if_present_as(&self, scope: &S, key: &K) -> Option<Option<V>> {
        self.lookup(scope, key).await
    }

    /// Puts `value` for `key`, as `scope` sees it: primes the cache with a
    /// row the caller already has (one it just wrote, or read some other
    /// way). The value is stored whatever the
    /// [admission](super::CacheBuilder::admission) policy, and wins over
    /// loads of the key already running, in every scope: as after
    /// [`invalidate`](Self::invalidate), none of them can replace it with
    /// what it read, though each still answers its own callers. Other
    /// scopes' copies of the key are dropped: the row changed.
    ///
    /// An `invalidate` of the key that returns before this put lands wins
    /// over it: the value is then not stored.
    pub async fn insert_as(&self, scope: &S, key: K, value: V) {
        self.put(Owner::Scope(scope.clone()), key, value).await;
    }

    /// Puts `value` for `key` for every scope: a row that reads the same
    /// whoever reads it. Otherwise as [`insert_as`](Self::insert_as).
    pub async fn insert_shared(&self, key: K, value: V) {
        self.put(Owner::Shared, key, value).await;
    }

    async fn put(&self, owner: Owner<S>, key: K, value: V) {
        let inner = &self.inner;
        // The same order as `invalidate`: the epoch first, so a running
        // load's put (checked under the key's lock) sees it.
        let hash = inner.epochs.hash(&key);
        inner.epochs.invalidate(hash);
        // Read after the bump: only a later invalidation makes it stale.
        let stamp = inner.epochs.stamp(hash);
        self.stop_flights(&key);
        // The key's entry is replaced, not merged into: the other scopes'
        // copies were read before this write.
        self.inner
            .store
            .entry(key.clone())
            .and_compute_with(|_| async { Op::Remove })
            .await;
        let value = Cached::Found(value);
        let held = Held {
            owner,
            expires: inner.lifetimes.expires(&value),
            value,
        };
        put_if_current(inner, key, held, || inner.epochs.is_current(stamp)).await;
    }

    /// Marks every running flight of `key`, in any scope, stale: none of
    /// them stores what it read.
    fn stop_flights(&self, key: &K) {
        let flights = self.inner.lock_flights().remove(key);
        for (_, flight) in flights.into_iter().flatten() {
            flight.state.stale.store(true, Relaxed);
        }
    }

    /// Removes `key`, every scope's copy of it. A load for it already
    /// running, in any scope, still answers its callers but does not store
    /// its result, so later lookups load afresh.
    pub async fn invalidate(&self, key: &K) {
        // Before the store's remove: see `Epochs::invalidate`.
        self.inner.epochs.invalidate(self.inner.epochs.hash(key));
        self.stop_flights(key);
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
        for (_, flights) in self.inner.lock_flights().drain() {
            for (_, flight) in flights {
                flight.state.stale.store(true, Relaxed);
            }
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
}

impl<K, V> Cache<K, V>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
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
    /// As for [`get_as`](Self::get_as): dropping the future affects no
    /// other caller, and the load still fills the cache.
    pub async fn get(&self, key: K) -> Result<Option<V>, Error> {
        self.get_as(&(), key).await
    }

    /// The values for `keys`, one result per key in the order given, as
    /// [`get`](Self::get) would return each; see
    /// [`get_many_as`](Self::get_many_as).
    pub async fn get_many<I>(&self, keys: I) -> Vec<Result<Option<V>, Error>>
    where
        I: IntoIterator<Item = K>,
    {
        self.get_many_as(&(), keys).await
    }

    /// What the cache holds for `key`, without loading anything; see
    /// [`get_if_present_as`](Self::get_if_present_as).
    pub async fn get_if_present(&self, key: &K) -> Option<Option<V>> {
        self.get_if_present_as(&(), key).await
    }

    /// Puts `value` for `key`; see [`insert_as`](Self::insert_as).
    pub async fn insert(&self, key: K, value: V) {
        self.insert_as(&(), key, value).await;
    }
}
