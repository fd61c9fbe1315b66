//! Running one load: the type-erased loader, the load timeout, panic
//! capture, and what a finished load means for its waiters and the
//! statistics. The worker (for its batches) and the handle (for a direct
//! load of one key) both go through here, so a load ends the same way
//! whichever ran it.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;

use super::fill::{Filled, Stamp};
use super::loader::Loader;
use crate::error::SharedError;
use crate::stats::Stats;
use crate::Error;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
/// A load started by a [`LoadFn`], not yet polled.
pub(crate) type Load<K, V> = BoxFuture<Result<HashMap<K, V>, SharedError>>;

/// A [`Loader`] with its error type erased, so `Worker` and `Batcher` need
/// no loader type parameter.
pub(crate) trait ErasedLoader<K, V>: Send + Sync {
    /// Starts a load of `keys`. The loader is called inside the returned
    /// future, so even a panic in its synchronous part happens where the
    /// future is polled, inside [`run`]'s panic capture, not in the worker.
    fn start(&self, keys: Vec<K>) -> Load<K, V>;
    /// Whether a key's answer counts as found in the statistics.
    fn found(&self, value: Option<&V>) -> bool;
}

/// The shared, erased loader.
pub(crate) type LoadFn<K, V> = Arc<dyn ErasedLoader<K, V>>;

impl<K, V, L> ErasedLoader<K, V> for Arc<L>
where
    K: Send + 'static,
    V: Send + 'static,
    L: Loader<K, V>,
{
    fn start(&self, keys: Vec<K>) -> Load<K, V> {
        let loader = Arc::clone(self);
        Box::pin(async move {
            loader
                .load(keys)
                .await
                .map_err(|e| Arc::new(e) as SharedError)
        })
    }

    fn found(&self, value: Option<&V>) -> bool {
        value.is_some_and(|v| !self.is_absent(v))
    }
}

/// Erases `loader`'s type.
pub(crate) fn load_fn<K, V, L>(loader: L) -> LoadFn<K, V>
where
    K: Send + 'static,
    V: Send + 'static,
    L: Loader<K, V>,
{
    Arc::new(Arc::new(loader))
}

/// How a load ended.
pub(crate) enum Outcome<K, V> {
    Loaded(HashMap<K, V>),
    Failed(SharedError),
    TimedOut(Duration),
    Panicked(Arc<str>),
}

/// Runs `load`, giving up after `load_timeout` and turning a panic into an
/// [`Outcome`] instead of unwinding into whoever polls this.
pub(crate) async fn contain<K, V>(
    load: Load<K, V>,
    load_timeout: Option<Duration>,
) -> Outcome<K, V> {
    let load = AssertUnwindSafe(load).catch_unwind();
    let result = match load_timeout {
        Some(t) => match tokio::time::timeout(t, load).await {
            Ok(r) => r,
            Err(_) => return Outcome::TimedOut(t),
        },
        None => load.await,
    };
    match result {
        Ok(Ok(values)) => Outcome::Loaded(values),
        Ok(Err(e)) => Outcome::Failed(e),
        Err(panic) => Outcome::Panicked(crate::error::panic_message(&*panic).into()),
    }
}

