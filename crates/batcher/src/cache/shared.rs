//! What a [`Cache`](super::Cache) shares with both ways its misses are
//! loaded (`fill` over a batcher, `flights` over any other loader): moka
//! as the store (one entry per key, each scope's value in it: see
//! `slot`), the invalidation epochs, the counters, and the checked put
//! through which either strategy fills the store.
//!
//! Below the strategies and the handle, so that each of them uses it and
//! it uses none of them. For that reason the flights' map entries
//! (`Flight`, `FlightState`) are defined here, beside the `Inner` that
//! holds the map; `flights` runs them.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use futures_util::future::Shared as SharedFuture;
use moka::ops::compute::Op;

use super::accepted::Accepted;
use super::admission::Doorkeeper;
use super::epochs::Epochs;
use super::expiry::JitteredExpiry;
use super::slot::{Cached, Held, Owner, Slot};
use crate::stats::Count;
use crate::{Batcher, Error};

pub(super) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
/// A miss's load over any loader: the scope, the key.
pub(super) type MissFn<S, K, V> =
    Arc<dyn Fn(S, K) -> BoxFuture<Result<Option<V>, Error>> + Send + Sync>;
/// Which values every scope may be served (see `CacheBuilder::shared_when`).
pub(super) type SharedWhen<V> = Arc<dyn Fn(&V) -> bool + Send + Sync>;

/// The answer a flight delivers to its waiters.
pub(super) type Answer<V> = Result<Option<V>, Error>;

/// A load in progress for one key, as the flights map holds it.
pub(super) struct Flight<V> {
    pub(super) state: Arc<FlightState>,
    /// Polled by every caller waiting for it, so whichever of them runs
    /// drives it: no task per miss (that cost more than the batched load
    /// it wraps), and a caller that stops polling without being dropped
    /// holds nobody up. Its output never panics (see `run_flight`).
    pub(super) load: SharedFuture<BoxFuture<Answer<V>>>,
}

/// What invalidation tells a running load.
pub(super) struct FlightState {
    /// Set by invalidation: the load must not store its result.
    pub(super) stale: AtomicBool,
    /// [`Epochs::generation`] when the load started.
    pub(super) generation: u64,
}

/// Where misses go.
pub(super) enum Source<S, K, V> {
    /// A batcher that fills the store itself (see `FillFrom`).
    Batcher(Batcher<K, V, S>),
    /// Any loader, coalesced by the flights.
    Load(MissFn<S, K, V>),
}

/// The flights of one key: one per scope loading it, almost always one.
pub(super) type KeyFlights<S, V> = smallvec::SmallVec<[(S, Flight<V>); 1]>;

pub(super) struct Inner<K, V, S> {
    pub(super) store: moka::future::Cache<K, Slot<S, V>>,
    /// std Mutex: held only for map operations, never across an await.
    /// Only [`Source::Load`] has flights.
    pub(super) flights: Mutex<HashMap<K, KeyFlights<S, V>>>,
    pub(super) source: Source<S, K, V>,
    /// The cache's hash of a key, and what tells a load whether an
    /// invalidation came after it began: a key's stamp over a batcher,
    /// the generation for the flights.
    pub(super) epochs: Epochs,
    pub(super) cache_not_found: bool,
    /// With [`Admission::SecondMiss`](super::Admission::SecondMiss).
    pub(super) doorkeeper: Option<Doorkeeper>,
    /// When each stored value expires.
    pub(super) lifetimes: JitteredExpiry,
    pub(super) shared_when: Option<SharedWhen<V>>,
    /// Who may be served a shared value.
    pub(super) accepted: Accepted<S>,
    pub(super) counters: Arc<Counters>,
}

