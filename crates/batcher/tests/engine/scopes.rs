//! Scoped batching over in-memory loaders: keys of different scopes never
//! share a load, answers reach only their own scope, busy scopes do not
//! starve the others, keys fail alone, and the cache keeps scopes apart.
//! A property test drives many scopes, keys and callers at once with
//! random cancellations and deadlines.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pgbatch::{
    scoped_loader_fn, Batcher, Concurrency, Error, FlushPolicy, Loaded, Loader, ScopedLoader,
    Waited,
};
use proptest::prelude::*;
use tokio::sync::Semaphore;

use crate::support::settle;

/// What a scope sees of a key: its own row, named after both.
fn seen(scope: u32, key: u64) -> String {
    format!("scope {scope} row {key}")
}

/// Keys a scope may not see: the multiples of its number plus one (scope
/// 0 sees all).
fn hidden(scope: u32, key: u64) -> bool {
    scope != 0 && key % (u64::from(scope) + 1) == 0
}

/// Each load's scope and keys, in order.
type Calls = Arc<Mutex<Vec<(u32, Vec<u64>)>>>;

/// A scoped loader that records each call's scope and keys, and can hold
/// calls behind a gate.
#[derive(Clone, Default)]
struct Views {
    calls: Calls,
    gate: Option<Arc<Semaphore>>,
}

impl Views {
    fn gated() -> Self {
        Self {
            gate: Some(Arc::new(Semaphore::new(0))),
            ..Self::default()
        }
    }

    fn open(&self, n: usize) {
        self.gate.as_ref().unwrap().add_permits(n);
    }

    fn calls(&self) -> Vec<(u32, Vec<u64>)> {
        self.calls.lock().unwrap().clone()
    }
}

impl ScopedLoader<u32, u64, String> for Views {
    type Error = Infallible;

    async fn load(
        &self,
        scope: &u32,
        mut keys: Vec<u64>,
    ) -> Result<Loaded<u64, String>, Infallible> {
        keys.sort_unstable();
        self.calls.lock().unwrap().push((*scope, keys.clone()));
        if let Some(gate) = &self.gate {
            gate.acquire().await.unwrap().forget();
        }
        Ok(keys
            .into_iter()
            .filter(|&k| !hidden(*scope, k))
            .map(|k| (k, seen(*scope, k)))
            .collect())
    }

    fn label<'s>(&self, scope: &'s u32) -> Option<std::borrow::Cow<'s, str>> {
        Some(format!("scope {scope}").into())
    }
}

#[tokio::test]
async fn keys_of_different_scopes_never_share_a_load_and_each_gets_its_own_view() {
    let views = Views::gated();
    let b: Batcher<u64, String, u32> = Batcher::builder()
        .concurrency(Concurrency::Fixed(1))
        .build_scoped(views.clone())
        .unwrap();
    // The first load holds the only slot; everything after waits and is
    // batched by scope.
    let first = tokio::spawn({
        let b = b.clone();
        async move { b.load_as(&9, 1).await }
    });
    settle().await;
    let mut calls = Vec::new();
    for scope in 1..=3u32 {
        for key in [2u64, 3, 5, 7] {
            let b = b.clone();
            calls.push(tokio::spawn(async move {
                (scope, key, b.load_as(&scope, key).await)
            }));
        }
    }
    settle().await;
    views.open(100);
    assert_eq!(first.await.unwrap().unwrap(), Some(seen(9, 1)));
    for call in calls {
        let (scope, key, got) = call.await.unwrap();
        let want = (!hidden(scope, key)).then(|| seen(scope, key));
        assert_eq!(got.unwrap(), want, "scope {scope} key {key}");
    }
    let loads = views.calls();
    assert_eq!(
        loads.len(),
        4,
        "one load per scope after the first: {loads:?}"
    );
    for (scope, keys) in &loads[1..] {
        assert_eq!(keys, &[2, 3, 5, 7], "scope {scope}'s keys together, alone");
    }
    let scopes: HashSet<u32> = loads.iter().map(|(s, _)| *s).collect();
    assert_eq!(scopes, HashSet::from([9, 1, 2, 3]));
}

