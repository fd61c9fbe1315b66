//! The coalescing cache. moka's clock does not follow tokio's paused time,
//! so TTL tests run on short real durations with `run_pending_tasks`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{storing_every_value, value_of, TestLoader};
use pgbatch::cache::{Admission, Cache, CacheBuilder};
use pgbatch::{loader_fn, Batcher, Error};
use tokio::sync::Semaphore;

/// Where a cache's misses go: the guarantees hold for both.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Via {
    /// `build(load)`: the cache's own flights coalesce misses.
    Flights,
    /// `build_with_batcher`: the batcher keeps one load per key and fills
    /// the cache from its completions.
    Batcher,
}

const VIAS: [Via; 2] = [Via::Flights, Via::Batcher];

/// A cache built by `builder` whose misses load each key with `load`:
/// directly, or through a batcher whose batches call it for each key.
fn build_via<V, F, Fut>(via: Via, builder: CacheBuilder<u64, V>, load: F) -> Cache<u64, V>
where
    V: Clone + Send + Sync + 'static,
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<V>, Error>> + Send + 'static,
{
    match via {
        Via::Flights => builder.build(load).unwrap(),
        Via::Batcher => {
            let load = Arc::new(load);
            let batcher = Batcher::builder()
                .build(loader_fn(move |keys: Vec<u64>| {
                    // Called here, so a panic before the future is the
                    // batch's, as a real loader's would be.
                    let loads: Vec<_> = keys.iter().map(|&k| (k, load(k))).collect();
                    async move {
                        let mut out = HashMap::new();
                        for (k, value) in loads {
                            if let Some(v) = value.await? {
                                out.insert(k, v);
                            }
                        }
                        Ok::<_, Error>(out)
                    }
                }))
                .unwrap();
            builder.build_with_batcher(batcher).unwrap()
        }
    }
}

/// Whether `err` or one of its sources says `text`.
fn says(err: &Error, text: &str) -> bool {
    let mut next: Option<&dyn std::error::Error> = Some(err);
    while let Some(e) = next {
        if e.to_string().contains(text) {
            return true;
        }
        next = e.source();
    }
    false
}

/// Counts loads; holds them behind a gate when asked to.
#[derive(Default)]
struct Loads {
    calls: AtomicUsize,
    gate: Option<Semaphore>,
}

impl Loads {
    fn gated() -> Arc<Self> {
        Arc::new(Self {
            gate: Some(Semaphore::new(0)),
            ..Self::default()
        })
    }

    fn calls(&self) -> usize {
        self.calls.load(SeqCst)
    }

    async fn pass(&self) -> usize {
        let n = self.calls.fetch_add(1, SeqCst) + 1;
        if let Some(gate) = &self.gate {
            gate.acquire().await.unwrap().forget();
        }
        n
    }
}

/// A cache whose loads answer their own number (1 for the first load),
/// through `loads`: which load an answer came from.
fn numbering_cache(via: Via, loads: &Arc<Loads>) -> Cache<u64, usize> {
    let loads = Arc::clone(loads);
    build_via(via, storing_every_value(), move |_k: u64| {
        let loads = Arc::clone(&loads);
        async move { Ok(Some(loads.pass().await)) }
    })
}

/// `cache.get(key)` in a task of its own.
fn spawn_get<V: Clone + Send + Sync + 'static>(
    cache: &Cache<u64, V>,
    key: u64,
) -> tokio::task::JoinHandle<Result<Option<V>, Error>> {
    let cache = cache.clone();
    tokio::spawn(async move { cache.get(key).await })
}

fn counting_cache(via: Via, loads: &Arc<Loads>) -> Cache<u64, String> {
    counting_cache_with(via, loads, storing_every_value())
}

/// A cache built by `builder` whose loads of a key go through `loads`.
fn counting_cache_with(
    via: Via,
    loads: &Arc<Loads>,
    builder: CacheBuilder<u64, String>,
) -> Cache<u64, String> {
    let loads = Arc::clone(loads);
    build_via(via, builder, move |k: u64| {
        let loads = Arc::clone(&loads);
        async move {
            loads.pass().await;
            Ok(Some(value_of(k)))
        }
    })
}

