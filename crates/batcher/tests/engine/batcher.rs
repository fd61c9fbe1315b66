//! Black-box tests of the batcher's behaviour, on virtual time.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use crate::support::{settle, value_of, TestError, TestLoader, FAIL_KEY, MISSING_FROM, PANIC_KEY};
use pgbatch::{loader_fn, Batcher, BatcherBuilder, BuildError, Error, FlushPolicy, Overflow};
use tokio::task::JoinHandle;
use tokio::time::{advance, Instant};
use tokio_test::{assert_pending, assert_ready};

type B = Batcher<u64, String>;
type Reply = Result<Option<String>, Error>;

fn builder() -> BatcherBuilder<u64, String> {
    Batcher::builder()
}

fn spawn_load(b: &B, key: u64) -> JoinHandle<Reply> {
    let b = b.clone();
    tokio::spawn(async move { b.load(key).await })
}

async fn ok(h: JoinHandle<Reply>) -> Option<String> {
    h.await.expect("caller task panicked").expect("load failed")
}

#[tokio::test(start_paused = true)]
async fn flushes_when_batch_reaches_max_size() {
    let loader = TestLoader::new();
    let b = builder()
        .policy(FlushPolicy::FixedDelay)
        .max_batch_size(4)
        .max_delay(Duration::from_secs(3600))
        .build(loader.clone())
        .unwrap();

    let first: Vec<_> = (1..=3).map(|k| spawn_load(&b, k)).collect();
    settle().await;
    assert!(
        loader.calls().is_empty(),
        "3 of 4 keys must wait for the delay"
    );

    let fourth = spawn_load(&b, 4);
    settle().await;
    assert_eq!(loader.calls(), vec![vec![1, 2, 3, 4]]);
    for (k, h) in (1..).zip(first.into_iter().chain([fourth])) {
        assert_eq!(ok(h).await, Some(value_of(k)));
    }
}

#[tokio::test(start_paused = true)]
async fn fixed_delay_flushes_max_delay_after_first_key() {
    let loader = TestLoader::new();
    let b = builder()
        .policy(FlushPolicy::FixedDelay)
        .max_batch_size(100)
        .max_delay(Duration::from_millis(10))
        .build(loader.clone())
        .unwrap();

    let h1 = spawn_load(&b, 1);
    settle().await;
    advance(Duration::from_millis(6)).await;
    let h2 = spawn_load(&b, 2);
    settle().await;
    advance(Duration::from_millis(3)).await;
    settle().await;
    assert!(loader.calls().is_empty(), "flushed before max_delay");

    // 10 ms after the first key, not after the last one.
    advance(Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(loader.calls(), vec![vec![1, 2]]);
    assert_eq!(ok(h1).await, Some(value_of(1)));
    assert_eq!(ok(h2).await, Some(value_of(2)));

    // The timer is disarmed after a flush: an idle batcher stays idle.
    advance(Duration::from_secs(60)).await;
    settle().await;
    assert_eq!(loader.calls().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn eager_policy_adds_no_delay_when_a_slot_is_free() {
    let loader = TestLoader::new();
    let b = builder()
        .policy(FlushPolicy::Eager)
        .max_delay(Duration::from_secs(3600))
        .build(loader.clone())
        .unwrap();

    let start = Instant::now();
    assert_eq!(b.load(7).await.unwrap(), Some(value_of(7)));
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "virtual time must not move"
    );
    assert_eq!(loader.calls(), vec![vec![7]]);
}

#[tokio::test(start_paused = true)]
async fn eager_policy_accumulates_only_while_all_slots_are_busy() {
    let loader = TestLoader::gated();
    let b = builder()
        .max_concurrent_batches(1)
        .build(loader.clone())
        .unwrap();

    let h1 = spawn_load(&b, 1);
    settle().await;
    assert_eq!(loader.calls(), vec![vec![1]], "first key goes out alone");

    let rest: Vec<_> = (2..=4).map(|k| spawn_load(&b, k)).collect();
    settle().await;
    assert_eq!(loader.calls().len(), 1, "no free slot: keys must wait");

    loader.open(2);
    assert_eq!(ok(h1).await, Some(value_of(1)));
    for h in rest {
        assert!(ok(h).await.is_some());
    }
    assert_eq!(loader.calls(), vec![vec![1], vec![2, 3, 4]]);
}

#[tokio::test(start_paused = true)]
async fn at_most_max_concurrent_batches_run_at_once() {
    let loader = TestLoader::gated();
    let b = builder()
        .max_concurrent_batches(3)
        .max_batch_size(1)
        .build(loader.clone())
        .unwrap();

    let handles: Vec<_> = (0..20).map(|k| spawn_load(&b, k)).collect();
    settle().await;
    assert_eq!(loader.running(), 3);
    assert_eq!(b.stats().in_flight_batches, 3);

    loader.open(20);
    for (k, h) in (0..).zip(handles) {
        assert_eq!(ok(h).await, Some(value_of(k)));
    }
    assert_eq!(loader.max_running(), 3);
    assert_eq!(loader.calls().len(), 20);
}

/// A load that ends frees its slot for the next due batch before its
/// own callers are answered: answering a batch takes the worker a while,
/// and the database should not wait meanwhile. On the current-thread
/// runtime tasks run in the order they were woken, so the next load runs
/// before the first caller does.
#[tokio::test]
async fn the_next_batch_starts_before_the_finished_one_is_answered() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::{Arc, Mutex};

    let first_answered = Arc::new(AtomicBool::new(false));
    let seen_by_second_load = Arc::new(Mutex::new(None));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let loader = {
        let (first_answered, seen, gate) = (
            Arc::clone(&first_answered),
            Arc::clone(&seen_by_second_load),
            Arc::clone(&gate),
        );
        loader_fn(move |keys: Vec<u64>| {
            let (first_answered, seen, gate) = (
                Arc::clone(&first_answered),
                Arc::clone(&seen),
                Arc::clone(&gate),
            );
            async move {
                if keys == [1] {
                    gate.acquire().await.expect("gate open").forget();
                } else {
                    *seen.lock().unwrap() = Some(first_answered.load(SeqCst));
                }
                Ok::<_, Infallible>(
                    keys.into_iter()
                        .map(|k| (k, value_of(k)))
                        .collect::<HashMap<_, _>>(),
                )
            }
        })
    };
    let b = builder()
        .policy(FlushPolicy::Eager)
        .max_concurrent_batches(1)
        .build(loader)
        .unwrap();

    let first = {
        let (b, first_answered) = (b.clone(), Arc::clone(&first_answered));
        tokio::spawn(async move {
            let answer = b.load(1).await;
            first_answered.store(true, SeqCst);
            answer
        })
    };
    settle().await;
    let second = spawn_load(&b, 2);
    settle().await;
    assert_eq!(
        *seen_by_second_load.lock().unwrap(),
        None,
        "one slot: key 2 waits"
    );

    gate.add_permits(1);
    assert_eq!(ok(first).await, Some(value_of(1)));
    assert_eq!(ok(second).await, Some(value_of(2)));
    assert_eq!(
        *seen_by_second_load.lock().unwrap(),
        Some(false),
        "key 2's load must start before key 1's caller has its answer"
    );
}

#[tokio::test(start_paused = true)]
async fn a_key_asked_twice_in_one_batch_is_loaded_once() {
    let loader = TestLoader::gated();
    let b = builder()
        .max_concurrent_batches(1)
        .build(loader.clone())
        .unwrap();

    let busy = spawn_load(&b, 0);
    settle().await;
    let dup = [spawn_load(&b, 5), spawn_load(&b, 5), spawn_load(&b, 6)];
    settle().await;
    loader.open(2);
    ok(busy).await;
    let [a, b2, c] = dup;
    assert_eq!(ok(a).await, Some(value_of(5)));
    assert_eq!(ok(b2).await, Some(value_of(5)));
    assert_eq!(ok(c).await, Some(value_of(6)));
    assert_eq!(loader.calls(), vec![vec![0], vec![5, 6]]);
    assert_eq!(b.stats().deduplicated, 1);
}

#[tokio::test(start_paused = true)]
async fn join_in_flight_attaches_to_the_running_load_when_enabled() {
    for join in [false, true] {
        let loader = TestLoader::gated();
        let b = builder()
            .join_in_flight(join)
            .build(loader.clone())
            .unwrap();

        let first = spawn_load(&b, 5);
        settle().await;
        let second = spawn_load(&b, 5);
        settle().await;
        loader.open(2);
        assert_eq!(ok(first).await, Some(value_of(5)));
        assert_eq!(ok(second).await, Some(value_of(5)));

        let expected_calls = if join { 1 } else { 2 };
        assert_eq!(
            loader.calls().len(),
            expected_calls,
            "join_in_flight={join}"
        );
        assert_eq!(b.stats().joined_in_flight, u64::from(join));
    }
}

#[tokio::test(start_paused = true)]
async fn each_key_gets_its_value_or_not_found() {
    let loader = TestLoader::new();
    let b = builder().build(loader.clone()).unwrap();

    let results = b.load_many([3, MISSING_FROM + 1, 3, 5]).await;
    let results: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        results,
        vec![
            Some(value_of(3)),
            None,
            Some(value_of(3)),
            Some(value_of(5))
        ]
    );
    let loaded: usize = loader.calls().iter().map(Vec::len).sum();
    assert_eq!(loaded, 3, "distinct keys only: {:?}", loader.calls());
    let stats = b.stats();
    assert_eq!((stats.found, stats.not_found), (2, 1));
}