#[tokio::test]
async fn a_busy_scope_does_not_starve_the_others() {
    let views = Views::gated();
    let b: Batcher<u64, String, u32> = Batcher::builder()
        .concurrency(Concurrency::Fixed(1))
        .max_batch_size(8)
        .build_scoped(views.clone())
        .unwrap();
    let hold = tokio::spawn({
        let b = b.clone();
        async move { b.load_as(&1, 999).await }
    });
    settle().await;
    // Scope 1 floods 40 keys (five batches' worth) before scope 2 asks for
    // one.
    let flood: Vec<_> = (0..40u64)
        .map(|k| {
            let b = b.clone();
            tokio::spawn(async move { b.load_as(&1, 1000 + k).await })
        })
        .collect();
    settle().await;
    let lone = tokio::spawn({
        let b = b.clone();
        async move { b.load_as(&2, 7).await }
    });
    settle().await;
    views.open(1000);
    hold.await.unwrap().unwrap();
    assert_eq!(lone.await.unwrap().unwrap(), Some(seen(2, 7)));
    for f in flood {
        f.await.unwrap().unwrap();
    }
    let order: Vec<u32> = views.calls().iter().map(|(s, _)| *s).collect();
    // The held load, then scope 1's first batch (it was waiting first),
    // then scope 2 before scope 1's second batch.
    assert_eq!(&order[..3], &[1, 1, 2], "{order:?}");
    assert_eq!(order.len(), 1 + 5 + 1, "{order:?}");
}

#[tokio::test(start_paused = true)]
async fn a_scopes_keys_wait_no_longer_than_the_deadline() {
    let views = Views::gated();
    let b: Batcher<u64, String, u32> = Batcher::builder()
        .concurrency(Concurrency::Fixed(1))
        .timeout(Duration::from_millis(100))
        .build_scoped(views.clone())
        .unwrap();
    let hold = tokio::spawn({
        let b = b.clone();
        async move { b.load_as(&1, 1).await }
    });
    settle().await;
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.load_as(&2, 2).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    // Each says what it waited for, and may be asked again.
    let waited = waiting.await.unwrap().unwrap_err();
    assert!(
        matches!(&waited, Error::Timeout(t) if t.waited() == Waited::ForALoad),
        "{waited:?}"
    );
    let held = hold.await.unwrap().unwrap_err();
    assert!(
        matches!(&held, Error::Timeout(t) if matches!(t.waited(), Waited::InALoad(d) if d >= Duration::from_millis(100))),
        "{held:?}"
    );
    assert!(held.to_string().contains("waiting for its load"), "{held}");
    assert!(waited.is_retryable() && held.is_retryable());
    views.open(10);
    // The batcher keeps serving, and loaded nothing for the timed-out key.
    assert_eq!(b.load_as(&3, 5).await.unwrap(), Some(seen(3, 5)));
    let scopes: Vec<u32> = views.calls().iter().map(|(s, _)| *s).collect();
    assert!(!scopes.contains(&2), "{scopes:?}");
}

#[tokio::test]
async fn a_cancelled_caller_cancels_no_load_another_caller_waits_for() {
    let views = Views::gated();
    let b: Batcher<u64, String, u32> = Batcher::builder()
        .join_in_flight(true)
        .build_scoped(views.clone())
        .unwrap();
    let quitter = tokio::spawn({
        let b = b.clone();
        async move { b.load_as(&5, 1).await }
    });
    settle().await;
    let stayer = tokio::spawn({
        let b = b.clone();
        async move { b.load_as(&5, 1).await }
    });
    settle().await;
    quitter.abort();
    let _ = quitter.await;
    views.open(10);
    assert_eq!(stayer.await.unwrap().unwrap(), Some(seen(5, 1)));
    assert_eq!(views.calls().len(), 1, "the stayer joined the running load");
}

