//! Running one load: the type-erased loader, the load timeout, panic
//! capture, and what a finished load means for its waiters and the
//! statistics. The worker (for its batches) and the handle (for a direct
//! load of one key) both go through here, so a load ends the same way
//! whichever ran it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use tokio::time::Instant;

use super::ledger::{Expired, Group, Waiters};
use super::loaded::Loaded;
use super::loader::{Loader, ScopedLoader};
use super::message::Waiter;
use super::observer::{Ended, ObserverFn, Stamp};
use super::shared::Shared;
use crate::error::{SharedError, TimedOut};
use crate::stats::Stats;
use crate::Error;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
/// A load started by a [`LoadFn`], not yet polled: one result per group.
pub(crate) type Load<K, V> = BoxFuture<Vec<Result<Loaded<K, V>, SharedError>>>;

/// A loader with its error type erased, and with a scope `S` (`()` for a
/// plain [`Loader`]), so `Worker` and `Batcher` need no loader type
/// parameter.
pub(crate) trait ErasedLoader<S, K, V>: Send + Sync {
    /// Starts a load of each group's keys as its scope. The loader is
    /// called inside the returned future, so even a panic in its
    /// synchronous part happens where the future is polled, inside
    /// [`contain`]'s panic capture, not in the worker.
    fn start(&self, groups: Vec<(S, Vec<K>)>) -> Load<K, V>;
    /// How many scopes one load may serve.
    fn scopes_per_load(&self) -> usize;
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
    fn start(&self, mut groups: Vec<(S, Vec<K>)>) -> Load<K, V> {
        let loader = Arc::clone(self);
        let shared = |e: L::Error| Arc::new(e) as SharedError;
        if groups.len() == 1 {
            let (scope, keys) = groups.pop().expect("one group");
            return Box::pin(async move { vec![loader.load(&scope, keys).await.map_err(shared)] });
        }
        Box::pin(async move {
            let asked = groups.len();
            let mut answers: Vec<_> = match loader.load_scopes(groups).await {
                Ok(answers) => answers.into_iter().map(|r| r.map_err(shared)).collect(),
                Err(e) => {
                    // The whole call failed: every scope gets its error.
                    let e = shared(e);
                    return (0..asked).map(|_| Err(Arc::clone(&e))).collect();
                }
            };
            if answers.len() != asked {
                // Never another group's answer: a loader that miscounts
                // fails every group it did not answer in order.
                let e: SharedError = Arc::new(ScopesMiscounted {
                    asked,
                    answered: answers.len(),
                });
                answers.resize_with(asked, || Err(Arc::clone(&e)));
                answers.truncate(asked);
            }
            answers
        })
    }

    fn scopes_per_load(&self) -> usize {
        L::scopes_per_load(self).max(1)
    }

    fn found(&self, value: Option<&V>) -> bool {
        value.is_some_and(|v| !L::is_absent(self, v))
    }

    fn label<'s>(&self, scope: &'s S) -> Option<Cow<'s, str>> {
        L::label(self, scope)
    }
}

/// A [`ScopedLoader::load_scopes`] that returned more or fewer results
/// than it was given scopes.
#[derive(Debug, thiserror::Error)]
#[error("the loader answered {answered} scopes of the {asked} it was given")]
struct ScopesMiscounted {
    asked: usize,
    answered: usize,
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
    /// Each group's answers, or its failure.
    Loaded(Vec<Result<Loaded<K, V>, SharedError>>),
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
        Ok(groups) => Outcome::Loaded(groups),
        Err(panic) => Outcome::Panicked(crate::error::panic_message(&*panic).into()),
    }
}

impl<K, V> Outcome<K, V> {
    /// Whether the load failed as a whole (timed out or panicked).
    pub(crate) fn is_whole_failure(&self) -> bool {
        !matches!(self, Outcome::Loaded(_))
    }

