//! How lookups reach Postgres: one statement each (naive), or coalesced by
//! a [`Batcher`] (batched). Chosen at start so both can be load-tested
//! against the same data.

use std::time::Duration;

use batcher::cache::Cache;
use batcher::pg::{PgError, PgLoader, Pool};
use batcher::Batcher;

use crate::config::{ReadPathKind, ServeArgs};
use crate::queries::{KvQuery, ObjectKey, ObjectStatQuery, Stat};

/// Why a lookup produced no answer.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Too much work queued already: shed load.
    #[error("server overloaded")]
    Overloaded,
    /// The lookup's deadline passed.
    #[error("lookup timed out")]
    Timeout,
    /// The database failed or is unreachable.
    #[error("database unavailable")]
    Database(#[source] anyhow::Error),
}

impl From<batcher::Error> for ReadError {
    fn from(e: batcher::Error) -> Self {
        match e {
            batcher::Error::Overloaded => ReadError::Overloaded,
            batcher::Error::Timeout(_) | batcher::Error::LoadTimeout(_) => ReadError::Timeout,
            batcher::Error::Load(ref cause) => match cause.downcast_ref::<PgError>() {
                Some(pg) if pg.is_pool_timeout() => ReadError::Overloaded,
                Some(pg) if pg.is_statement_timeout() => ReadError::Timeout,
                _ => ReadError::Database(e.into()),
            },
            other => ReadError::Database(other.into()),
        }
    }
}

impl From<PgError> for ReadError {
    fn from(e: PgError) -> Self {
        if e.is_pool_timeout() {
            ReadError::Overloaded
        } else if e.is_statement_timeout() {
            // The server's statement_timeout fired before our own deadline.
            ReadError::Timeout
        } else {
            ReadError::Database(e.into())
        }
    }
}

/// The batchers of the batched and cached read paths.
#[derive(Debug, Clone)]
struct Batchers {
    kv: Batcher<String, String>,
    stat: Batcher<ObjectKey, Stat>,
}

/// The caches of the cached read path, in front of the batchers.
#[derive(Debug, Clone)]
struct Caches {
    kv: Cache<String, String>,
    stat: Cache<ObjectKey, Stat>,
}

/// Reads objects and key-value rows through the configured path.
#[derive(Debug, Clone)]
pub struct Reader {
    kv: PgLoader<KvQuery>,
    stat: PgLoader<ObjectStatQuery>,
    batchers: Option<Batchers>,
    caches: Option<Caches>,
    timeout: Duration,
}

impl Reader {
    /// A reader over `pool`; with the batched path, starts one batcher per
    /// lookup kind on the current runtime.
    ///
    /// # Errors
    ///
    /// When the batcher settings are invalid (for example a batch size of 0).
    pub fn new(pool: Pool, args: &ServeArgs) -> anyhow::Result<Self> {
        let kv = PgLoader::new(pool.clone(), KvQuery);
        let stat = PgLoader::new(pool, ObjectStatQuery);
        let batchers = match args.read_path {
            ReadPathKind::Naive => None,
            ReadPathKind::Batched | ReadPathKind::Cached => Some(Batchers {
                kv: batcher_builder(args, "kv").build(kv.clone())?,
                stat: batcher_builder(args, "object_stat").build(stat.clone())?,
            }),
        };
        let caches = match (args.read_cache(), &batchers) {
            (Some(settings), Some(b)) => Some(Caches {
                kv: settings.builder("kv").build_with_batcher(b.kv.clone())?,
                stat: settings
                    .builder("object_stat")
                    .build_with_batcher(b.stat.clone())?,
            }),
            _ => None,
        };
        Ok(Self {
            kv,
            stat,
            batchers,
            caches,
            timeout: args.request_timeout(),
        })
    }

    /// The `random_read_test` payload of `pk`, if the row exists.
    pub async fn kv(&self, pk: String) -> Result<Option<String>, ReadError> {
        if let Some(c) = &self.caches {
            return Ok(c.kv.get(pk).await?);
        }
        match &self.batchers {
            Some(b) => Ok(b.kv.load(pk).await?),
            None => self.naive(self.kv.load_one(&pk)).await,
        }
    }