#[tokio::test]
async fn direct_loads_when_idle_run_as_the_callers_scope() {
    let views = Views::default();
    let b: Batcher<u64, String, u32> = Batcher::builder().build_scoped(views.clone()).unwrap();
    for scope in [3u32, 4] {
        assert_eq!(b.load_as(&scope, 1).await.unwrap(), Some(seen(scope, 1)));
    }
    assert_eq!(b.load_as(&3, 4).await.unwrap(), None, "hidden from scope 3");
    assert_eq!(views.calls(), [(3, vec![1]), (4, vec![1]), (3, vec![4])]);
    assert_eq!(b.stats().scopes, 0, "idle: no scope waits");
}

/// Fails key 13 alone, and every key of a batch holding 66.
#[derive(Clone)]
struct Picky;

#[derive(Debug, thiserror::Error)]
#[error("key {0} is corrupt")]
struct Corrupt(u64);

impl Loader<u64, String> for Picky {
    type Error = Corrupt;

    async fn load(&self, keys: Vec<u64>) -> Result<Loaded<u64, String>, Corrupt> {
        if keys.contains(&66) {
            return Err(Corrupt(66));
        }
        let mut loaded = Loaded::new();
        for k in keys {
            if k == 13 {
                loaded.fail(k, Corrupt(k));
            } else {
                loaded.insert(k, seen(0, k));
            }
        }
        Ok(loaded)
    }
}

#[tokio::test]
async fn a_key_the_loader_fails_fails_alone() {
    let b: Batcher<u64, String> = Batcher::builder()
        .policy(FlushPolicy::FixedDelay)
        .max_batch_size(3)
        .build(Picky)
        .unwrap();
    let got = b.load_many([12, 13, 14]).await;
    assert_eq!(got[0].as_ref().unwrap(), &Some(seen(0, 12)));
    let err = got[1].as_ref().unwrap_err();
    assert_eq!(
        err.load_error::<Corrupt>().map(|c| c.0),
        Some(13),
        "{err:?}"
    );
    assert_eq!(got[2].as_ref().unwrap(), &Some(seen(0, 14)));
    let s = b.stats();
    assert_eq!(
        (s.batches, s.found, s.failed_keys, s.failed_batches),
        (1, 2, 1, 0)
    );
    // A whole-batch error still fails the whole batch.
    let got = b.load_many([66, 1, 2]).await;
    assert!(got.iter().all(|r| matches!(r, Err(Error::Load(_)))));
}

#[tokio::test]
async fn loads_are_counted_per_scope_by_name_up_to_a_cap() {
    let b: Batcher<u64, String, u32> = Batcher::builder()
        .scope_stats(2)
        .build_scoped(Views::default())
        .unwrap();
    for scope in [1, 2, 3, 1] {
        for answer in b.load_many_as(&scope, [4, 5, 6]).await {
            answer.unwrap();
        }
    }
    let by_scope = b.stats().by_scope;
    let names: Vec<&str> = by_scope.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["other", "scope 1", "scope 2"],
        "past the cap: other"
    );
    let keys: Vec<u64> = by_scope.iter().map(|(_, s)| s.keys).collect();
    assert_eq!(keys, [3, 6, 3]);
    assert!(by_scope.iter().all(|(_, s)| s.loads >= 1));
    let off: Batcher<u64, String, u32> = Batcher::builder().build_scoped(Views::default()).unwrap();
    off.load_as(&1, 4).await.unwrap();
    assert!(off.stats().by_scope.is_empty(), "off by default");
}

#[cfg(feature = "cache")]
mod cache {
    use crate::support::storing_every_value;
    use pgbatch::cache::Cache;

    use super::*;