    /// How group `g` of this load ended, for the observer of its
    /// `stamped` keys.
    pub(crate) fn ended(&self, g: usize, stamped: Vec<(K, Stamp)>) -> Ended<'_, K, V> {
        match self {
            Outcome::Loaded(groups) => match groups.get(g) {
                Some(Ok(loaded)) => Ended::Loaded { stamped, loaded },
                _ => Ended::Failed(stamped.len()),
            },
            _ => Ended::Failed(stamped.len()),
        }
    }

    /// Each group's answers, or the error every waiter of a failed group
    /// receives, for groups of `keys` distinct keys each. A failure is
    /// counted and logged here, once per group (once per load for a
    /// timeout or a panic); a success is counted by the caller, which
    /// knows how many keys were found ([`Answered`]).
    pub(crate) fn settle(self, stats: &Stats, keys: &[usize]) -> Vec<Result<Loaded<K, V>, Error>> {
        let all: usize = keys.iter().sum();
        let whole = match self {
            Outcome::Loaded(groups) => {
                return groups
                    .into_iter()
                    .zip(keys)
                    .map(|(group, &keys)| {
                        group.map_err(|e| {
                            Stats::incr(&stats.failed_batches, 1);
                            Stats::incr(&stats.failed_keys, keys as u64);
                            let retryable = Error::Load(Arc::clone(&e)).is_retryable();
                            tracing::warn!(
                                error = %crate::error::Chain(&*e),
                                retryable,
                                keys,
                                "batch load failed"
                            );
                            Error::Load(e)
                        })
                    })
                    .collect();
            }
            Outcome::TimedOut(t) => {
                Stats::incr(&stats.timed_out_batches, 1);
                tracing::warn!(timeout = ?t, keys = all, "batch load timed out");
                Error::LoadTimeout(t)
            }
            Outcome::Panicked(msg) => {
                Stats::incr(&stats.panicked_batches, 1);
                tracing::error!(panic = %msg, keys = all, "batch loader panicked");
                Error::LoaderPanicked(msg)
            }
        };
        Stats::incr(&stats.failed_keys, all as u64);
        keys.iter().map(|_| Err(whole.clone())).collect()
    }
}

/// The future of a load the ledger took, to run in a task of its own: each
/// group's keys as its scope (see [`contain`] and [`observed`]).
pub(crate) fn launch<S, K, V>(
    load: &LoadFn<S, K, V>,
    shared: &Arc<Shared>,
    observer: Option<ObserverFn<S, K, V>>,
    groups: Vec<Group<S, K, Stamp>>,
) -> impl Future<Output = Outcome<K, V>> + Send + 'static
where
    S: Clone + Send + Sync + 'static,
    K: Send + 'static,
    V: Send + 'static,
{
    let mut stamped = Vec::new();
    let mut batches = Vec::with_capacity(groups.len());
    for group in groups {
        if observer.is_some() {
            stamped.push((group.scope.clone(), group.tagged));
        }
        batches.push((group.scope, group.keys));
    }
    let started = contain(load.start(batches), shared.config.load_timeout);
    observed(started, Arc::clone(shared), observer, stamped)
}

/// Answers a finished load's waiters, each group's from its own result
/// only, and counts what they got.
pub(crate) fn answer<S, K, V>(
    load: &LoadFn<S, K, V>,
    stats: &Stats,
    groups: Vec<HashMap<K, Waiters<Waiter<V>>>>,
    settled: Vec<Result<Loaded<K, V>, Error>>,
) where
    K: Eq + Hash,
    V: Clone,
{
    let mut answered = Answered::default();
    for (waiters, settled) in groups.into_iter().zip(settled) {
        match settled {
            Ok(mut loaded) => {
                for (key, waiters) in waiters {
                    let answer = loaded.take(&key);
                    let found = answer.as_ref().is_ok_and(|v| load.found(v.as_ref()));
                    answered.count(&answer, found);
                    reply_all(waiters, answer.map_err(Error::Load));
                }
            }
            Err(failure) => waiters
                .into_values()
                .for_each(|w| reply_all(w, Err(failure.clone()))),
        }
    }
    answered.record(stats);
}

/// Each group's answers, or its error: as [`Outcome::settle`], and
/// [`Error::Closed`] for a load whose task was cancelled (`None`: the
/// runtime is shutting down).
pub(crate) fn settle<K, V>(
    outcome: Option<Outcome<K, V>>,
    stats: &Stats,
    keys: &[usize],
) -> Vec<Result<Loaded<K, V>, Error>> {
    if let Some(outcome) = outcome {
        return outcome.settle(stats, keys);
    }
    Stats::incr(&stats.failed_keys, keys.iter().sum::<usize>() as u64);
    keys.iter().map(|_| Err(Error::Closed)).collect()
}

/// Answers [`Error::Timeout`] to waiters whose deadline passed.
pub(crate) fn time_out<V>(shared: &Shared, expired: Expired<Waiter<V>>) {
    let Some(after) = shared.config.timeout else {
        return;
    };
    let (mut timed_out, mut gone) = (0, 0);
    for (w, waited) in expired {
        // A caller already gone was abandoned, not timed out (and one that
        // timed out by its own timer counted it).
        match w.tx.send(Err(Error::Timeout(TimedOut::new(after, waited)))) {
            Ok(()) => timed_out += 1,
            Err(_) => gone += 1,
        }
    }
    Stats::incr(&shared.stats.timed_out, timed_out);
    Stats::incr(&shared.stats.abandoned, gone);
}

