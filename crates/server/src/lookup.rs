//! The one read abstraction: a [`Lookup`] answers keys of one query kind
//! through the read path chosen at start (naive, batched or cached), so no
//! caller repeats that choice.
//!
//! The service builds one per query kind, in its read registry; the load
//! generators build them too, so they measure the paths the service runs.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use batcher::cache::{Cache, CacheStats};
use batcher::pg::{BatchQuery, PgError, PgLoader, Pool};
use batcher::{Batcher, BuildError, StatsSnapshot};
use futures_util::future::join_all;

use crate::failure::{Failure, Work};
use crate::settings::{ReadPath, ReadSettings};

/// Keys of one [`BatchQuery`], looked up through one read path.
///
/// Cheap to clone: clones share the batcher and the cache.
pub struct Lookup<Q: BatchQuery> {
    name: &'static str,
    timeout: Duration,
    path: Path<Q>,
}

enum Path<Q: BatchQuery> {
    /// One statement per key, on a pooled connection.
    Naive(PgLoader<Q>),
    /// Keys coalesced into batched statements.
    Batched(Batcher<Q::Key, Q::Value>),
    /// A cache whose misses go through the batcher (kept for its stats and
    /// shutdown).
    Cached {
        cache: Cache<Q::Key, Q::Value>,
        batcher: Batcher<Q::Key, Q::Value>,
    },
}

impl<Q: BatchQuery> Clone for Path<Q> {
    fn clone(&self) -> Self {
        match self {
            Self::Naive(loader) => Self::Naive(loader.clone()),
            Self::Batched(batcher) => Self::Batched(batcher.clone()),
            Self::Cached { cache, batcher } => Self::Cached {
                cache: cache.clone(),
                batcher: batcher.clone(),
            },
        }
    }
}

impl<Q: BatchQuery> Clone for Lookup<Q> {
    fn clone(&self) -> Self {
        Self {
            name: self.name,
            timeout: self.timeout,
            path: self.path.clone(),
        }
    }
}

impl<Q: BatchQuery> fmt::Debug for Lookup<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = match self.path {
            Path::Naive(_) => ReadPath::Naive,
            Path::Batched(_) => ReadPath::Batched,
            Path::Cached { .. } => ReadPath::Cached,
        };
        f.debug_struct("Lookup")
            .field("name", &self.name)
            .field("path", &path)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<Q: BatchQuery> Lookup<Q> {
    /// Lookups of `query` on `pool` through the path `settings` choose;
    /// `name` labels the batcher and cache in traces and metrics. The
    /// batched and cached paths start their batcher on the current runtime.
    ///
    /// # Errors
    ///
    /// When a batcher or cache setting is invalid (a batch size of 0, say),
    /// or there is no runtime to start the batcher on.
    pub fn new(
        name: &'static str,
        query: Q,
        pool: Pool,
        settings: &ReadSettings,
    ) -> Result<Self, BuildError> {
        let loader = PgLoader::new(pool, query);
        let batcher = || {
            settings
                .batch
                .builder(name, settings.timeout)
                .build(loader.clone())
        };
        let path = match settings.path {
            ReadPath::Naive => Path::Naive(loader.clone()),
            ReadPath::Batched => Path::Batched(batcher()?),
            ReadPath::Cached => {
                let batcher = batcher()?;
                Path::Cached {
                    cache: settings
                        .cache
                        .builder(name)
                        .build_with_batcher(batcher.clone())?,
                    batcher,
                }
            }
        };
        Ok(Self {
            name,
            timeout: settings.timeout,
            path,
        })
    }

    /// The name given at construction.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The value of `key`, or `None` if the query returns no row for it.
    ///
    /// # Errors
    ///
    /// [`Failure::Overloaded`], [`Failure::Timeout`] past the deadline, or
    /// [`Failure::Unavailable`].
    pub async fn get(&self, key: Q::Key) -> Result<Option<Q::Value>, Failure> {
        match &self.path {
            Path::Naive(loader) => self.within_deadline(loader.load_one(&key)).await,
            Path::Batched(batcher) => Ok(batcher.load(key).await?),
            Path::Cached { cache, .. } => Ok(cache.get(key).await?),
        }
    }

    /// The values of `keys`, in order. The batched and cached paths ask for
    /// all of them at once, so their misses share batches; the naive path
    /// asks one after another under one deadline.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get): the first key's failure fails the call.
    pub async fn get_many(&self, keys: Vec<Q::Key>) -> Result<Vec<Option<Q::Value>>, Failure> {
        match &self.path {
            Path::Naive(loader) => {
                self.within_deadline(async {
                    let mut out = Vec::with_capacity(keys.len());
                    for key in &keys {
                        out.push(loader.load_one(key).await?);
                    }
                    Ok(out)
                })
                .await
            }
            Path::Batched(batcher) => collect(batcher.load_many(keys).await),
            // Polled together in this task: a cache load runs in a task of
            // its own, so nothing is gained by spawning one per key.
            Path::Cached { cache, .. } => {
                collect(join_all(keys.into_iter().map(|key| cache.get(key))).await)
            }
        }
    }

    /// Drops `key` from the cache, if there is one (after a write to it).
    /// Once this returns, no load that started before can put an old value
    /// back.
    pub async fn invalidate(&self, key: &Q::Key) {
        if let Path::Cached { cache, .. } = &self.path {
            cache.invalidate(key).await;
        }
    }

    /// Drops every cached value (after a write whose keys are not tracked).
    pub fn invalidate_all(&self) {
        if let Path::Cached { cache, .. } = &self.path {
            cache.invalidate_all();
        }
    }

    /// The batcher's statistics (batched and cached paths).
    pub fn batcher_stats(&self) -> Option<StatsSnapshot> {
        match &self.path {
            Path::Naive(_) => None,
            Path::Batched(batcher) | Path::Cached { batcher, .. } => Some(batcher.stats()),
        }
    }

    /// The cache's statistics (cached path).
    pub fn cache_stats(&self) -> Option<CacheStats> {
        match &self.path {
            Path::Cached { cache, .. } => Some(cache.stats()),
            _ => None,
        }
    }

    /// Stops the batcher, if any, after answering what it holds.
    pub async fn shutdown(&self) {
        if let Path::Batched(batcher) | Path::Cached { batcher, .. } = &self.path {
            batcher.shutdown().await;
        }
    }

    /// Gives a naive lookup the deadline the batcher gives its requests.
    async fn within_deadline<T>(
        &self,
        lookup: impl Future<Output = Result<T, PgError>>,
    ) -> Result<T, Failure> {
        match tokio::time::timeout(self.timeout, lookup).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(Failure::Timeout(Work::Read)),
        }
    }
}

/// All values, or the first failure.
fn collect<V>(results: Vec<Result<Option<V>, batcher::Error>>) -> Result<Vec<Option<V>>, Failure> {
    results
        .into_iter()
        .map(|r| r.map_err(Failure::from))
        .collect()
}