    #[tokio::test]
    async fn a_value_read_as_one_scope_is_never_served_to_another() {
        let views = Views::default();
        let b: Batcher<u64, String, u32> = Batcher::builder().build_scoped(views.clone()).unwrap();
        let cache = storing_every_value().build_with_batcher(b).unwrap();
        assert_eq!(cache.get_as(&1, 7).await.unwrap(), Some(seen(1, 7)));
        assert_eq!(cache.get_as(&2, 7).await.unwrap(), Some(seen(2, 7)));
        assert_eq!(cache.get_as(&6, 7).await.unwrap(), None, "hidden");
        assert_eq!(views.calls().len(), 3, "each scope loaded its own view");
        // Hits, each its own.
        assert_eq!(cache.get_as(&1, 7).await.unwrap(), Some(seen(1, 7)));
        assert_eq!(cache.get_as(&2, 7).await.unwrap(), Some(seen(2, 7)));
        assert_eq!(cache.get_if_present_as(&3, &7).await, None);
        assert_eq!(views.calls().len(), 3);
        assert_eq!(cache.stats().hits, 2);
    }

    #[tokio::test]
    async fn invalidating_a_key_drops_every_scopes_copy() {
        let views = Views::default();
        let b: Batcher<u64, String, u32> = Batcher::builder().build_scoped(views.clone()).unwrap();
        let cache = storing_every_value().build_with_batcher(b).unwrap();
        for scope in 1..=4 {
            cache.get_as(&scope, 11).await.unwrap();
        }
        cache.get_as(&1, 13).await.unwrap();
        for scope in 1..=4 {
            assert!(cache.get_if_present_as(&scope, &11).await.is_some());
        }
        cache.invalidate(&11).await;
        for scope in 1..=4 {
            assert_eq!(
                cache.get_if_present_as(&scope, &11).await,
                None,
                "scope {scope}"
            );
        }
        assert!(
            cache.get_if_present_as(&1, &13).await.is_some(),
            "another key stays"
        );
        // A write through one scope drops the others' copies too.
        cache.get_as(&2, 13).await.unwrap();
        cache.insert_as(&1, 13, "written".to_owned()).await;
        assert_eq!(
            cache.get_if_present_as(&1, &13).await,
            Some(Some("written".to_owned()))
        );
        assert_eq!(cache.get_if_present_as(&2, &13).await, None);
    }

    #[tokio::test]
    async fn values_marked_shared_are_served_to_every_scope_but_not_found_never_is() {
        let views = Views::default();
        let b: Batcher<u64, String, u32> = Batcher::builder().build_scoped(views.clone()).unwrap();
        let cache = storing_every_value()
            .negative_ttl(Duration::from_secs(60))
            .shared_when(|v: &String| v.ends_with("row 1"))
            .build_with_batcher(b)
            .unwrap();
        assert_eq!(cache.get_as(&5, 1).await.unwrap(), Some(seen(5, 1)));
        // Shared: another scope is served scope 5's read of key 1, once
        // one of its own loads succeeded (key 3 here).
        assert_eq!(cache.get_as(&6, 3).await.unwrap(), Some(seen(6, 3)));
        assert_eq!(cache.get_as(&6, 1).await.unwrap(), Some(seen(5, 1)));
        assert_eq!(views.calls().len(), 2);
        // "Not found" as scope 5 (12 is hidden from it) is scope 5's alone.
        assert_eq!(cache.get_as(&5, 12).await.unwrap(), None);
        assert_eq!(cache.get_if_present_as(&5, &12).await, Some(None));
        assert_eq!(cache.get_as(&4, 12).await.unwrap(), Some(seen(4, 12)));
        cache.insert_shared(2, "public".to_owned()).await;
        assert_eq!(
            cache.get_as(&6, 2).await.unwrap().as_deref(),
            Some("public")
        );
    }