impl<K, V> Outcome<K, V> {
    /// What a cache built over the batcher is offered of this load: the
    /// values of the `stamped` keys (its misses), or that they failed.
    pub(crate) fn filled(&self, stamped: Vec<(K, Stamp)>) -> Filled<'_, K, V> {
        match self {
            Outcome::Loaded(values) => Filled::Loaded { stamped, values },
            _ => Filled::Failed(stamped.len()),
        }
    }

    /// The values of a successful load, or the error every waiter of a
    /// failed one receives. A failure is counted and logged here, once per
    /// batch of `keys` distinct keys; a success is counted by the caller,
    /// which knows how many keys were found ([`record_found`]).
    pub(crate) fn settle(self, stats: &Stats, keys: usize) -> Result<HashMap<K, V>, Error> {
        let failure = match self {
            Outcome::Loaded(values) => return Ok(values),
            Outcome::Failed(e) => {
                Stats::incr(&stats.failed_batches, 1);
                let retryable = Error::Load(Arc::clone(&e)).is_retryable();
                tracing::warn!(
                    error = %crate::error::Chain(&*e),
                    retryable,
                    keys,
                    "batch load failed"
                );
                Error::Load(e)
            }
            Outcome::TimedOut(t) => {
                Stats::incr(&stats.timed_out_batches, 1);
                tracing::warn!(timeout = ?t, keys, "batch load timed out");
                Error::LoadTimeout(t)
            }
            Outcome::Panicked(msg) => {
                Stats::incr(&stats.panicked_batches, 1);
                tracing::error!(panic = %msg, keys, "batch loader panicked");
                Error::LoaderPanicked(msg)
            }
        };
        Stats::incr(&stats.failed_keys, keys as u64);
        Err(failure)
    }
}

/// Counts a successful load of `keys` distinct keys, `found` of which the
/// loader returned (and did not mark absent).
pub(crate) fn record_found(stats: &Stats, found: usize, keys: usize) {
    Stats::incr(&stats.found, found as u64);
    Stats::incr(&stats.not_found, (keys - found) as u64);
    tracing::trace!(found, not_found = keys - found, "batch loaded");
}

/// The span every load runs in, whoever runs it.
pub(crate) fn batch_span(name: &str, size: usize, direct: bool) -> tracing::Span {
    tracing::debug_span!("batch", batcher = %name, size, direct)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader_fn;

    fn stats() -> Stats {
        Stats::new()
    }

    #[tokio::test]
    async fn a_panic_becomes_an_outcome_with_its_message() {
        let load: LoadFn<u32, u32> = load_fn(loader_fn(|_keys: Vec<u32>| async move {
            if true {
                panic!("boom {}", 7);
            }
            Ok::<HashMap<u32, u32>, std::io::Error>(HashMap::new())
        }));
        let outcome = contain(load.start(vec![1, 2]), None).await;
        let s = stats();
        let err = outcome.settle(&s, 2).unwrap_err();
        assert!(
            matches!(&err, Error::LoaderPanicked(m) if &**m == "boom 7"),
            "{err:?}"
        );
        let snap = s.snapshot(0, 1);
        assert_eq!((snap.panicked_batches, snap.failed_keys), (1, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_load_times_out() {
        let load: LoadFn<u32, u32> = load_fn(loader_fn(|_keys: Vec<u32>| async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<HashMap<u32, u32>, std::io::Error>(HashMap::new())
        }));
        let t = Duration::from_millis(10);
        let s = stats();
        let err = contain(load.start(vec![1]), Some(t))
            .await
            .settle(&s, 1)
            .unwrap_err();
        assert!(matches!(err, Error::LoadTimeout(d) if d == t), "{err:?}");
        assert_eq!(s.snapshot(0, 1).timed_out_batches, 1);
    }

    #[tokio::test]
    async fn errors_and_values_settle_apart() {
        let load: LoadFn<u32, u32> = load_fn(loader_fn(|keys: Vec<u32>| async move {
            if keys.contains(&0) {
                return Err(std::io::Error::other("no zero"));
            }
            Ok(keys.into_iter().map(|k| (k, k * 2)).collect())
        }));
        let s = stats();
        let values = contain(load.start(vec![1, 2]), None)
            .await
            .settle(&s, 2)
            .unwrap();
        assert_eq!(values.get(&2), Some(&4));
        let err = contain(load.start(vec![0]), None)
            .await
            .settle(&s, 1)
            .unwrap_err();
        assert!(err.load_error::<std::io::Error>().is_some(), "{err:?}");
        let snap = s.snapshot(0, 1);
        assert_eq!((snap.failed_batches, snap.failed_keys), (1, 1));
    }
}