/// Sends `reply` to every waiter, cloning for all but the last.
fn reply_all<V: Clone>(waiters: Waiters<Waiter<V>>, reply: Result<Option<V>, Error>) {
    let mut waiters = waiters.into_iter();
    let last = waiters.next_back();
    for w in waiters {
        let _ = w.tx.send(reply.clone()); // caller dropped its future; nothing to do
    }
    if let Some(w) = last {
        let _ = w.tx.send(reply); // caller dropped its future; nothing to do
    }
}

/// Runs a started load (see [`contain`]) in its own task, and tells
/// `observer` how each group with stamped keys ended before any caller is
/// answered. Timed here, not by the worker: its view of a load also holds
/// the wait for the task's first poll and for its own turn to see the
/// end, which are no part of the loader's time.
pub(crate) async fn observed<S, K, V>(
    load: impl Future<Output = Outcome<K, V>>,
    shared: Arc<Shared>,
    observer: Option<ObserverFn<S, K, V>>,
    stamped: Vec<(S, Vec<(K, Stamp)>)>,
) -> Outcome<K, V> {
    let started = Instant::now();
    let outcome = load.await;
    Stats::record_duration(&shared.stats.load_duration, started.elapsed());
    let Some(observer) = observer else {
        return outcome;
    };
    for (g, (scope, stamped)) in stamped.into_iter().enumerate() {
        if stamped.is_empty() {
            continue;
        }
        // The observer runs the caller's code (a cache's weigher): a panic
        // there must not fail the load its waiters are owed.
        let work = std::panic::catch_unwind(AssertUnwindSafe(|| {
            observer.ended(&scope, outcome.ended(g, stamped))
        }));
        let done = match work {
            Ok(Some(work)) => AssertUnwindSafe(work).catch_unwind().await.is_ok(),
            Ok(None) => true,
            Err(_) => false,
        };
        if !done {
            tracing::error!("the load's observer panicked; its values are not kept");
        }
    }
    outcome
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

/// Begins a load of groups of `sizes` keys (a caller's own load of one
/// key is `direct`), whoever runs it: counts the load, its size and how
/// long each of its callers (`waits`: when each asked, and its span)
/// waited for it, and makes the span it runs in, linked to the callers'
/// spans. A scope appears only by its `label`, asked for only if something
/// uses it: the span (for a load of one scope) or the per-scope counts.
pub(crate) fn begin<'w>(
    shared: &Shared,
    direct: bool,
    sizes: &[usize],
    label: impl Fn(usize) -> Option<String>,
    waits: impl Iterator<Item = (Instant, &'w tracing::Span)>,
    now: Instant,
) -> tracing::Span {
    let stats = &shared.stats;
    let size: usize = sizes.iter().sum();
    Stats::incr(&stats.batches, 1);
    stats.batch_size.record(size as u64);
    let span = tracing::debug_span!(
        "batch",
        batcher = %shared.config.name,
        size,
        direct,
        scopes = sizes.len(),
        scope = tracing::field::Empty
    );
    let link = !span.is_disabled();
    for (asked_at, caller) in waits {
        Stats::record_duration(&stats.queue_wait, now.saturating_duration_since(asked_at));
        if link {
            span.follows_from(caller);
        }
    }
    let counts = stats.by_scope.get();
    if !link && counts.is_none() {
        return span;
    }
    for (g, &keys) in sizes.iter().enumerate() {
        let label = label(g);
        if let (true, [_], Some(label)) = (link, sizes, &label) {
            span.record("scope", label.as_str());
        }
        if let Some(counts) = counts {
            counts.record(label, keys);
        }
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
        let outcome = contain(load.start(vec![((), vec![1, 2])]), None).await;
        let s = stats();
        let err = outcome.settle(&s, &[2]).pop().unwrap().unwrap_err();
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
        let err = contain(load.start(vec![((), vec![1])]), Some(t))
            .await
            .settle(&s, &[1])
            .pop()
            .unwrap()
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
        let values = contain(load.start(vec![((), vec![1, 2])]), None)
            .await
            .settle(&s, &[2])
            .pop()
            .unwrap()
            .unwrap();
        assert_eq!(values.get(&2), Some(&4));
        let err = contain(load.start(vec![((), vec![0])]), None)
            .await
            .settle(&s, &[1])
            .pop()
            .unwrap()
            .unwrap_err();
        assert!(err.load_error::<std::io::Error>().is_some(), "{err:?}");
        let snap = s.snapshot(0, 1);
        assert_eq!((snap.failed_batches, snap.failed_keys), (1, 1));
    }
}
