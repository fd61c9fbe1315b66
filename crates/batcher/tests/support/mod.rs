//! An in-memory loader for black-box tests of the batcher: records every
//! call, can hold loads behind a gate, and fails or panics on chosen keys.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use pgbatch::{Loaded, Loader};
use tokio::sync::Semaphore;

/// Keys at or above this are "not found".
pub const MISSING_FROM: u64 = 1_000;
/// A batch containing this key fails.
pub const FAIL_KEY: u64 = 666;
/// A batch containing this key panics.
pub const PANIC_KEY: u64 = 999;

pub fn value_of(key: u64) -> String {
    format!("v{key}")
}

#[derive(Debug, PartialEq, Eq)]
pub struct TestError(pub String);

impl fmt::Display for TestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "test loader failed: {}", self.0)
    }
}

impl std::error::Error for TestError {}

#[derive(Debug, Default)]
struct Inner {
    calls: Mutex<Vec<Vec<u64>>>,
    running: AtomicUsize,
    max_running: AtomicUsize,
    /// `None`: loads pass at once. `Some`: each load takes one permit.
    gate: Option<Semaphore>,
}

/// Cheap to clone; clones share their records.
#[derive(Debug, Clone, Default)]
pub struct TestLoader {
    inner: Arc<Inner>,
}

impl TestLoader {
    pub fn new() -> Self {
        Self::default()
    }

    /// Loads block until [`open`](Self::open) lets them through.
    pub fn gated() -> Self {
        Self {
            inner: Arc::new(Inner {
                gate: Some(Semaphore::new(0)),
                ..Inner::default()
            }),
        }
    }

    /// Lets `n` more loads through the gate.
    pub fn open(&self, n: usize) {
        self.inner.gate.as_ref().expect("not gated").add_permits(n);
    }

    /// Every call so far, each with its keys sorted.
    pub fn calls(&self) -> Vec<Vec<u64>> {
        self.inner.calls.lock().unwrap().clone()
    }

    pub fn running(&self) -> usize {
        self.inner.running.load(SeqCst)
    }

    pub fn max_running(&self) -> usize {
        self.inner.max_running.load(SeqCst)
    }
}

/// Decrements the running count even when the load is dropped mid-way.
struct RunningGuard<'a>(&'a AtomicUsize);

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

impl Loader<u64, String> for TestLoader {
    type Error = TestError;

    async fn load(&self, mut keys: Vec<u64>) -> Result<Loaded<u64, String>, TestError> {
        keys.sort_unstable();
        self.inner.calls.lock().unwrap().push(keys.clone());
        let now = self.inner.running.fetch_add(1, SeqCst) + 1;
        self.inner.max_running.fetch_max(now, SeqCst);
        let _running = RunningGuard(&self.inner.running);
        if let Some(gate) = &self.inner.gate {
            gate.acquire().await.expect("gate closed").forget();
        }
        if keys.contains(&PANIC_KEY) {
            panic!("loader panicked on purpose");
        }
        if keys.contains(&FAIL_KEY) {
            return Err(TestError(format!("{keys:?}")));
        }
        Ok(keys
            .into_iter()
            .filter(|&k| k < MISSING_FROM)
            .map(|k| (k, value_of(k)))
            .collect())
    }
}

/// Lets spawned tasks (the worker, loads, callers) run until they block,
/// without letting paused time auto-advance.
pub async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// A cache builder that stores every loaded value (`Admission::Always`),
/// so a key's first repeat is a hit: for tests of what a stored value
/// does. The default, second-miss admission, has tests of its own.
#[cfg(feature = "cache")]
pub fn storing_every_value<K, V>() -> pgbatch::cache::CacheBuilder<K, V>
where
    K: Clone + Eq + std::hash::Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    pgbatch::cache::Cache::builder().admission(pgbatch::cache::Admission::Always)
}
