//! Running one load: the type-erased loader, the load timeout, panic
//! capture, and what a finished load means for its waiters and the
//! statistics. The worker (for its batches) and the handle (for a direct
//! load of one key) both go through here, so a load ends the same way
//! whichever ran it.

use std::borrow::Cow;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;

use super::loaded::Loaded;
use super::loader::{Loader, ScopedLoader};
use super::observer::{Ended, Stamp};
use super::shared::Shared;
use crate::error::SharedError;
use crate::stats::Stats;
use crate::Error;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
/// A load started by a [`LoadFn`], not yet polled.
pub(crate) type Load<K, V> = BoxFuture<Result<Loaded<K, V>, SharedError>>;

/// A loader with its error type erased, and with a scope `S` (`()` for a
/// plain [`Loader`]), so `Worker` and `Batcher` need no loader type
/// parameter.
pub(crate) trait ErasedLoader<S, K, V>: Send + Sync {
    /// Starts a load of `keys` as `scope`. The loader is called inside the
    /// returned future, so even a panic in its synchronous part happens
    /// where the future is polled, inside [`run`]'s panic capture, not in
    /// the worker.
    fn start(&self, scope: S, keys: Vec<K>) -> Load<K, V>;
    /// Whether a key's answer counts as found in the statistics.
    fn found(&self, value: Option<&V>) -> bool;
    /// How `scope` is named in spans and logs, if at all.
    fn label<'s>(&self, scope: &'s S) -> Option<Cow<'s, str>>;
}

/// The shared, erased loader.
pub(crate) type LoadFn<S, K, V> = Arc<dyn ErasedLoader<S, K, V>>;

/// A plain [`Loader`], as the scoped loader of the one scope `()`.
struct Unscoped<L>(L);

impl<K, V, L: Loader<K, V>> ScopedLoader<(), K, V> for Unscoped<L> {
    type Error = L::Error;

    fn load(
        &self,
        (): &(),
        keys: Vec<K>,
    ) -> impl Future<Output = Result<Loaded<K, V>, L::Error>> + Send {
        self.0.load(keys)
    }

    fn is_absent(&self, value: &V) -> bool {
        self.0.is_absent(value)
    }
}

/// A [`ScopedLoader`], shared by the loads it starts.
impl<S, K, V, L> ErasedLoader<S, K, V> for Arc<L>
where
    S: Send + Sync + 'static,
    K: Send + 'static,
    V: Send + 'static,
    L: ScopedLoader<S, K, V>,
{
    fn start(&self, scope: S, keys: Vec<K>) -> Load<K, V> {
        let loader = Arc::clone(self);
        Box::pin(async move {
            let loaded = loader.load(&scope, keys).await;
            loaded.map_err(|e| Arc::new(e) as SharedError)
        })
    }

    fn found(&self, value: Option<&V>) -> bool {
        value.is_some_and(|v| !L::is_absent(self, v))
    }

    fn label<'s>(&self, scope: &'s S) -> Option<Cow<'s, str>> {
        L::label(self, scope)
    }
}

/// Erases `loader`'s type.
pub(crate) fn load_fn<K, V, L>(loader: L) -> LoadFn<(), K, V>
where
    K: Send + 'static,
    V: Send + 'static,
    L: Loader<K, V>,
{
    scoped_load_fn(Unscoped(loader))
}

/// Erases a scoped `loader`'s type.
pub(crate) fn scoped_load_fn<S, K, V, L>(loader: L) -> LoadFn<S, K, V>
where
    S: Send + Sync + 'static,
    K: Send + 'static,
    V: Send + 'static,
    L: ScopedLoader<S, K, V>,
{
    Arc::new(Arc::new(loader))
}