    /// A loader that refuses scope 13, as the database refuses a role.
    #[derive(Clone, Default)]
    struct Refusing(Views);

    #[derive(Debug, thiserror::Error)]
    #[error("permission denied to set role")]
    struct Refused;

    impl ScopedLoader<u32, u64, String> for Refusing {
        type Error = Refused;

        async fn load(&self, scope: &u32, keys: Vec<u64>) -> Result<Loaded<u64, String>, Refused> {
            if *scope == 13 {
                return Err(Refused);
            }
            Ok(self
                .0
                .load(scope, keys)
                .await
                .unwrap_or_else(|e| match e {}))
        }
    }

    #[tokio::test]
    async fn a_shared_value_is_served_only_to_scopes_whose_own_loads_succeeded() {
        let b: Batcher<u64, String, u32> = Batcher::builder()
            .build_scoped(Refusing::default())
            .unwrap();
        let cache = storing_every_value()
            .shared_when(|_: &String| true)
            .build_with_batcher(b)
            .unwrap();
        assert_eq!(cache.get_as(&5, 1).await.unwrap(), Some(seen(5, 1)));
        assert_eq!(cache.get_if_present_as(&13, &1).await, None);
        assert!(cache.get_as(&13, 1).await.is_err(), "refused, not served");
        assert_eq!(cache.get_if_present_as(&13, &1).await, None);
        cache.insert_shared(2, "public".to_owned()).await;
        assert_eq!(cache.get_if_present_as(&13, &2).await, None);
        assert_eq!(cache.get_as(&7, 4).await.unwrap(), Some(seen(7, 4)));
        assert_eq!(
            cache.get_if_present_as(&7, &2).await,
            Some(Some("public".to_owned()))
        );
    }

    #[tokio::test]
    async fn each_scopes_value_of_a_key_counts_against_the_capacity() {
        let b: Batcher<u64, String, u32> =
            Batcher::builder().build_scoped(Views::default()).unwrap();
        let cache = storing_every_value()
            .max_capacity(8)
            .build_with_batcher(b)
            .unwrap();
        for key in 1..=4 {
            for scope in 1..=4 {
                cache.get_as(&(scope * 10), key).await.unwrap();
            }
        }
        cache.run_pending_tasks().await;
        let mut held = 0;
        for key in 1..=4 {
            for scope in 1..=4 {
                held += usize::from(cache.get_if_present_as(&(scope * 10), &key).await.is_some());
            }
        }
        // Four entries of four values each: counted by entries they would
        // all fit in 8; counted by values, half of them must go.
        assert!(held <= 8, "{held} values held in a cache of 8");
    }

    #[tokio::test]
    async fn a_key_failed_alone_is_not_cached() {
        let b: Batcher<u64, String> = Batcher::builder()
            .policy(FlushPolicy::FixedDelay)
            .max_batch_size(2)
            .build(Picky)
            .unwrap();
        let cache = storing_every_value()
            .negative_ttl(Duration::from_secs(60))
            .build_with_batcher(b)
            .unwrap();
        let got = cache.get_many([13, 14]).await;
        assert!(got[0].is_err());
        assert_eq!(got[1].as_ref().unwrap(), &Some(seen(0, 14)));
        assert_eq!(
            cache.get_if_present(&13).await,
            None,
            "an error is not stored"
        );
        assert!(cache.get_if_present(&14).await.is_some());
    }

    #[tokio::test]
    async fn a_scoped_cache_over_any_loader_keeps_scopes_apart() {
        let loads = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&loads);
        let cache: Cache<u64, String, u32> = storing_every_value()
            .build_scoped(move |scope: u32, key: u64| {
                counted.fetch_add(1, SeqCst);
                async move { Ok((!hidden(scope, key)).then(|| seen(scope, key))) }
            })
            .unwrap();
        assert_eq!(cache.get_as(&1, 5).await.unwrap(), Some(seen(1, 5)));
        assert_eq!(cache.get_as(&2, 5).await.unwrap(), Some(seen(2, 5)));
        assert_eq!(cache.get_as(&1, 5).await.unwrap(), Some(seen(1, 5)));
        assert_eq!(loads.load(SeqCst), 2);
        cache.invalidate(&5).await;
        assert_eq!(cache.get_if_present_as(&2, &5).await, None);
    }
}