/// Answers every key, with `None` for the odd ones: "not found" as a
/// value, as a `LEFT JOIN` gives it.
struct EveryKey;

impl pgbatch::Loader<u64, Option<u64>> for EveryKey {
    type Error = Infallible;

    async fn load(&self, keys: Vec<u64>) -> Result<pgbatch::Loaded<u64, Option<u64>>, Infallible> {
        Ok(keys
            .into_iter()
            .map(|k| (k, (k % 2 == 0).then_some(k)))
            .collect())
    }

    fn is_absent(&self, value: &Option<u64>) -> bool {
        value.is_none()
    }
}

#[tokio::test(start_paused = true)]
async fn values_the_loader_marks_absent_reach_the_caller_and_count_as_not_found() {
    for direct in [false, true] {
        let b = Batcher::builder()
            .direct_when_idle(direct)
            .build(EveryKey)
            .unwrap();
        let results: Vec<_> = b
            .load_many([1, 2, 3])
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(results, vec![Some(None), Some(Some(2)), Some(None)]);
        assert_eq!(b.load(5).await.unwrap(), Some(None), "a lone key");
        let stats = b.stats();
        assert_eq!((stats.found, stats.not_found), (1, 3), "direct: {direct}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_load_gives_every_waiter_of_its_batch_the_same_error() {
    let loader = TestLoader::new();
    let b = builder()
        .policy(FlushPolicy::FixedDelay)
        .max_batch_size(3)
        .build(loader.clone())
        .unwrap();

    let results = b.load_many([1, FAIL_KEY, 2]).await;
    assert_eq!(loader.calls(), vec![vec![1, 2, FAIL_KEY]]);
    for r in &results {
        let err = r.as_ref().unwrap_err();
        assert!(matches!(err, Error::Load(_)), "{err:?}");
        let cause = err.load_error::<TestError>().expect("loader's own error");
        assert_eq!(cause.0, format!("{:?}", [1, 2, FAIL_KEY]));
        assert_eq!(
            err.to_string(),
            "batch load failed: test loader failed: [1, 2, 666]",
            "the cause, once"
        );
    }
    // The error is shared, not copied per waiter.
    let (Err(Error::Load(a)), Err(Error::Load(c))) = (&results[0], &results[2]) else {
        unreachable!()
    };
    assert!(std::sync::Arc::ptr_eq(a, c));

    // Errors are not sticky: the next batch loads normally.
    assert_eq!(b.load(1).await.unwrap(), Some(value_of(1)));
    assert_eq!(b.stats().failed_batches, 1);
    assert_eq!(b.stats().failed_keys, 3);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_loader_fails_its_waiters_and_the_worker_keeps_serving() {
    let loader = TestLoader::new();
    let b = builder()
        .policy(FlushPolicy::FixedDelay)
        .max_batch_size(2)
        .build(loader.clone())
        .unwrap();

    let results = b.load_many([PANIC_KEY, 4]).await;
    for r in results {
        match r {
            Err(Error::LoaderPanicked(msg)) => assert_eq!(&*msg, "loader panicked on purpose"),
            other => panic!("expected LoaderPanicked, got {other:?}"),
        }
    }
    let again = b.load_many([4, 5]).await;
    assert_eq!(again[0].as_ref().unwrap(), &Some(value_of(4)));
    assert_eq!(b.stats().panicked_batches, 1);
}

#[tokio::test(start_paused = true)]
async fn a_request_deadline_times_out_and_leaves_nothing_behind() {
    let loader = TestLoader::gated();
    let b = builder()
        .max_concurrent_batches(1)
        .timeout(Duration::from_millis(100))
        .build(loader.clone())
        .unwrap();

    // Key 1 is dispatched and hangs; key 2 waits behind it.
    let h1 = spawn_load(&b, 1);
    settle().await;
    let h2 = spawn_load(&b, 2);
    let start = Instant::now();
    assert!(
        matches!(h1.await.unwrap(), Err(Error::Timeout(d)) if d.after() == Duration::from_millis(100))
    );
    assert!(matches!(h2.await.unwrap(), Err(Error::Timeout(_))));
    assert_eq!(start.elapsed(), Duration::from_millis(100));

    // The worker timed key 2 out where it waited, so when the hung load
    // finishes, key 2 is not loaded, and the worker holds nothing.
    loader.open(10);
    settle().await;
    assert_eq!(loader.calls(), vec![vec![1]]);
    let stats = b.stats();
    assert_eq!(stats.timed_out, 2);
    assert_eq!(stats.abandoned, 0, "a timeout is not counted twice");
    assert_eq!((stats.pending_keys, stats.in_flight_batches), (0, 0));

    // And it still serves.
    assert_eq!(b.load(3).await.unwrap(), Some(value_of(3)));
}

#[tokio::test(start_paused = true)]
async fn callers_beyond_a_full_batch_time_out_while_every_slot_hangs() {
    // The worker times callers out itself (they hold no timers), so it must
    // see the requests it cannot batch yet too.
    let loader = TestLoader::gated();
    let b = builder()
        .max_batch_size(2)
        .max_concurrent_batches(1)
        .timeout(Duration::from_millis(100))
        .build(loader.clone())
        .unwrap();

    let running = spawn_load(&b, 1);
    settle().await;
    let waiting: Vec<_> = (2..=6).map(|k| spawn_load(&b, k)).collect();
    let start = Instant::now();
    assert!(matches!(running.await.unwrap(), Err(Error::Timeout(_))));
    for h in waiting {
        assert!(matches!(h.await.unwrap(), Err(Error::Timeout(_))));
    }
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    let stats = b.stats();
    assert_eq!((stats.timed_out, stats.pending_keys), (6, 0));

    loader.open(10);
    settle().await;
    assert_eq!(
        loader.calls(),
        vec![vec![1]],
        "timed-out keys are not loaded"
    );
    assert_eq!(b.load(7).await.unwrap(), Some(value_of(7)));
}

#[tokio::test(start_paused = true)]
async fn keys_beyond_a_full_batch_are_loaded_oldest_first() {
    let loader = TestLoader::gated();
    let b = builder()
        .max_batch_size(2)
        .max_concurrent_batches(1)
        .build(loader.clone())
        .unwrap();
    let first = spawn_load(&b, 1);
    settle().await;
    // Arriving in this order, a millisecond apart, while the slot is busy.
    let mut waiting = Vec::new();
    for k in [9, 5, 7, 3, 8, 2] {
        waiting.push(spawn_load(&b, k));
        settle().await;
        advance(Duration::from_millis(1)).await;
    }
    loader.open(10);
    ok(first).await;
    for h in waiting {
        ok(h).await;
    }
    let calls = loader.calls();
    assert_eq!(calls, vec![vec![1], vec![5, 9], vec![3, 7], vec![2, 8]]);
}

#[tokio::test(start_paused = true)]
async fn keys_behind_a_full_batch_time_out_on_time_and_share_one_load() {
    let loader = TestLoader::gated();
    let b = builder()
        .max_batch_size(2)
        .max_concurrent_batches(1)
        .timeout(Duration::from_millis(100))
        .build(loader.clone())
        .unwrap();
    let running = spawn_load(&b, 1);
    settle().await;
    // A full batch forms (2, 3) while the only slot is busy; 4 and 5 wait
    // behind it.
    let early: Vec<_> = [2, 3, 4, 5].map(|k| spawn_load(&b, k)).into();
    settle().await;
    advance(Duration::from_millis(50)).await;
    // A second caller of 4 joins it behind the batch; 6 is new.
    let late: Vec<_> = [4, 6].map(|k| spawn_load(&b, k)).into();
    settle().await;
    assert_eq!(b.stats().pending_keys, 5, "2 and 3 pending, 4 to 6 behind");
    assert_eq!(b.stats().deduplicated, 1);

    // The first callers' deadline: answered then, wherever they wait.
    advance(Duration::from_millis(50)).await;
    for h in [running].into_iter().chain(early) {
        assert!(matches!(h.await.unwrap(), Err(Error::Timeout(_))));
    }
    assert_eq!(
        b.stats().pending_keys,
        2,
        "4's second caller and 6 moved up"
    );

    loader.open(10);
    for (h, k) in late.into_iter().zip([4, 6]) {
        assert_eq!(ok(h).await, Some(value_of(k)));
    }
    assert_eq!(
        loader.calls(),
        vec![vec![1], vec![4, 6]],
        "timed-out keys are not loaded; 4 once"
    );
    assert_eq!(b.stats().pending_keys, 0);
}

/// Clones of [`Counted`] keys, counted by their `Clone`.
static KEY_CLONES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A key that counts its clones (only the test below uses it).
#[derive(Debug, PartialEq, Eq, Hash)]
struct Counted(u64);

impl Clone for Counted {
    fn clone(&self) -> Self {
        KEY_CLONES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Self(self.0)
    }
}

#[tokio::test(start_paused = true)]
async fn a_backlog_costs_each_key_the_same_not_the_backlog() {
    // The worker once picked each batch out of everything waiting, cloning
    // every waiting key per batch: a backlog made each key cost more, so
    // an overloaded batcher fell further behind. Clones are the measure
    // here; a key's own are a few whatever the backlog.
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let g = std::sync::Arc::clone(&gate);
    let loader = loader_fn(move |keys: Vec<Counted>| {
        let g = std::sync::Arc::clone(&g);
        async move {
            g.acquire().await.expect("never closed").forget();
            let found = keys.into_iter().map(|k| {
                let v = k.0;
                (k, v)
            });
            Ok::<_, Infallible>(found.collect::<HashMap<_, _>>())
        }
    });
    let b: Batcher<Counted, u64> = Batcher::builder()
        .max_batch_size(4)
        .max_concurrent_batches(1)
        .build(loader)
        .unwrap();
    let n = 4_001;
    let callers: Vec<_> = (0..n)
        .map(|k| {
            let b = b.clone();
            tokio::spawn(async move { (k, b.load(Counted(k)).await) })
        })
        .collect();
    for _ in 0..1_000 {
        if b.stats().pending_keys + 4 >= n {
            break;
        }
        settle().await;
    }
    let waiting = b.stats().pending_keys;
    assert!(waiting + 4 >= n, "one load runs, the rest wait: {waiting}");
    gate.add_permits(n as usize);
    for caller in callers {
        let (k, answer) = caller.await.unwrap();
        assert_eq!(answer.unwrap(), Some(k));
    }
    let per_key = KEY_CLONES.load(std::sync::atomic::Ordering::SeqCst) as f64 / n as f64;
    assert!(per_key <= 3.0, "{per_key:.1} clones a key");
}

#[tokio::test(start_paused = true)]
async fn a_fixed_delay_starts_afresh_after_its_pending_keys_time_out() {
    let loader = TestLoader::gated();
    let b = builder()
        .policy(FlushPolicy::FixedDelay)
        .max_batch_size(2)
        .max_concurrent_batches(1)
        .max_delay(Duration::from_millis(10))
        .timeout(Duration::from_millis(100))
        .build(loader.clone())
        .unwrap();
    // A full batch hangs in the only slot; key 3's flush delay passes with
    // no slot free, then every key times out.
    let hung: Vec<_> = [1, 2].map(|k| spawn_load(&b, k)).into();
    settle().await;
    let late = spawn_load(&b, 3);
    for h in hung.into_iter().chain([late]) {
        assert!(matches!(h.await.unwrap(), Err(Error::Timeout(_))));
    }
    loader.open(10);
    settle().await;
    assert_eq!(loader.calls(), vec![vec![1, 2]]);

    // A new key waits its own delay, as on an idle batcher.
    let next = spawn_load(&b, 4);
    settle().await;
    assert_eq!(loader.calls().len(), 1, "dispatched before its delay");
    advance(Duration::from_millis(10)).await;
    assert_eq!(ok(next).await, Some(value_of(4)));
    assert_eq!(loader.calls(), vec![vec![1, 2], vec![4]]);
}

#[tokio::test(start_paused = true)]
async fn the_worker_sheds_requests_past_the_waiters_it_may_hold() {
    // One running, one batch forming, one channel's worth: three held.
    let loader = TestLoader::gated();
    let b = builder()
        .max_batch_size(1)
        .max_concurrent_batches(1)
        .channel_capacity(1)
        .build(loader.clone())
        .unwrap();
    let mut held = Vec::new();
    for k in 1..=3 {
        held.push((k, spawn_load(&b, k)));
        settle().await; // received before the next: the channel holds one
    }
    assert_eq!(b.stats().queued, 0);
    let shed = b.load(4).await;
    assert!(matches!(shed, Err(Error::Overloaded)), "{shed:?}");
    assert_eq!(b.stats().overloaded, 1);

    loader.open(3);
    for (k, h) in held {
        assert_eq!(ok(h).await, Some(value_of(k)));
    }
}

#[tokio::test(start_paused = true)]
async fn a_worker_not_yet_run_cannot_time_callers_out_so_they_do() {
    let (b, _worker) = builder()
        .timeout(Duration::from_millis(20))
        .build_pair(TestLoader::new())
        .unwrap();
    let start = Instant::now();
    assert!(matches!(b.load(1).await, Err(Error::Timeout(_))));
    assert_eq!(start.elapsed(), Duration::from_millis(20));
    assert_eq!(b.stats().timed_out, 1);
}

#[tokio::test(start_paused = true)]
async fn a_load_timeout_frees_the_slot_of_a_hung_load() {
    let loader = TestLoader::gated();
    let b = builder()
        .max_concurrent_batches(1)
        .load_timeout(Duration::from_millis(50))
        .build(loader.clone())
        .unwrap();

    let err = b.load(1).await.unwrap_err();
    assert!(matches!(err, Error::LoadTimeout(_)), "{err:?}");
    assert!(err.is_timeout());
    settle().await;
    assert_eq!(loader.running(), 0, "the hung load was dropped");

    loader.open(1);
    assert_eq!(b.load(2).await.unwrap(), Some(value_of(2)));
    assert_eq!(b.stats().timed_out_batches, 1);
}

#[tokio::test(start_paused = true)]
async fn a_caller_dropped_before_dispatch_is_not_loaded_unless_another_wants_the_key() {
    let loader = TestLoader::gated();
    let b = builder()
        .max_concurrent_batches(1)
        .build(loader.clone())
        .unwrap();

    let busy = spawn_load(&b, 0);
    settle().await;
    let gone = spawn_load(&b, 7);
    let kept = spawn_load(&b, 8);
    let gone_dup = spawn_load(&b, 9);
    let kept_dup = spawn_load(&b, 9);
    settle().await;
    gone.abort();
    gone_dup.abort();
    settle().await;

    loader.open(2);
    ok(busy).await;
    assert_eq!(ok(kept).await, Some(value_of(8)));
    assert_eq!(ok(kept_dup).await, Some(value_of(9)));
    assert_eq!(loader.calls(), vec![vec![0], vec![8, 9]]);
    assert_eq!(b.stats().abandoned, 2);
}

#[tokio::test(start_paused = true)]
async fn a_caller_dropped_after_dispatch_affects_nobody_else() {
    let loader = TestLoader::gated();
    let b = builder()
        .policy(FlushPolicy::FixedDelay)
        .max_batch_size(2)
        .build(loader.clone())
        .unwrap();

    let dropped = spawn_load(&b, 3);
    let kept = spawn_load(&b, 4);
    settle().await;
    assert_eq!(loader.calls(), vec![vec![3, 4]]);
    dropped.abort();
    settle().await;

    loader.open(1);
    assert_eq!(ok(kept).await, Some(value_of(4)));
    let stats = b.stats();
    assert_eq!((stats.found, stats.failed_keys), (2, 0));
}

#[tokio::test]
async fn a_full_queue_rejects_at_once() {
    let loader = TestLoader::new();
    let (b, worker) = builder()
        .channel_capacity(2)
        .build_pair(loader.clone())
        .unwrap();

    // Nothing drains the queue yet: two requests fill it.
    let mut first = tokio_test::task::spawn(b.load(1));
    let mut second = tokio_test::task::spawn(b.load(2));
    assert_pending!(first.poll());
    assert_pending!(second.poll());
    let mut third = tokio_test::task::spawn(b.load(3));
    let rejected = assert_ready!(third.poll());
    assert!(matches!(rejected, Err(Error::Overloaded)), "{rejected:?}");
    assert!(rejected.unwrap_err().is_overloaded());
    assert_eq!(b.stats().queued, 2);

    tokio::spawn(worker.run());
    assert_eq!(first.await.unwrap(), Some(value_of(1)));
    assert_eq!(second.await.unwrap(), Some(value_of(2)));
    assert_eq!(b.stats().overloaded, 1);
}

#[tokio::test]
async fn overflow_wait_waits_for_room_in_the_queue() {
    let loader = TestLoader::new();
    let (b, worker) = builder()
        .channel_capacity(1)
        .overflow(Overflow::Wait)
        .build_pair(loader.clone())
        .unwrap();

    let mut first = tokio_test::task::spawn(b.load(1));
    let mut second = tokio_test::task::spawn(b.load(2));
    assert_pending!(first.poll());
    assert_pending!(second.poll());

    tokio::spawn(worker.run());
    assert_eq!(first.await.unwrap(), Some(value_of(1)));
    assert_eq!(second.await.unwrap(), Some(value_of(2)));
    assert_eq!(b.stats().overloaded, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_callers_on_two_threads_through_a_tiny_queue_all_get_their_answer() {
    // Lost wake-ups between callers and the worker would hang some caller:
    // each policy of a full queue, on two threads, with a queue of 2.
    for overflow in [Overflow::Wait, Overflow::Reject] {
        let b = builder()
            .channel_capacity(2)
            .overflow(overflow)
            .build(TestLoader::new())
            .unwrap();
        let callers: Vec<_> = (0..64u64)
            .map(|c| {
                let b = b.clone();
                tokio::spawn(async move {
                    let (mut answered, mut refused) = (0, 0);
                    for i in 0..200 {
                        let key = (c * 200 + i) % 500;
                        match b.load(key).await {
                            Ok(v) => {
                                assert_eq!(v, Some(value_of(key)));
                                answered += 1;
                            }
                            Err(e) if e.is_overloaded() => refused += 1,
                            Err(e) => panic!("key {key}: {e:?}"),
                        }
                    }
                    (answered, refused)
                })
            })
            .collect();
        let (mut answered, mut refused) = (0, 0);
        for c in callers {
            let (a, r) = tokio::time::timeout(Duration::from_secs(20), c)
                .await
                .expect("every caller is answered")
                .unwrap();
            answered += a;
            refused += r;
        }
        assert_eq!(answered + refused, 64 * 200, "{overflow:?}");
        if overflow == Overflow::Wait {
            assert_eq!(refused, 0, "waiting senders are never refused");
        }
        b.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn overflow_wait_is_bounded_by_the_deadline() {
    let (b, _worker) = builder()
        .channel_capacity(1)
        .overflow(Overflow::Wait)
        .timeout(Duration::from_millis(20))
        .build_pair(TestLoader::new())
        .unwrap();
    let queued = spawn_load(&b, 1);
    settle().await;
    // The worker never runs: the second request waits for room, then times out.
    assert!(matches!(b.load(2).await, Err(Error::Timeout(_))));
    assert!(matches!(queued.await.unwrap(), Err(Error::Timeout(_))));
}

#[tokio::test]
async fn an_idle_worker_stays_pending_and_a_dropped_one_yields_closed() {
    // Through the worker: a lone caller would otherwise load directly and
    // not depend on the worker at all.
    let (b, worker) = builder()
        .direct_when_idle(false)
        .build_pair(TestLoader::new())
        .unwrap();
    let mut worker = tokio_test::task::spawn(worker.run());
    assert_pending!(worker.poll());
    assert_pending!(worker.poll());

    let mut waiting = tokio_test::task::spawn(b.load(1));
    assert_pending!(waiting.poll());
    drop(worker);
    assert!(waiting.is_woken());
    assert!(matches!(assert_ready!(waiting.poll()), Err(Error::Closed)));
    assert!(b.is_closed());
    assert!(matches!(b.load(2).await, Err(Error::Closed)));
    // Shutdown of a gone worker returns at once.
    b.shutdown().await;
}

#[tokio::test]
async fn shutdown_answers_queued_requests_then_closes() {
    let loader = TestLoader::new();
    let (b, worker) = builder()
        .policy(FlushPolicy::FixedDelay)
        .max_delay(Duration::from_secs(3600))
        .build_pair(loader.clone())
        .unwrap();

    let queued: Vec<_> = (0..5).map(|k| spawn_load(&b, k)).collect();
    settle().await;
    let shutdown = tokio::spawn({
        let b = b.clone();
        async move { b.shutdown().await }
    });
    settle().await;
    let worker = tokio::spawn(worker.run());

    // Shutdown flushes at once instead of waiting an hour for the delay.
    for (k, h) in (0..).zip(queued) {
        assert_eq!(ok(h).await, Some(value_of(k)));
    }
    shutdown.await.unwrap();
    worker.await.unwrap();
    assert!(b.is_closed());
    assert!(matches!(b.load(9).await, Err(Error::Closed)));
}

#[tokio::test]
async fn dropping_the_last_handle_stops_the_worker_after_answering() {
    let loader = TestLoader::gated();
    let (b, worker) = builder()
        .max_concurrent_batches(1)
        .build_pair(loader.clone())
        .unwrap();
    let worker = tokio::spawn(worker.run());

    let handles: Vec<_> = (0..4).map(|k| spawn_load(&b, k)).collect();
    drop(b);
    settle().await;
    assert!(!worker.is_finished(), "requests are still in flight");
    loader.open(10);
    for (k, h) in (0..).zip(handles) {
        assert_eq!(ok(h).await, Some(value_of(k)));
    }
    worker.await.unwrap();
}

#[tokio::test]
async fn aborting_the_worker_task_answers_every_waiter_with_closed() {
    let loader = TestLoader::gated();
    let (b, worker) = builder()
        .max_concurrent_batches(1)
        .no_timeout()
        .build_pair(loader.clone())
        .unwrap();
    let worker = tokio::spawn(worker.run());

    let in_flight = spawn_load(&b, 1);
    settle().await;
    let pending = spawn_load(&b, 2);
    settle().await;
    worker.abort();

    assert!(matches!(in_flight.await.unwrap(), Err(Error::Closed)));
    assert!(matches!(pending.await.unwrap(), Err(Error::Closed)));
    settle().await;
    assert_eq!(
        loader.running(),
        0,
        "the load task was aborted with the worker"
    );
}

#[tokio::test(start_paused = true)]
async fn stats_report_batches_sizes_waits_and_durations() {
    let loader = TestLoader::new();
    let b = builder()
        .policy(FlushPolicy::FixedDelay)
        .max_batch_size(4)
        .max_delay(Duration::from_millis(2))
        .build(loader.clone())
        .unwrap();

    b.load_many([1, 2, 3, 4]).await; // full batch, no wait
    b.load_many([5, MISSING_FROM]).await; // waits 2 ms

    let s = b.stats();
    assert_eq!(s.requests, 6);
    assert_eq!(s.batches, 2);
    assert_eq!((s.found, s.not_found), (5, 1));
    assert_eq!(s.batch_size.count, 2);
    assert_eq!(s.batch_size.sum, 6);
    assert_eq!(s.queue_wait.count, 6);
    assert_eq!(s.queue_wait.sum, 2 * 2_000_000, "two keys waited 2 ms each");
    assert_eq!(s.load_duration.count, 2);
    assert_eq!((s.queued, s.pending_keys, s.in_flight_batches), (0, 0, 0));
}

#[tokio::test]
async fn a_loader_can_be_a_closure() {
    let b: Batcher<u32, u32> = Batcher::new(loader_fn(|keys: Vec<u32>| async move {
        Ok::<_, Infallible>(
            keys.into_iter()
                .map(|k| (k, k + 1))
                .collect::<HashMap<_, _>>(),
        )
    }));
    assert_eq!(b.load(41).await.unwrap(), Some(42));
}

#[tokio::test]
async fn invalid_settings_are_rejected_with_the_setting_named() {
    let err = builder()
        .max_batch_size(0)
        .build(TestLoader::new())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "`max_batch_size` must be at least 1, got 0"
    );
    let err = builder()
        .timeout(Duration::ZERO)
        .build(TestLoader::new())
        .unwrap_err();
    assert_eq!(err, BuildError::ZeroDuration { setting: "timeout" });
}

#[test]
fn build_outside_a_runtime_is_an_error_not_a_panic() {
    let err = builder().build(TestLoader::new()).unwrap_err();
    assert_eq!(err, BuildError::NoRuntime);
    // build_pair needs no runtime.
    let (_b, _worker) = builder().build_pair(TestLoader::new()).unwrap();
}

#[tokio::test(start_paused = true)]
async fn adaptive_dispatches_at_once_when_lightly_loaded_and_fills_batches_when_busy() {
    let loader = TestLoader::gated();
    let b = builder()
        .policy(FlushPolicy::Adaptive)
        .max_concurrent_batches(4)
        .max_delay(Duration::from_millis(10))
        .build(loader.clone())
        .unwrap();

    // Fewer than half the slots busy: each key goes out at once.
    let one = spawn_load(&b, 1);
    settle().await;
    let two = spawn_load(&b, 2);
    settle().await;
    assert_eq!(loader.calls(), vec![vec![1], vec![2]]);
    let first = [one, two];

    // Two of four slots busy: a free slot no longer means "dispatch now".
    let waiting = [spawn_load(&b, 3), spawn_load(&b, 4)];
    settle().await;
    advance(Duration::from_millis(9)).await;
    settle().await;
    assert_eq!(loader.calls().len(), 2, "busy: the batch waits to fill");
    advance(Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(loader.calls()[2], vec![3, 4], "and goes out at max_delay");

    loader.open(3);
    for (k, h) in (1..).zip(first.into_iter().chain(waiting)) {
        assert_eq!(ok(h).await, Some(value_of(k)));
    }
}

#[tokio::test(start_paused = true)]
async fn adaptive_flushes_a_full_batch_without_waiting() {
    let loader = TestLoader::gated();
    let b = builder()
        .policy(FlushPolicy::Adaptive)
        .max_concurrent_batches(2)
        .max_batch_size(3)
        .max_delay(Duration::from_secs(3600))
        .build(loader.clone())
        .unwrap();
    let busy = spawn_load(&b, 0);
    settle().await;
    let full: Vec<_> = (1..=3).map(|k| spawn_load(&b, k)).collect();
    settle().await;
    assert_eq!(loader.calls(), vec![vec![0], vec![1, 2, 3]]);
    loader.open(2);
    ok(busy).await;
    for h in full {
        assert!(ok(h).await.is_some());
    }
}

/// The id of the task that runs each load, and the answer.
fn task_recording_loader(
    ids: std::sync::Arc<std::sync::Mutex<Vec<Option<tokio::task::Id>>>>,
) -> impl pgbatch::Loader<u64, String> {
    loader_fn(move |keys: Vec<u64>| {
        let ids = ids.clone();
        async move {
            ids.lock().unwrap().push(tokio::task::try_id());
            Ok::<_, Infallible>(
                keys.into_iter()
                    .map(|k| (k, value_of(k)))
                    .collect::<HashMap<_, _>>(),
            )
        }
    })
}

/// Builds `builder` over a task-recording loader, makes one lookup from a
/// fresh task, and tells whether the load ran in that caller's task.
async fn loads_in_the_callers_task(builder: BatcherBuilder<u64, String>) -> (bool, B) {
    let ids = std::sync::Arc::default();
    let b = builder
        .build(task_recording_loader(std::sync::Arc::clone(&ids)))
        .unwrap();
    settle().await; // the worker starts
    let caller = tokio::spawn({
        let b = b.clone();
        async move { (tokio::task::id(), b.load(7).await) }
    });
    let (caller_id, reply) = caller.await.unwrap();
    assert_eq!(reply.unwrap(), Some(value_of(7)));
    let loaded_in = ids.lock().unwrap()[0];
    (loaded_in == Some(caller_id), b)
}

#[tokio::test(start_paused = true)]
async fn a_lone_caller_loads_in_its_own_task_unless_told_not_to() {
    for (direct, policy) in [
        (true, FlushPolicy::Eager),
        (true, FlushPolicy::Adaptive),
        (false, FlushPolicy::Eager),
    ] {
        let (in_caller, b) =
            loads_in_the_callers_task(builder().policy(policy).direct_when_idle(direct)).await;
        assert_eq!(in_caller, direct, "direct_when_idle({direct}), {policy:?}");
        // Counted like any batch of one.
        let s = b.stats();
        assert_eq!((s.requests, s.batches, s.found), (1, 1, 1));
        assert_eq!(s.batch_size.mean(), Some(1.0));
    }
}

#[tokio::test(start_paused = true)]
async fn fixed_delay_and_join_in_flight_keep_every_load_in_the_worker() {
    for b in [
        builder().policy(FlushPolicy::FixedDelay),
        builder().join_in_flight(true),
        builder().max_concurrent_batches(1),
    ] {
        assert!(!loads_in_the_callers_task(b).await.0);
    }
}

#[tokio::test(start_paused = true)]
async fn while_a_direct_load_runs_others_batch_and_share_its_slots() {
    let loader = TestLoader::gated();
    let b = builder()
        .max_concurrent_batches(2)
        .build(loader.clone())
        .unwrap();
    settle().await;
    let lone = spawn_load(&b, 1);
    settle().await;
    assert_eq!(loader.calls(), vec![vec![1]]);
    // The batcher is busy now: these go through the worker, which has one
    // slot left, so the second group waits for a slot and forms one batch.
    let first: Vec<_> = (10..13).map(|k| spawn_load(&b, k)).collect();
    settle().await;
    let second: Vec<_> = (20..23).map(|k| spawn_load(&b, k)).collect();
    settle().await;
    assert_eq!(loader.calls(), vec![vec![1], vec![10, 11, 12]]);
    assert_eq!(loader.running(), 2);
    loader.open(1); // the direct load finishes, freeing its slot
    assert_eq!(ok(lone).await, Some(value_of(1)));
    settle().await;
    loader.open(10);
    for (k, h) in (10..13).chain(20..23).zip(first.into_iter().chain(second)) {
        assert_eq!(ok(h).await, Some(value_of(k)));
    }
    assert_eq!(
        loader.calls(),
        vec![vec![1], vec![10, 11, 12], vec![20, 21, 22]]
    );
    assert_eq!(loader.max_running(), 2, "the slots are shared");
}

#[tokio::test(start_paused = true)]
async fn a_caller_does_not_load_directly_past_requests_waiting_for_the_worker() {
    let loader = TestLoader::gated();
    let b = builder()
        .policy(FlushPolicy::Adaptive)
        .max_delay(Duration::from_millis(10))
        .max_concurrent_batches(2)
        .build(loader.clone())
        .unwrap();
    settle().await;
    let lone = spawn_load(&b, 1);
    settle().await;
    // Busy (adaptive, one of two slots taken): these wait for the delay.
    let held: Vec<_> = (2..4).map(|k| spawn_load(&b, k)).collect();
    settle().await;
    loader.open(1);
    assert_eq!(ok(lone).await, Some(value_of(1)));
    assert_eq!(loader.calls(), vec![vec![1]], "2 and 3 still wait");
    // No load runs now, but keys wait at the worker: this caller goes to
    // the worker (which, idle, sends them at once) instead of loading
    // alone ahead of them.
    let late = spawn_load(&b, 4);
    settle().await;
    assert_eq!(loader.calls(), vec![vec![1], vec![2, 3, 4]]);
    loader.open(1);
    for (k, h) in (2..5).zip(held.into_iter().chain([late])) {
        assert_eq!(ok(h).await, Some(value_of(k)));
    }
}

#[tokio::test(start_paused = true)]
async fn a_direct_load_fails_like_a_batch_and_frees_its_slot() {
    let b = builder()
        .max_concurrent_batches(2)
        .build(TestLoader::new())
        .unwrap();
    settle().await;
    assert!(matches!(
        b.load(PANIC_KEY).await,
        Err(Error::LoaderPanicked(_))
    ));
    let err = b.load(FAIL_KEY).await.unwrap_err();
    assert!(err.load_error::<TestError>().is_some(), "{err:?}");
    assert_eq!(b.load(MISSING_FROM).await.unwrap(), None);
    let s = b.stats();
    assert_eq!(
        (s.batches, s.panicked_batches, s.failed_batches, s.not_found),
        (3, 1, 1, 1)
    );

    // A hung load: the caller's deadline, then the load timeout, answer it
    // and give the slot back.
    let gated = TestLoader::gated();
    let b = builder()
        .max_concurrent_batches(2)
        .timeout(Duration::from_millis(50))
        .build(gated.clone())
        .unwrap();
    settle().await;
    let started = Instant::now();
    assert!(matches!(b.load(1).await, Err(Error::Timeout(_))));
    assert_eq!(started.elapsed(), Duration::from_millis(50));
    assert_eq!(gated.running(), 0, "the abandoned direct load is dropped");
    let b = builder()
        .max_concurrent_batches(2)
        .load_timeout(Duration::from_millis(10))
        .build(gated.clone())
        .unwrap();
    settle().await;
    assert!(matches!(b.load(2).await, Err(Error::LoadTimeout(_))));
    assert_eq!(b.stats().timed_out_batches, 1);
    // Both slots are free again: two hung loads run at once.
    let hung = [spawn_load(&b, 3), spawn_load(&b, 4)];
    settle().await;
    assert_eq!(gated.running(), 2);
    gated.open(2);
    for h in hung {
        assert!(h.await.unwrap().is_ok());
    }
}

#[tokio::test(start_paused = true)]
async fn a_lone_caller_waits_when_abandoned_loads_hold_every_slot() {
    let gated = TestLoader::gated();
    let b = builder()
        .max_concurrent_batches(2)
        .timeout(Duration::from_millis(50))
        .build(gated.clone())
        .unwrap();
    settle().await;
    let direct = spawn_load(&b, 1);
    settle().await;
    let second = spawn_load(&b, 2); // busy: through the worker
    settle().await;
    gated.open(1); // key 1's direct load ends (the gate is first come)
    assert_eq!(ok(direct).await, Some(value_of(1)));
    let third = spawn_load(&b, 3); // key 2's load runs: through the worker
    settle().await;
    assert_eq!(gated.running(), 2);
    // Both callers give up; their loads still hold both slots.
    advance(Duration::from_millis(60)).await;
    for h in [second, third] {
        assert!(matches!(h.await.unwrap(), Err(Error::Timeout(_))));
    }
    // Idle again, but no slot is free: the next caller must not load
    // directly on top of them.
    let fourth = spawn_load(&b, 4);
    settle().await;
    assert_eq!(gated.running(), 2, "the concurrency cap holds");
    gated.open(3);
    assert_eq!(ok(fourth).await, Some(value_of(4)));
    assert_eq!(gated.max_running(), 2);
}

/// A batch whose delay ends between the worker's check of it and the
/// arming of its timer is still sent. On real time the worker can be
/// descheduled between the two; with delays about as long as a request's
/// trip to the worker, many of them end in that gap. A lost flush leaves
/// a lone request waiting for its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_that_ends_while_the_worker_looks_still_flushes() {
    for delay_us in [1, 2, 5, 10, 20, 50] {
        let b = builder()
            .policy(FlushPolicy::FixedDelay)
            .max_batch_size(64)
            .max_delay(Duration::from_micros(delay_us))
            .timeout(Duration::from_secs(2))
            .build(TestLoader::new())
            .unwrap();
        for k in 0..300 {
            match b.load(k).await {
                Ok(value) => assert_eq!(value, Some(value_of(k))),
                Err(e) => panic!("delay {delay_us} µs, key {k}: {e}"),
            }
        }
    }
}