/// How a load ended.
pub(crate) enum Outcome<K, V> {
    Loaded(Loaded<K, V>),
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
    /// How this load ended, for the observer of its `stamped` keys.
    pub(crate) fn ended(&self, stamped: Vec<(K, Stamp)>) -> Ended<'_, K, V> {
        match self {
            Outcome::Loaded(loaded) => Ended::Loaded { stamped, loaded },
            _ => Ended::Failed(stamped.len()),
        }
    }

    /// The answers of a successful load, or the error every waiter of a
    /// failed one receives. A failure is counted and logged here, once per
    /// batch of `keys` distinct keys; a success is counted by the caller,
    /// which knows how many keys were found ([`record_found`]).
    pub(crate) fn settle(self, stats: &Stats, keys: usize) -> Result<Loaded<K, V>, Error> {
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

/// What a successful load answered its keys, key by key, for the
/// statistics: found (and not marked absent), not found, or failed alone.
#[derive(Debug, Default)]
pub(crate) struct Answered {
    pub(crate) found: usize,
    pub(crate) not_found: usize,
    pub(crate) failed: usize,
}

impl Answered {
    /// Counts one key's answer.
    pub(crate) fn count<V>(&mut self, answer: &Result<Option<V>, SharedError>, found: bool) {
        match answer {
            Ok(_) if found => self.found += 1,
            Ok(_) => self.not_found += 1,
            Err(_) => self.failed += 1,
        }
    }

    /// Records the counts of a successful load; keys that failed alone are
    /// logged once per load.
    pub(crate) fn record(self, stats: &Stats) {
        Stats::incr(&stats.found, self.found as u64);
        Stats::incr(&stats.not_found, self.not_found as u64);
        Stats::incr(&stats.failed_keys, self.failed as u64);
        if self.failed > 0 {
            tracing::warn!(
                failed = self.failed,
                "batch loaded; some keys failed on their own"
            );
        }
        tracing::trace!(
            found = self.found,
            not_found = self.not_found,
            "batch loaded"
        );
    }
}

/// The span every load runs in, whoever runs it, and the load counted for
/// its scope (when the batcher counts per scope): the scope appears only
/// by its `label`, asked for once and only if something uses it.
pub(crate) fn batch_span(
    shared: &Shared,
    size: usize,
    direct: bool,
    label: impl FnOnce() -> Option<String>,
) -> tracing::Span {
    let span = tracing::debug_span!(
        "batch",
        batcher = %shared.config.name,
        size,
        direct,
        scope = tracing::field::Empty
    );
    let counts = shared.stats.by_scope.get();
    if span.is_disabled() && counts.is_none() {
        return span;
    }
    let label = label();
    if let Some(label) = &label {
        span.record("scope", label.as_str());
    }
    if let Some(counts) = counts {
        counts.record(label, size);
    }
    span
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
        let load: LoadFn<(), u32, u32> = load_fn(loader_fn(|_keys: Vec<u32>| async move {
            if true {
                panic!("boom {}", 7);
            }
            Ok::<Loaded<u32, u32>, std::io::Error>(Loaded::new())
        }));
        let outcome = contain(load.start((), vec![1, 2]), None).await;
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
        let load: LoadFn<(), u32, u32> = load_fn(loader_fn(|_keys: Vec<u32>| async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<Loaded<u32, u32>, std::io::Error>(Loaded::new())
        }));
        let t = Duration::from_millis(10);
        let s = stats();
        let err = contain(load.start((), vec![1]), Some(t))
            .await
            .settle(&s, 1)
            .unwrap_err();
        assert!(matches!(err, Error::LoadTimeout(d) if d == t), "{err:?}");
        assert_eq!(s.snapshot(0, 1).timed_out_batches, 1);
    }

    #[tokio::test]
    async fn errors_and_values_settle_apart() {
        let load: LoadFn<(), u32, u32> = load_fn(loader_fn(|keys: Vec<u32>| async move {
            if keys.contains(&0) {
                return Err(std::io::Error::other("no zero"));
            }
            Ok(keys
                .into_iter()
                .map(|k| (k, k * 2))
                .collect::<Loaded<_, _>>())
        }));
        let s = stats();
        let values = contain(load.start((), vec![1, 2]), None)
            .await
            .settle(&s, 2)
            .unwrap();
        assert_eq!(values.get(&2), Some(&4));
        let err = contain(load.start((), vec![0]), None)
            .await
            .settle(&s, 1)
            .unwrap_err();
        assert!(err.load_error::<std::io::Error>().is_some(), "{err:?}");
        let snap = s.snapshot(0, 1);
        assert_eq!((snap.failed_batches, snap.failed_keys), (1, 1));
    }
}