impl<K, V, S> Inner<K, V, S> {
    pub(super) fn lock_flights(&self) -> std::sync::MutexGuard<'_, HashMap<K, KeyFlights<S, V>>> {
        // A panic while holding this lock cannot leave the map half-updated
        // (single inserts and removes), so a poisoned lock is still usable.
        self.flights
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) hits: Count,
    pub(super) misses: Count,
    pub(super) coalesced: Count,
    pub(super) fills: Count,
    pub(super) load_errors: Count,
    pub(super) not_admitted: Count,
    pub(super) evictions: Count,
    pub(super) expirations: Count,
    pub(super) invalidations: Count,
}

impl Counters {
    /// Reports every count through the `metrics` facade too, under
    /// `cache="name"` (see [`crate::metrics`]).
    #[cfg(feature = "metrics")]
    pub(super) fn export(&self, name: &str) {
        let label = [("cache", name.to_owned())];
        crate::metrics::export_counters!(&label;
            self.hits => "pgbatch_cache_hits_total", "Lookups answered from the cache.";
            self.misses => "pgbatch_cache_misses_total", "Lookups that started a load.";
            self.coalesced => "pgbatch_cache_coalesced_total", "Lookups that joined another's load.";
            self.fills => "pgbatch_cache_fills_total", "Loaded values stored.";
            self.load_errors => "pgbatch_cache_load_errors_total", "Loads that failed.";
            self.not_admitted => "pgbatch_cache_not_admitted_total",
                "Loaded values turned away by second-miss admission.";
            self.evictions => "pgbatch_cache_evictions_total", "Entries evicted for capacity.";
            self.expirations => "pgbatch_cache_expirations_total", "Entries expired.";
            self.invalidations => "pgbatch_cache_invalidations_total",
                "invalidate and invalidate_all calls.";
        );
    }
}

/// Puts `held` for `key` (beside other scopes' values) if `current()`
/// holds, checked under moka's lock of the key, which `invalidate` takes
/// for its remove too: a put either comes before that remove or sees the
/// invalidation.
pub(super) async fn put_if_current<K, V, S>(
    inner: &Inner<K, V, S>,
    key: K,
    held: Held<S, V>,
    current: impl Fn() -> bool,
) -> bool
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: Clone + Eq + Send + Sync + 'static,
{
    // Read before the check: an `invalidate_all` after it moves it on.
    let generation = inner.epochs.generation();
    let stored = inner
        .store
        .entry(key.clone())
        .and_compute_with(|entry| {
            let op = if current() {
                Op::Put(Slot::with(entry.map(|e| e.into_value()), held))
            } else {
                Op::Nop
            };
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

impl<K: Hash, V: Clone, S: Clone> Inner<K, V, S> {
    /// What the store keeps of `value`, loaded as `scope` for the key
    /// hashed `hash`, if anything: "not found" only with a negative TTL,
    /// and nothing the doorkeeper turns away (whose values are not
    /// cloned). A value [shared](super::CacheBuilder::shared_when) is kept
    /// for every scope; "not found" never is (another scope may see the
    /// row), nor a value the loader counts as not found.
    pub(super) fn to_store(&self, scope: &S, hash: u64, value: Option<&V>) -> Option<Held<S, V>> {
        if value.is_none() && !self.cache_not_found {
            return None;
        }
        if self.doorkeeper.as_ref().is_some_and(|d| !d.admit(hash)) {
            self.counters.not_admitted.fetch_add(1, Relaxed);
            return None;
        }
        // Never a value the loader counts as not found (an empty list or
        // page): another scope may see rows where this one sees none.
        let absent = |v: &V| match &self.source {
            Source::Batcher(batcher) => batcher.is_absent(v),
            Source::Load(_) => false,
        };
        let shared =
            value.is_some_and(|v| self.shared_when.as_ref().is_some_and(|f| f(v)) && !absent(v));
        let value = value.map_or(Cached::NotFound, |v| Cached::Found(v.clone()));
        Some(Held {
            owner: if shared {
                Owner::Shared
            } else {
                Owner::Scope(scope.clone())
            },
            expires: self.lifetimes.expires(&value),
            value,
        })
    }
}
