//! Misses over a plain loader (any loader but a batcher the cache fills
//! from): the flights, one running load per key and scope, which every
//! miss of the key in that scope joins.
//!
//! A plain loader knows nothing of the other misses, so the cache
//! coalesces them itself. A flight's load is a shared future that every
//! waiting caller polls, so whichever runs drives it and no task is
//! spawned per miss; a caller dropped before the load ends hands it to a
//! task, so a cancelled caller makes nobody else fail, retry or hang.
//! The map entries themselves (`Flight`) live in `shared`, in the
//! `Inner` that holds the map.

use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use futures_util::future::Shared as SharedFuture;
use futures_util::FutureExt as _;

use super::shared::{put_if_current, Answer, BoxFuture, Flight, FlightState, Inner, Source};
use super::slot::Held;
use crate::Error;

/// A miss of `key` as `scope` over a plain loader: joins the flight of
/// its key in its scope, or starts one, and waits for the flight's answer.
pub(super) async fn load<K, V, S>(inner: &Arc<Inner<K, V, S>>, scope: &S, key: K) -> Answer<V>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: Clone + Eq + Hash + Send + Sync + 'static,
{
    let load = join_or_start(inner, scope, key);
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

/// Joins the running load for `key` in `scope`, or starts one.
fn join_or_start<K, V, S>(
    inner: &Arc<Inner<K, V, S>>,
    scope: &S,
    key: K,
) -> SharedFuture<BoxFuture<Answer<V>>>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: Clone + Eq + Hash + Send + Sync + 'static,
{
    let mut flights = inner.lock_flights();
    let running = flights
        .get(&key)
        .and_then(|of_key| of_key.iter().find(|(s, _)| s == scope));
    if let Some((_, flight)) = running {
        inner.counters.coalesced.fetch_add(1, Relaxed);
        return flight.load.clone();
    }
    inner.counters.misses.fetch_add(1, Relaxed);
    let state = Arc::new(FlightState {
        stale: AtomicBool::new(false),
        generation: inner.epochs.generation(),
    });
    // Made here, not on the first poll, so a load dropped unpolled
    // still leaves the map.
    let guard = FlightGuard {
        inner: Arc::clone(inner),
        key: key.clone(),
        state: Arc::clone(&state),
    };
    let run: BoxFuture<Answer<V>> = Box::pin(run_flight(
        Arc::clone(inner),
        scope.clone(),
        key.clone(),
        Arc::clone(&state),
        guard,
    ));
    let load = run.shared();
    flights.entry(key).or_default().push((
        scope.clone(),
        Flight {
            state,
            load: load.clone(),
        },
    ));
    load
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
struct FlightGuard<K: Eq + Hash, V, S> {
    inner: Arc<Inner<K, V, S>>,
    key: K,
    state: Arc<FlightState>,
}

impl<K: Eq + Hash, V, S> Drop for FlightGuard<K, V, S> {
    fn drop(&mut self) {
        let mut flights = self.inner.lock_flights();
        let Some(of_key) = flights.get_mut(&self.key) else {
            return;
        };
        of_key.retain(|(_, f)| !Arc::ptr_eq(&f.state, &self.state));
        if of_key.is_empty() {
            flights.remove(&self.key);
        }
    }
}

/// Loads `key` and stores the result unless invalidated meanwhile: the
/// answer of every caller waiting for it. Never panics: the load is
/// polled by whichever caller waits, and a shared future's panic would
/// reach all of them.
async fn run_flight<K, V, S>(
    inner: Arc<Inner<K, V, S>>,
    scope: S,
    key: K,
    state: Arc<FlightState>,
    guard: FlightGuard<K, V, S>,
) -> Answer<V>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: Clone + Eq + Hash + Send + Sync + 'static,
{
    // The whole body: the loader's synchronous part and the store's
    // weigher included.
    let answer = AssertUnwindSafe(load_and_store(&inner, scope, &key, &state))
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

async fn load_and_store<K, V, S>(
    inner: &Inner<K, V, S>,
    scope: S,
    key: &K,
    state: &FlightState,
) -> Answer<V>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: Clone + Eq + Hash + Send + Sync + 'static,
{
    // Only `Source::Load` starts flights.
    let Source::Load(load) = &inner.source else {
        unreachable!("a batcher's cache has no flights")
    };
    let result = load(scope.clone(), key.clone()).await;
    match &result {
        // The database ran this load as `scope`.
        Ok(_) => inner.accepted.accept(&scope),
        Err(_) => {
            inner.counters.load_errors.fetch_add(1, Relaxed);
        }
    }
    let hash = inner.epochs.hash(key);
    let value = result
        .as_ref()
        .ok()
        .and_then(|v| inner.to_store(&scope, hash, v.as_ref()));
    if let Some(value) = value {
        // Boxed: moka's compute future is large, and inline it would make
        // every miss's future a large allocation, filled or not.
        Box::pin(store(inner, key, state, value)).await;
    }
    result
}

/// Puts a loaded `value` for `key` unless invalidation marked its flight
/// stale (or `invalidate_all` ran) since the load started.
async fn store<K, V, S>(inner: &Inner<K, V, S>, key: &K, flight: &FlightState, value: Held<S, V>)
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: Clone + Eq + Hash + Send + Sync + 'static,
{
    let current = || !flight.stale.load(Relaxed) && inner.epochs.generation() == flight.generation;
    if put_if_current(inner, key.clone(), value, current).await {
        inner.counters.fills.fetch_add(1, Relaxed);
    }
}