/// Waits until `n` lookups wait for a load another lookup started (the
/// flights count a join as it happens, a batcher's worker as it takes
/// the request), and a little longer.
async fn coalesced<V: Clone + Send + Sync + 'static>(cache: &Cache<u64, V>, n: u64) {
    eventually("lookups joining a load", || cache.stats().coalesced == n).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
}

/// `gets` concurrent gets over `keys` keys (`i % keys`) through `cache`,
/// whose `loader` is gated: waits until every get beyond the first of each
/// key has joined a load, then opens the loader and checks each answer.
async fn gets_over_keys(cache: &Cache<u64, String>, loader: &TestLoader, gets: u64, keys: u64) {
    let gets: Vec<_> = (0..gets)
        .map(|i| {
            let cache = cache.clone();
            tokio::spawn(async move { (i % keys, cache.get(i % keys).await) })
        })
        .collect();
    coalesced(cache, gets.len() as u64 - keys).await;
    loader.open(1000);
    for g in gets {
        let (key, value) = g.await.unwrap();
        assert_eq!(value.unwrap(), Some(value_of(key)), "key {key}");
    }
}

/// Polls `cond` until it holds (bounded, so a bug fails instead of hanging).
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_gets_of_one_cold_key_cause_one_load() {
    for via in VIAS {
        one_cold_key_one_load(via).await;
    }
}