/// One caller's request in the property test.
#[derive(Debug, Clone)]
struct Request {
    scope: u32,
    keys: Vec<u64>,
    /// Cancel after this many microseconds, if set.
    cancel_after: Option<u64>,
}

fn request(scopes: u32) -> impl Strategy<Value = Request> {
    (
        0..scopes,
        prop::collection::vec(0u64..30, 1..=3),
        prop::option::weighted(0.3, 0u64..400),
    )
        .prop_map(|(scope, keys, cancel_after)| Request {
            scope,
            keys,
            cancel_after,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Whatever the settings, the cancellations and the deadlines, every
    /// answer is the caller's own scope's view of its own key.
    #[test]
    fn no_answer_ever_comes_from_another_scopes_view(
        scopes in 1u32..40,
        requests in prop::collection::vec(request(40), 1..300),
        batch in 1usize..16,
        loads in 1usize..4,
        cached in any::<bool>(),
        timeout_us in 200u64..5_000,
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let wrong = rt.block_on(async {
            let b: Batcher<u64, String, u32> = Batcher::builder()
                .max_batch_size(batch)
                .concurrency(Concurrency::Fixed(loads))
                .timeout(Duration::from_micros(timeout_us))
                .build_scoped(scoped_loader_fn(|scope: u32, keys: Vec<u64>| async move {
                    // Slow enough that loads overlap and deadlines pass.
                    tokio::time::sleep(Duration::from_micros(50 * keys.len() as u64)).await;
                    Ok::<_, Infallible>(
                        keys.into_iter()
                            .filter(|&k| !hidden(scope, k))
                            .map(|k| (k, seen(scope, k)))
                            .collect::<HashMap<_, _>>(),
                    )
                }))
                .unwrap();
            #[cfg(feature = "cache")]
            let cache = cached.then(|| pgbatch::cache::Cache::builder().build_with_batcher(b.clone()).unwrap());
            #[cfg(not(feature = "cache"))]
            let _ = cached;
            let tasks: Vec<_> = requests
                .iter()
                .cloned()
                .map(|req| {
                    let b = b.clone();
                    #[cfg(feature = "cache")]
                    let cache = cache.clone();
                    let scope = req.scope % scopes;
                    tokio::spawn(async move {
                        let ask = async {
                            #[cfg(feature = "cache")]
                            if let Some(cache) = &cache {
                                return cache.get_many_as(&scope, req.keys.clone()).await;
                            }
                            b.load_many_as(&scope, req.keys.clone()).await
                        };
                        let got = match req.cancel_after {
                            Some(us) => tokio::time::timeout(Duration::from_micros(us), ask).await.ok(),
                            None => Some(ask.await),
                        };
                        (scope, req.keys, got)
                    })
                })
                .collect();
            let mut wrong = Vec::new();
            for t in tasks {
                let (scope, keys, got) = t.await.unwrap();
                let Some(got) = got else { continue };
                for (key, answer) in keys.into_iter().zip(got) {
                    match answer {
                        Ok(value) => {
                            let want = (!hidden(scope, key)).then(|| seen(scope, key));
                            if value != want {
                                wrong.push((scope, key, value));
                            }
                        }
                        Err(Error::Timeout(_) | Error::Overloaded) => {}
                        Err(e) => wrong.push((scope, key, Some(format!("error {e}")))),
                    }
                }
            }
            wrong
        });
        prop_assert!(wrong.is_empty(), "answers from another view: {:?}", wrong);
    }
}
