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

use super::admission::Doorkeeper;
use super::epochs::Epochs;
use super::fill::FillFrom;
use super::flights;
use super::shared::{put_if_current, Answer, Cached, Counters, Inner, Source};
use crate::batcher::FillFn;
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
        flights::load(&self.inner, key).await
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
        let flight = inner.lock_flights().remove(&key);
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
        let flight = self.inner.lock_flights().remove(key);
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
        for (_, flight) in self.inner.lock_flights().drain() {
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
}