async fn one_cold_key_one_load(via: Via) {
    let loads = Loads::gated();
    let cache = counting_cache(via, &loads);
    let gets: Vec<_> = (0..1000)
        .map(|_| {
            let cache = cache.clone();
            tokio::spawn(async move { cache.get(42).await })
        })
        .collect();
    coalesced(&cache, 999).await;
    loads.gate.as_ref().unwrap().add_permits(1);
    for g in gets {
        assert_eq!(g.await.unwrap().unwrap(), Some(value_of(42)), "{via:?}");
    }
    assert_eq!(loads.calls(), 1, "{via:?}");
    assert_eq!(cache.get(42).await.unwrap(), Some(value_of(42)));
    let s = cache.stats();
    assert_eq!((s.misses, s.coalesced, s.hits), (1, 999, 1), "{via:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_gets_over_a_hundred_keys_through_a_batcher_make_few_batches() {
    // Loads are held until every get waits: an instant loader would free
    // its slot before the next spawned get runs, making every load a batch
    // of one, and this test is about coalescing through the worker.
    let loader = TestLoader::gated();
    let batcher: Batcher<u64, String> = Batcher::builder()
        .max_concurrent_batches(2)
        .direct_when_idle(false)
        .build(loader.clone())
        .unwrap();
    let cache = storing_every_value()
        .build_with_batcher(batcher.clone())
        .unwrap();

    gets_over_keys(&cache, &loader, 1000, 100).await;
    let calls = loader.calls();
    let loaded: usize = calls.iter().map(Vec::len).sum();
    assert!(loaded <= 100 + 10, "keys loaded {loaded} times: {calls:?}");
    assert!(calls.len() <= 20, "{} batches: {calls:?}", calls.len());
}

#[tokio::test]
async fn the_first_callers_cancellation_does_not_affect_the_others() {
    for via in VIAS {
        first_callers_cancellation(via).await;
    }
}

async fn first_callers_cancellation(via: Via) {
    let loads = Loads::gated();
    let cache = counting_cache(via, &loads);
    let first = spawn_get(&cache, 7);
    eventually("first caller loading", || loads.calls() == 1).await;
    let second = spawn_get(&cache, 7);
    coalesced(&cache, 1).await;

    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    loads.gate.as_ref().unwrap().add_permits(1);
    assert_eq!(second.await.unwrap().unwrap(), Some(value_of(7)));
    assert_eq!(loads.calls(), 1, "no retry, no second load");
    assert_eq!(cache.get(7).await.unwrap(), Some(value_of(7)));
    assert_eq!(
        loads.calls(),
        1,
        "the abandoned load still filled the cache"
    );
}

/// A cache built by `builder` whose first `failures` loads fail with
/// "database down" and later ones find their key; counts its loads.
fn failing_first(
    via: Via,
    failures: usize,
    builder: CacheBuilder<u64, String>,
) -> (Cache<u64, String>, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let cache = build_via(via, builder, {
        let calls = Arc::clone(&calls);
        move |k: u64| {
            let n = calls.fetch_add(1, SeqCst);
            async move {
                if n < failures {
                    Err(Error::load(std::io::Error::other("database down")))
                } else {
                    Ok(Some(value_of(k)))
                }
            }
        }
    });
    (cache, calls)
}

#[tokio::test]
async fn errors_are_not_cached() {
    for via in VIAS {
        let (cache, calls) = failing_first(via, 1, storing_every_value());
        let err = cache.get(1).await.unwrap_err();
        assert!(says(&err, "database down"), "{via:?}: {err:?}");
        assert_eq!(cache.get(1).await.unwrap(), Some(value_of(1)));
        assert_eq!(calls.load(SeqCst), 2, "{via:?}");
        assert_eq!(cache.stats().load_errors, 1, "{via:?}");
    }
}

/// Where [`first_call_panics`]'s loader panics.
#[derive(Clone, Copy, PartialEq)]
enum Panic {
    /// In the future the loader returns.
    InFuture,
    /// In the loader's synchronous part, before it makes its future.
    BeforeFuture,
}

/// A cache whose loader panics on its first call, at `at`, and loads
/// normally after.
fn first_call_panics(via: Via, at: Panic) -> Cache<u64, String> {
    let calls = AtomicUsize::new(0);
    build_via(via, storing_every_value(), move |k: u64| {
        let first = calls.fetch_add(1, SeqCst) == 0;
        assert!(
            !(first && at == Panic::BeforeFuture),
            "the first call panics before making its future"
        );
        async move {
            assert!(!first, "first load panics on purpose");
            Ok(Some(value_of(k)))
        }
    })
}

#[tokio::test]
async fn a_panicking_load_fails_its_waiters_and_is_not_sticky() {
    for via in VIAS {
        let cache = first_call_panics(via, Panic::InFuture);
        assert!(
            matches!(cache.get(3).await, Err(Error::LoaderPanicked(_))),
            "{via:?}"
        );
        assert_eq!(cache.get(3).await.unwrap(), Some(value_of(3)));
    }
}

#[tokio::test]
async fn not_found_is_cached_only_with_a_negative_ttl_and_for_that_long() {
    for via in VIAS {
        not_found_cached_with_negative_ttl(via).await;
    }
}

async fn not_found_cached_with_negative_ttl(via: Via) {
    let calls = Arc::new(AtomicUsize::new(0));
    let build = |negative: Option<Duration>| {
        let calls = Arc::clone(&calls);
        let mut b = storing_every_value::<u64, String>().jitter(Duration::ZERO);
        if let Some(ttl) = negative {
            b = b.negative_ttl(ttl);
        }
        build_via(via, b, move |_k| {
            calls.fetch_add(1, SeqCst);
            async { Ok(None) }
        })
    };

    let plain = build(None);
    assert_eq!(plain.get(1).await.unwrap(), None);
    assert_eq!(plain.get(1).await.unwrap(), None);
    assert_eq!(
        calls.swap(0, SeqCst),
        2,
        "without a negative TTL every miss loads"
    );

    let negative = build(Some(Duration::from_millis(150)));
    assert_eq!(negative.get(1).await.unwrap(), None);
    assert_eq!(negative.get(1).await.unwrap(), None);
    assert_eq!(calls.load(SeqCst), 1, "not found is cached");
    tokio::time::sleep(Duration::from_millis(400)).await;
    negative.run_pending_tasks().await;
    assert_eq!(negative.get(1).await.unwrap(), None);
    assert_eq!(calls.load(SeqCst), 2, "and expires after its TTL");
}

#[tokio::test]
async fn entries_expire_spread_over_the_jitter() {
    let loads = Arc::new(Loads::default());
    let cache: Cache<u64, String> = counting_cache_with(
        Via::Flights,
        &loads,
        storing_every_value()
            .time_to_live(Duration::from_millis(200))
            .jitter(Duration::from_millis(2000)),
    );
    for k in 0..200 {
        cache.get(k).await.unwrap();
    }
    // All were loaded together; none may expire before the TTL, and with a
    // 2 s jitter most outlive 600 ms while some do not. Measured by what a
    // caller sees (a reload), since moka's housekeeping removes expired
    // entries on a ~1 s wheel but `get` honours expiry exactly.
    let reloads_after = |wait: Duration| {
        let cache = cache.clone();
        let loads = Arc::clone(&loads);
        async move {
            tokio::time::sleep(wait).await;
            let before = loads.calls();
            for k in 0..200 {
                cache.get(k).await.unwrap();
            }
            loads.calls() - before
        }
    };
    assert_eq!(
        reloads_after(Duration::from_millis(100)).await,
        0,
        "nothing expires before the TTL"
    );
    let expired = reloads_after(Duration::from_millis(500)).await;
    assert!(
        (10..=180).contains(&expired),
        "{expired} of 200 expired at 600 ms"
    );
}

#[tokio::test]
async fn invalidation_wins_over_a_load_already_running() {
    for via in VIAS {
        invalidation_wins(via).await;
    }
}

async fn invalidation_wins(via: Via) {
    let loads = Loads::gated();
    let cache = numbering_cache(via, &loads);
    let early = spawn_get(&cache, 1);
    eventually("load 1 running", || loads.calls() == 1).await;
    // A write happens and invalidates while load 1 (old data) still runs.
    cache.invalidate(&1).await;
    loads.gate.as_ref().unwrap().add_permits(2);
    assert_eq!(
        early.await.unwrap().unwrap(),
        Some(1),
        "its caller still gets an answer"
    );
    assert_eq!(
        cache.get(1).await.unwrap(),
        Some(2),
        "but it was not cached"
    );
    assert_eq!(cache.get(1).await.unwrap(), Some(2));
    assert_eq!(loads.calls(), 2);

    cache.invalidate_all();
    loads.gate.as_ref().unwrap().add_permits(1);
    assert_eq!(cache.get(1).await.unwrap(), Some(3));
}

#[tokio::test]
async fn capacity_is_bounded_by_count_or_by_weight() {
    let loads = Arc::new(Loads::default());
    let by_count = counting_cache_with(
        Via::Batcher,
        &loads,
        storing_every_value().max_capacity(100),
    );
    for k in 0..1000 {
        by_count.get(k).await.unwrap();
    }
    by_count.run_pending_tasks().await;
    let s = by_count.stats();
    assert!(s.entries <= 100, "{s:?}");
    assert!(s.evictions >= 900, "{s:?}");

    let by_weight = Cache::<u64, String>::builder()
        .max_capacity(1_000)
        .weigher(|_k, v| v.len() as u32)
        .build(|_k: u64| async { Ok(Some("x".repeat(100))) })
        .unwrap();
    for k in 0..100 {
        by_weight.get(k).await.unwrap();
    }
    by_weight.run_pending_tasks().await;
    assert!(by_weight.stats().entries <= 10, "{:?}", by_weight.stats());
}

#[test]
fn invalid_settings_are_rejected() {
    let err = Cache::<u64, String>::builder()
        .time_to_live(Duration::ZERO)
        .build(|_k: u64| async { Ok(None) })
        .unwrap_err();
    assert_eq!(err.to_string(), "`time_to_live` must be greater than zero");
    assert!(Cache::<u64, String>::builder()
        .max_capacity(0)
        .build(|_k: u64| async { Ok(None) })
        .is_err());
}

#[tokio::test]
async fn a_lone_callers_abandoned_load_still_fills_the_cache() {
    for via in VIAS {
        let loads = Loads::gated();
        let cache = counting_cache(via, &loads);
        let gave_up = tokio::time::timeout(Duration::from_millis(20), cache.get(9)).await;
        assert!(gave_up.is_err(), "the load is held at the gate");
        loads.gate.as_ref().unwrap().add_permits(1);
        // The load ends with nobody waiting for it, and still fills.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(cache.get(9).await.unwrap(), Some(value_of(9)));
        assert_eq!(cache.get(9).await.unwrap(), Some(value_of(9)));
        assert_eq!(loads.calls(), 1, "{via:?}");
    }
}

#[tokio::test]
async fn by_default_a_key_is_stored_from_its_second_miss() {
    for via in VIAS {
        second_miss_admission(via).await;
    }
}

async fn second_miss_admission(via: Via) {
    let loads = Arc::new(Loads::default());
    let cache = counting_cache_with(
        via,
        &loads,
        // The default admission: second miss.
        Cache::builder().negative_ttl(Duration::from_secs(60)),
    );
    assert_eq!(cache.get(5).await.unwrap(), Some(value_of(5)));
    assert_eq!(cache.get(5).await.unwrap(), Some(value_of(5)));
    assert_eq!(loads.calls(), 2, "the first miss is answered, not stored");
    assert_eq!(cache.get(5).await.unwrap(), Some(value_of(5)));
    assert_eq!(loads.calls(), 2, "the second miss was stored");
    let s = cache.stats();
    assert_eq!((s.misses, s.hits, s.not_admitted), (2, 1, 1), "{s:?}");

    // Invalidation still removes an admitted value, and the key's next
    // miss stores again: it is no longer a first sighting.
    cache.invalidate(&5).await;
    assert_eq!(cache.get(5).await.unwrap(), Some(value_of(5)));
    assert_eq!(cache.get(5).await.unwrap(), Some(value_of(5)));
    assert_eq!(loads.calls(), 3);
}

#[tokio::test]
async fn with_second_miss_admission_errors_are_still_not_cached() {
    for via in VIAS {
        let builder = Cache::builder().admission(Admission::SecondMiss);
        let (cache, calls) = failing_first(via, 2, builder);
        assert!(cache.get(1).await.is_err());
        assert!(cache.get(1).await.is_err());
        assert_eq!(cache.get(1).await.unwrap(), Some(value_of(1)));
        assert_eq!(cache.get(1).await.unwrap(), Some(value_of(1)));
        assert_eq!(
            calls.load(SeqCst),
            4,
            "{via:?}: errors are neither stored nor count as misses seen"
        );
    }
}

#[tokio::test]
async fn a_first_caller_that_stops_polling_holds_nobody_up() {
    for via in VIAS {
        first_caller_not_polled(via).await;
    }
}

async fn first_caller_not_polled(via: Via) {
    let loads = Loads::gated();
    let cache = counting_cache(via, &loads);
    // The first caller starts the load, then is neither polled nor
    // dropped (a future parked in a `select!` loop, say).
    let mut first = Box::pin(cache.get(4));
    assert!(
        tokio::time::timeout(Duration::from_millis(20), &mut first)
            .await
            .is_err(),
        "the load is held at the gate"
    );
    assert_eq!(loads.calls(), 1);
    let second = spawn_get(&cache, 4);
    coalesced(&cache, 1).await;
    loads.gate.as_ref().unwrap().add_permits(1);
    let answer = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the second caller drives the load itself");
    assert_eq!(answer.unwrap().unwrap(), Some(value_of(4)));
    assert_eq!(loads.calls(), 1);
    assert_eq!(first.await.unwrap(), Some(value_of(4)));
}

#[tokio::test]
async fn a_loader_panicking_before_its_future_fails_its_waiters_not_the_caller() {
    for via in VIAS {
        let cache = first_call_panics(via, Panic::BeforeFuture);
        assert!(
            matches!(cache.get(3).await, Err(Error::LoaderPanicked(_))),
            "{via:?}"
        );
        assert_eq!(cache.get(3).await.unwrap(), Some(value_of(3)));
    }
}

#[tokio::test]
async fn a_lookup_after_an_invalidation_does_not_join_the_load_before_it() {
    for via in VIAS {
        let loads = Loads::gated();
        let cache = numbering_cache(via, &loads);
        let before = spawn_get(&cache, 1);
        eventually("load 1 running", || loads.calls() == 1).await;
        // A write commits and invalidates: load 1 may have read the old row.
        cache.invalidate(&1).await;
        let after = spawn_get(&cache, 1);
        eventually("load 2 running", || loads.calls() == 2).await;
        loads.gate.as_ref().unwrap().add_permits(2);
        assert_eq!(before.await.unwrap().unwrap(), Some(1), "{via:?}");
        assert_eq!(
            after.await.unwrap().unwrap(),
            Some(2),
            "{via:?}: the later lookup got its own load"
        );
        assert_eq!(cache.get(1).await.unwrap(), Some(2), "{via:?}");
        assert_eq!(loads.calls(), 2, "{via:?}");
    }
}

#[tokio::test]
async fn a_second_cache_over_the_same_batcher_still_coalesces_and_fills() {
    let loader = TestLoader::new();
    let batcher: Batcher<u64, String> = Batcher::builder().build(loader.clone()).unwrap();
    let first = storing_every_value()
        .build_with_batcher(batcher.clone())
        .unwrap();
    let second = storing_every_value()
        .build_with_batcher(batcher.clone())
        .unwrap();
    for cache in [&first, &second] {
        assert_eq!(cache.get(3).await.unwrap(), Some(value_of(3)));
        assert_eq!(cache.get(3).await.unwrap(), Some(value_of(3)));
    }
    assert_eq!(loader.calls().len(), 2, "one load per cache, then hits");
    assert_eq!(first.stats().hits + second.stats().hits, 2);
    // Plain loads still go through, uncached.
    assert_eq!(batcher.load(3).await.unwrap(), Some(value_of(3)));
    assert_eq!(loader.calls().len(), 3);
}

#[tokio::test]
async fn a_dropped_cache_lets_its_batchers_worker_stop() {
    let (batcher, worker) = Batcher::<u64, String>::builder()
        .build_pair(TestLoader::new())
        .unwrap();
    let worker = tokio::spawn(worker.run());
    let cache = storing_every_value().build_with_batcher(batcher).unwrap();
    assert_eq!(cache.get(1).await.unwrap(), Some(value_of(1)));
    drop(cache);
    tokio::time::timeout(Duration::from_secs(10), worker)
        .await
        .expect("the worker stops with its last handle: the cache's fill holds none")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_over_a_batcher_load_each_key_once_and_fill() {
    let loader = TestLoader::gated();
    let batcher: Batcher<u64, String> = Batcher::builder()
        .max_batch_size(8)
        .build(loader.clone())
        .unwrap();
    let cache = storing_every_value()
        .build_with_batcher(batcher.clone())
        .unwrap();
    gets_over_keys(&cache, &loader, 400, 40).await;
    let mut loaded: Vec<u64> = loader.calls().into_iter().flatten().collect();
    loaded.sort_unstable();
    let before = loaded.len();
    loaded.dedup();
    assert_eq!(before, 40, "each key loaded once: {loaded:?}");
    for k in 0..40 {
        assert_eq!(cache.get(k).await.unwrap(), Some(value_of(k)));
    }
    assert_eq!(
        loader.calls().iter().map(Vec::len).sum::<usize>(),
        40,
        "all hits"
    );
    let s = cache.stats();
    assert_eq!((s.misses, s.coalesced, s.hits), (40, 360, 40), "{s:?}");
}

#[tokio::test]
async fn invalidating_everything_wins_over_a_load_already_running() {
    for via in VIAS {
        let loads = Loads::gated();
        let cache = numbering_cache(via, &loads);
        let early = spawn_get(&cache, 1);
        eventually("load 1 running", || loads.calls() == 1).await;
        cache.invalidate_all();
        loads.gate.as_ref().unwrap().add_permits(2);
        assert_eq!(early.await.unwrap().unwrap(), Some(1), "{via:?}");
        assert_eq!(
            cache.get(1).await.unwrap(),
            Some(2),
            "{via:?}: load 1 began before invalidate_all and was not stored"
        );
        assert_eq!(cache.get(1).await.unwrap(), Some(2), "{via:?}");
        assert_eq!(loads.calls(), 2, "{via:?}");
    }
}

#[tokio::test]
async fn a_plain_load_beside_a_running_miss_leaves_it_joinable() {
    let loader = TestLoader::gated();
    let batcher: Batcher<u64, String> = Batcher::builder().build(loader.clone()).unwrap();
    let cache = storing_every_value()
        .build_with_batcher(batcher.clone())
        .unwrap();
    let miss = spawn_get(&cache, 5);
    eventually("the miss loading", || loader.running() == 1).await;
    // The cache bypassed (as the server does while its invalidations are
    // not proved): a plain load of the same key runs beside it.
    let plain = tokio::spawn({
        let batcher = batcher.clone();
        async move { batcher.load(5).await }
    });
    eventually("the plain load running", || loader.running() == 2).await;
    let again = spawn_get(&cache, 5);
    coalesced(&cache, 1).await;
    loader.open(10);
    for answer in [miss.await, plain.await, again.await] {
        assert_eq!(answer.unwrap().unwrap(), Some(value_of(5)));
    }
    assert_eq!(loader.calls().len(), 2, "the second miss joined the first");
}

#[tokio::test]
async fn an_inserted_value_wins_over_a_load_already_running() {
    for via in VIAS {
        let loads = Loads::gated();
        let cache = numbering_cache(via, &loads);
        let early = spawn_get(&cache, 1);
        eventually("load 1 running", || loads.calls() == 1).await;
        // A write stores its row while load 1 (old data) still runs.
        cache.insert(1, 100).await;
        loads.gate.as_ref().unwrap().add_permits(1);
        assert_eq!(early.await.unwrap().unwrap(), Some(1), "{via:?}");
        assert_eq!(cache.get(1).await.unwrap(), Some(100), "{via:?}");
        assert_eq!(cache.get_if_present(&1).await, Some(Some(100)), "{via:?}");
        assert_eq!(loads.calls(), 1, "{via:?}: the insert is a hit");
    }
}

#[tokio::test]
async fn an_insert_is_stored_whatever_the_admission() {
    for via in VIAS {
        let loads = Arc::new(Loads::default());
        let cache = counting_cache_with(
            via,
            &loads,
            Cache::builder().admission(Admission::SecondMiss),
        );
        cache.insert(4, "primed".to_owned()).await;
        assert_eq!(cache.get(4).await.unwrap().as_deref(), Some("primed"));
        assert_eq!(loads.calls(), 0, "{via:?}");
    }
}

#[tokio::test]
async fn get_if_present_answers_from_the_cache_and_never_loads() {
    for via in VIAS {
        let loads = Arc::new(Loads::default());
        let builder = storing_every_value().negative_ttl(Duration::from_secs(60));
        let counted = Arc::clone(&loads);
        let cache = build_via(via, builder, move |k: u64| {
            let loads = Arc::clone(&counted);
            async move {
                loads.pass().await;
                Ok((k != 0).then(|| value_of(k)))
            }
        });
        assert_eq!(cache.get_if_present(&1).await, None, "{via:?}");
        assert_eq!(loads.calls(), 0, "{via:?}");
        cache.get(1).await.unwrap();
        cache.get(0).await.unwrap();
        assert_eq!(cache.get_if_present(&1).await, Some(Some(value_of(1))));
        assert_eq!(
            cache.get_if_present(&0).await,
            Some(None),
            "{via:?}: a cached \"not found\""
        );
        assert_eq!(loads.calls(), 2, "{via:?}");
        assert_eq!(cache.stats().hits, 2, "{via:?}");
    }
}

#[tokio::test]
async fn get_many_answers_hits_from_the_cache_and_sends_the_misses_as_one_load() {
    let batches = Arc::new(std::sync::Mutex::new(Vec::<Vec<u64>>::new()));
    let seen = Arc::clone(&batches);
    let batcher = Batcher::builder()
        .build(loader_fn(move |keys: Vec<u64>| {
            seen.lock().unwrap().push(keys.clone());
            async move {
                Ok::<_, Error>(
                    keys.into_iter()
                        .filter(|k| k % 10 != 0)
                        .map(|k| (k, value_of(k)))
                        .collect::<HashMap<_, _>>(),
                )
            }
        }))
        .unwrap();
    let cache = storing_every_value().build_with_batcher(batcher).unwrap();
    for k in 1..=5 {
        cache.insert(k, format!("primed {k}")).await;
    }
    let keys: Vec<u64> = (1..=20).chain([7, 12]).collect();
    let got = cache.get_many(keys.clone()).await;
    assert_eq!(got.len(), keys.len());
    for (k, got) in keys.iter().zip(got) {
        let want = match k {
            1..=5 => Some(format!("primed {k}")),
            k if k % 10 == 0 => None,
            k => Some(value_of(*k)),
        };
        assert_eq!(got.unwrap(), want, "key {k}");
    }
    let batches = batches.lock().unwrap().clone();
    assert_eq!(batches.len(), 1, "the misses in one load: {batches:?}");
    let mut loaded = batches[0].clone();
    loaded.sort_unstable();
    assert_eq!(loaded, (6..=20).collect::<Vec<_>>(), "each miss once");
    // And the loaded ones were stored.
    assert_eq!(cache.get_if_present(&6).await, Some(Some(value_of(6))));
}

#[tokio::test]
async fn get_many_over_a_plain_loader_answers_in_order_and_shares_loads() {
    let loads = Arc::new(Loads::default());
    let cache = counting_cache(Via::Flights, &loads);
    cache.get(2).await.unwrap();
    let got = cache.get_many([3, 2, 3, 9]).await;
    let got: Vec<_> = got.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        got,
        [3, 2, 3, 9].map(|k| Some(value_of(k))).to_vec(),
        "in the order asked"
    );
    assert_eq!(loads.calls(), 3, "2 once before, then 3 and 9 once each");
}

#[tokio::test]
async fn a_miss_that_waited_while_its_key_was_filled_is_not_loaded_again() {
    // One thread: the order below is the scheduler's, not a race.
    let loads = Loads::gated();
    let cache = numbering_cache(Via::Batcher, &loads);
    let first = spawn_get(&cache, 1);
    eventually("load 1 running", || loads.calls() == 1).await;
    // The second miss runs, and queues its request, before the load's
    // task finishes and fills the cache; the worker then sees the load's
    // completion before that request (completions come first).
    let second = spawn_get(&cache, 1);
    loads.gate.as_ref().unwrap().add_permits(2);
    assert_eq!(first.await.unwrap().unwrap(), Some(1));
    assert_eq!(
        second.await.unwrap().unwrap(),
        Some(1),
        "answered with what load 1 stored"
    );
    assert_eq!(loads.calls(), 1, "not loaded again");
    assert_eq!(cache.stats().coalesced, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_misses_loads_each_key_once_though_misses_wait_behind_loads() {
    // 400 misses over 100 keys at once, through a batcher allowed one
    // small load at a time: most misses wait in the channel while loads
    // run, and many find their key stored by the time the worker takes
    // them. None of those is loaded again.
    let loaded = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let seen = Arc::clone(&loaded);
    let batcher = Batcher::builder()
        .max_batch_size(8)
        .concurrency(pgbatch::Concurrency::Fixed(1))
        .build(loader_fn(move |keys: Vec<u64>| {
            seen.lock().unwrap().extend(&keys);
            async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                Ok::<_, Error>(
                    keys.into_iter()
                        .map(|k| (k, value_of(k)))
                        .collect::<HashMap<_, _>>(),
                )
            }
        }))
        .unwrap();
    let cache = storing_every_value().build_with_batcher(batcher).unwrap();
    let gets: Vec<_> = (0..400u64)
        .map(|i| {
            let cache = cache.clone();
            tokio::spawn(async move { (i % 100, cache.get(i % 100).await) })
        })
        .collect();
    for get in gets {
        let (key, value) = get.await.unwrap();
        assert_eq!(value.unwrap(), Some(value_of(key)));
    }
    let mut loaded = loaded.lock().unwrap().clone();
    let all = loaded.len();
    loaded.sort_unstable();
    loaded.dedup();
    assert_eq!(loaded.len(), 100);
    assert_eq!(all, 100, "each key loaded once");
}

/// A caller looping over hits lets the thread's other tasks run: moka
/// answers a hit at once, so without the cache spending tokio's budget the
/// loop would hold its thread until it ended. On one thread, a task that
/// only counts runs while another does 10,000 hits, over both sources.
#[tokio::test(flavor = "current_thread")]
async fn a_caller_looping_over_hits_lets_other_tasks_run() {
    for via in [Via::Batcher, Via::Flights] {
        let loads = Arc::new(Loads::default());
        let cache = counting_cache(via, &loads);
        cache.get(1).await.unwrap();
        let ticks = Arc::new(AtomicUsize::new(0));
        let counter = {
            let ticks = Arc::clone(&ticks);
            tokio::spawn(async move {
                loop {
                    ticks.fetch_add(1, SeqCst);
                    tokio::task::yield_now().await;
                }
            })
        };
        tokio::task::yield_now().await;
        let before = ticks.load(SeqCst);
        for _ in 0..10_000 {
            assert_eq!(cache.get(1).await.unwrap(), Some(value_of(1)));
        }
        let during = ticks.load(SeqCst) - before;
        counter.abort();
        assert!(
            during >= 10,
            "{via:?}: the other task ran {during} times during 10,000 hits"
        );
    }
}
