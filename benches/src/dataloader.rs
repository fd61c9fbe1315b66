//! async-graphql's `DataLoader` over the same loader as pgbatch: what the
//! tools comparing the two share.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use async_graphql::dataloader::{DataLoader, Loader as DataLoaderLoader};
use pgbatch::pg::{PgError, PgLoader};
use server::db::queries::kv::KvQuery;

/// The `PgLoader` as a `DataLoader`'s loader: the same statements on the
/// same pool, counting loads and keys. Its error must be `Clone`, so it is
/// shared.
#[derive(Debug)]
pub struct SameLoader {
    loader: PgLoader<KvQuery>,
    loads: Arc<AtomicU64>,
    keys: Arc<AtomicU64>,
}

impl DataLoaderLoader<String> for SameLoader {
    type Value = String;
    type Error = Arc<PgError>;

    async fn load(&self, keys: &[String]) -> Result<HashMap<String, String>, Arc<PgError>> {
        self.loads.fetch_add(1, Relaxed);
        self.keys.fetch_add(keys.len() as u64, Relaxed);
        pgbatch::Loader::load(&self.loader, keys.to_vec())
            .await
            .map(pgbatch::Loaded::into_values)
            .map_err(Arc::new)
    }
}

/// A `DataLoader` setting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DlSetting {
    /// How long it waits for more keys before loading.
    pub delay: Duration,
    /// Keys per load at most.
    pub max_batch: usize,
}

impl DlSetting {
    /// `DataLoader::new`'s own.
    pub const DEFAULT: Self = Self {
        delay: Duration::from_millis(1),
        max_batch: 1000,
    };

    /// The setting, as the tables print it.
    pub fn describe(self) -> String {
        format!(
            "delay {} µs, batches ≤ {}",
            self.delay.as_micros(),
            self.max_batch
        )
    }

    /// A `DataLoader` of this setting over `loader` (no cache, as
    /// `DataLoader::new`), and its counts of loads and keys, for the mean
    /// batch.
    pub fn build(self, loader: &PgLoader<KvQuery>) -> (DataLoader<SameLoader>, LoadCounts) {
        let counts = LoadCounts::default();
        let same = SameLoader {
            loader: loader.clone(),
            loads: Arc::clone(&counts.loads),
            keys: Arc::clone(&counts.keys),
        };
        let dl = DataLoader::new(same, tokio::spawn)
            .delay(self.delay)
            .max_batch_size(self.max_batch);
        (dl, counts)
    }
}

/// Loads and keys a [`SameLoader`] saw.
#[derive(Debug, Clone, Default)]
pub struct LoadCounts {
    loads: Arc<AtomicU64>,
    keys: Arc<AtomicU64>,
}

impl LoadCounts {
    /// Keys per load so far.
    pub fn mean_batch(&self) -> f64 {
        self.keys.load(Relaxed) as f64 / self.loads.load(Relaxed).max(1) as f64
    }
}
