//! Property: under random concurrency, cancellation and loader failures,
//! every caller that did not cancel gets exactly the value of its own key,
//! "not found", or the error of a batch that contained its key.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pgbatch::{Batcher, Error, FlushPolicy, Loaded, Loader};
use proptest::prelude::*;

/// A value names the key it is for and the batch that loaded it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Value {
    key: u64,
    batch: usize,
}

#[derive(Debug)]
struct BatchFailed(usize);

impl fmt::Display for BatchFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "batch {} failed", self.0)
    }
}

impl std::error::Error for BatchFailed {}

#[derive(Debug, Clone)]
enum Outcome {
    Failed,
    Returned(HashSet<u64>),
}

#[derive(Debug, Clone)]
struct Record {
    keys: Vec<u64>,
    outcome: Outcome,
}

/// splitmix64: a deterministic coin for "does this batch fail / is this key
/// left out", so a failing case can be replayed from its seed.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[derive(Debug, Default)]
struct ChaosLoader {
    seed: u64,
    records: Mutex<Vec<Record>>,
    running: AtomicUsize,
    max_running: AtomicUsize,
}

impl Loader<u64, Value> for Arc<ChaosLoader> {
    type Error = BatchFailed;

    async fn load(&self, keys: Vec<u64>) -> Result<Loaded<u64, Value>, BatchFailed> {
        let now = self.running.fetch_add(1, SeqCst) + 1;
        self.max_running.fetch_max(now, SeqCst);
        let batch = {
            let mut records = self.records.lock().unwrap();
            records.push(Record {
                keys: keys.clone(),
                outcome: Outcome::Failed,
            });
            records.len() - 1
        };
        let coin = mix(self.seed ^ (batch as u64));
        // Let other tasks run in between, for interleavings.
        for _ in 0..coin % 4 {
            tokio::task::yield_now().await;
        }
        if coin % 7 == 0 {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        self.running.fetch_sub(1, SeqCst);
        if coin % 5 == 0 {
            return Err(BatchFailed(batch));
        }
        let returned: HashMap<u64, Value> = keys
            .iter()
            .filter(|&&k| mix(coin ^ k) % 4 != 0)
            .map(|&key| (key, Value { key, batch }))
            .collect();
        self.records.lock().unwrap()[batch].outcome =
            Outcome::Returned(returned.keys().copied().collect());
        Ok(returned.into())
    }
}

#[derive(Debug, Clone)]
struct Request {
    keys: Vec<u64>,
    /// Cancel after this many microseconds, if set.
    cancel_after: Option<u64>,
}

fn request() -> impl Strategy<Value = Request> {
    (
        prop::collection::vec(0u64..40, 1..=3),
        prop::option::weighted(0.3, 0u64..300),
    )
        .prop_map(|(keys, cancel_after)| Request { keys, cancel_after })
}

#[derive(Debug, Clone)]
struct Setup {
    max_batch_size: usize,
    max_concurrent_batches: usize,
    policy: FlushPolicy,
    join_in_flight: bool,
}

fn setup() -> impl Strategy<Value = Setup> {
    (1usize..24, 1usize..5, 0u8..3, any::<bool>()).prop_map(|(b, c, policy, join)| Setup {
        max_batch_size: b,
        max_concurrent_batches: c,
        policy: [
            FlushPolicy::Eager,
            FlushPolicy::FixedDelay,
            FlushPolicy::Adaptive,
        ][policy as usize],
        join_in_flight: join,
    })
}

fn check(
    key: u64,
    result: &Result<Option<Value>, Error>,
    records: &[Record],
) -> Result<(), TestCaseError> {
    match result {
        Ok(Some(v)) => {
            prop_assert_eq!(v.key, key, "got another key's value");
            let rec = &records[v.batch];
            prop_assert!(rec.keys.contains(&key));
            prop_assert!(matches!(&rec.outcome, Outcome::Returned(r) if r.contains(&key)));
        }
        Ok(None) => {
            let omitted_somewhere = records.iter().any(|r| {
                r.keys.contains(&key)
                    && matches!(&r.outcome, Outcome::Returned(s) if !s.contains(&key))
            });
            prop_assert!(
                omitted_somewhere,
                "not found, but no batch left {} out",
                key
            );
        }
        Err(e @ Error::Load(_)) => {
            let failed = e.load_error::<BatchFailed>().expect("loader error type");
            let rec = &records[failed.0];
            prop_assert!(
                rec.keys.contains(&key),
                "error of a batch without key {}",
                key
            );
            prop_assert!(matches!(rec.outcome, Outcome::Failed));
        }
        Err(other) => prop_assert!(false, "unexpected error for key {}: {:?}", key, other),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn every_surviving_caller_gets_its_own_answer(
        seed in any::<u64>(),
        setup in setup(),
        requests in prop::collection::vec(request(), 1..250),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let loader = Arc::new(ChaosLoader { seed, ..ChaosLoader::default() });
        let outcomes = rt.block_on(async {
            let b: Batcher<u64, Value> = Batcher::builder()
                .max_batch_size(setup.max_batch_size)
                .max_concurrent_batches(setup.max_concurrent_batches)
                .policy(setup.policy)
                .max_delay(Duration::from_micros(100))
                .join_in_flight(setup.join_in_flight)
                .build(Arc::clone(&loader))
                .unwrap();
            let tasks: Vec<_> = requests
                .iter()
                .cloned()
                .map(|req| {
                    let b = b.clone();
                    tokio::spawn(async move {
                        let work = b.load_many(req.keys.clone());
                        let results = match req.cancel_after {
                            Some(us) => tokio::time::timeout(Duration::from_micros(us), work).await.ok(),
                            None => Some(work.await),
                        };
                        (req.keys, results)
                    })
                })
                .collect();
            let mut outcomes = Vec::new();
            for t in tasks {
                outcomes.push(t.await.unwrap());
            }
            b.shutdown().await;
            outcomes
        });

        let records = loader.records.lock().unwrap().clone();
        for rec in &records {
            let distinct: HashSet<_> = rec.keys.iter().collect();
            prop_assert_eq!(distinct.len(), rec.keys.len(), "duplicate keys in a batch");
            prop_assert!(rec.keys.len() <= setup.max_batch_size);
        }
        prop_assert!(loader.max_running.load(SeqCst) <= setup.max_concurrent_batches);
        for (keys, results) in outcomes {
            let Some(results) = results else { continue }; // cancelled
            prop_assert_eq!(results.len(), keys.len());
            for (key, result) in keys.iter().zip(&results) {
                check(*key, result, &records)?;
            }
        }
    }
}