    /// The stat of one object; `None` when the repository does not exist.
    pub async fn stat(&self, key: ObjectKey) -> Result<Option<Stat>, ReadError> {
        if let Some(c) = &self.caches {
            return Ok(c.stat.get(key).await?);
        }
        match &self.batchers {
            Some(b) => Ok(b.stat.load(key).await?),
            None => self.naive(self.stat.load_one(&key)).await,
        }
    }

    /// The stats of several objects, in order; the batched path loads them
    /// together. The first failure fails the whole call.
    pub async fn stat_many(&self, keys: Vec<ObjectKey>) -> Result<Vec<Option<Stat>>, ReadError> {
        if let Some(c) = &self.caches {
            // Concurrent gets: the misses among them share batches.
            let gets: Vec<_> = keys
                .into_iter()
                .map(|k| {
                    let cache = c.stat.clone();
                    tokio::spawn(async move { cache.get(k).await })
                })
                .collect();
            let mut out = Vec::with_capacity(gets.len());
            for g in gets {
                let got = g.await.map_err(|e| ReadError::Database(e.into()))?;
                out.push(got?);
            }
            return Ok(out);
        }
        match &self.batchers {
            Some(b) => b
                .stat
                .load_many(keys)
                .await
                .into_iter()
                .map(|r| r.map_err(ReadError::from))
                .collect(),
            None => {
                let mut out = Vec::with_capacity(keys.len());
                let all = async {
                    for key in &keys {
                        out.push(self.stat.load_one(key).await?);
                    }
                    Ok::<_, PgError>(())
                };
                tokio::time::timeout(self.timeout, all)
                    .await
                    .map_err(|_| ReadError::Timeout)??;
                Ok(out)
            }
        }
    }

    /// Statistics of the batchers, by name, for `/metrics`.
    pub fn batcher_stats(&self) -> Vec<(&'static str, batcher::StatsSnapshot)> {
        match &self.batchers {
            Some(b) => vec![("kv", b.kv.stats()), ("object_stat", b.stat.stats())],
            None => Vec::new(),
        }
    }

    /// Statistics of the read caches, by name, for `/metrics`.
    pub fn cache_stats(&self) -> Vec<(&'static str, batcher::cache::CacheStats)> {
        match &self.caches {
            Some(c) => vec![("kv", c.kv.stats()), ("object_stat", c.stat.stats())],
            None => Vec::new(),
        }
    }

    /// Drops `key` from the object cache (after a write to it).
    pub async fn invalidate(&self, key: &ObjectKey) {
        if let Some(c) = &self.caches {
            c.stat.invalidate(key).await;
        }
    }

    /// Drops every cached object (after a write whose keys are not
    /// tracked, such as an import or a repository change).
    pub fn invalidate_all(&self) {
        if let Some(c) = &self.caches {
            c.stat.invalidate_all();
        }
    }

    /// Stops the batchers after answering what they hold.
    pub async fn shutdown(&self) {
        if let Some(b) = &self.batchers {
            tokio::join!(b.kv.shutdown(), b.stat.shutdown());
        }
    }

    /// Applies the same deadline the batcher gives its requests.
    async fn naive<T>(
        &self,
        lookup: impl std::future::Future<Output = Result<T, PgError>>,
    ) -> Result<T, ReadError> {
        match tokio::time::timeout(self.timeout, lookup).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(ReadError::Timeout),
        }
    }
}

fn batcher_builder<K, V>(args: &ServeArgs, name: &'static str) -> batcher::BatcherBuilder<K, V>
where
    K: Clone + Eq + std::hash::Hash + Send + 'static,
    V: Clone + Send + 'static,
{
    Batcher::builder()
        .name(name)
        .max_batch_size(args.batch_size)
        .max_concurrent_batches(args.batch_concurrency)
        .channel_capacity(args.queue_capacity)
        .policy(args.batch_policy.into())
        .max_delay(Duration::from_micros(args.batch_delay_us))
        .timeout(args.request_timeout())
}
