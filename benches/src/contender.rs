//! The read paths the comparison tools run side by side over one
//! `PgLoader`: [`Contender`] names one, [`Reader`] is one started.

use std::fmt;

use async_graphql::dataloader::DataLoader;
use pgbatch::pg::PgLoader;
use pgbatch::{Batcher, Concurrency, FlushPolicy};
use server::db::queries::kv::KvQuery;
use server::db::Database;

use crate::dataloader::{DlSetting, LoadCounts, SameLoader};
use crate::minimal::MinimalBatcher;

/// A read path under test.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Contender {
    /// `Batcher::new`: every default.
    Defaults,
    /// The defaults but a fixed number of loads at once.
    Fixed(usize),
    /// The defaults but the adaptive flush policy (eager while fewer than
    /// half the loads it may run are running, a delay of up to 0.5 ms
    /// above that).
    Adaptive,
    /// The minimal batcher, with batches of up to 64.
    Minimal {
        /// Its connections, each with a worker of its own.
        connections: usize,
    },
    /// async-graphql's `DataLoader` at this setting.
    DataLoader(DlSetting),
    /// The single-key statement on a pooled connection.
    OnePerRead,
    /// No database: every read answered at once, so what it measures is
    /// the load generator's own latency and CPU.
    NoDatabase,
}

impl Contender {
    /// How tables name it.
    pub fn describe(self) -> String {
        match self {
            Self::Defaults => "pgbatch, defaults".to_owned(),
            Self::Fixed(n) => format!("pgbatch, fixed {n} loads"),
            Self::Adaptive => "pgbatch, adaptive flush".to_owned(),
            Self::Minimal { connections } => {
                format!("minimal batcher, {connections} connections, batches ≤ 64")
            }
            Self::DataLoader(s) if s == DlSetting::DEFAULT => "DataLoader, defaults".to_owned(),
            Self::DataLoader(s) => format!("DataLoader, {}", s.describe()),
            Self::OnePerRead => "one statement per read".to_owned(),
            Self::NoDatabase => "no database (the generator alone)".to_owned(),
        }
    }
}

/// A contender, started.
pub struct Reader(Started);

enum Started {
    Pgbatch(Batcher<String, String>),
    Minimal(MinimalBatcher),
    DataLoader(DataLoader<SameLoader>, LoadCounts),
    OnePerRead(PgLoader<KvQuery>),
    NoDatabase,
}

impl fmt::Debug for Reader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Reader")
    }
}

impl Reader {
    /// Starts `who` over `loader` (the minimal batcher over connections of
    /// its own to `db`).
    pub async fn start(
        who: Contender,
        db: &Database,
        loader: &PgLoader<KvQuery>,
    ) -> anyhow::Result<Self> {
        Ok(Self(match who {
            Contender::Defaults => Started::Pgbatch(Batcher::new(loader.clone())),
            Contender::Fixed(n) => Started::Pgbatch(
                Batcher::builder()
                    .concurrency(Concurrency::Fixed(n))
                    .build(loader.clone())?,
            ),
            Contender::Adaptive => Started::Pgbatch(
                Batcher::builder()
                    .policy(FlushPolicy::Adaptive)
                    .build(loader.clone())?,
            ),
            Contender::Minimal { connections } => {
                Started::Minimal(MinimalBatcher::start(&db.config, connections, 64).await?)
            }
            Contender::DataLoader(setting) => {
                let (dl, counts) = setting.build(loader);
                Started::DataLoader(dl, counts)
            }
            Contender::OnePerRead => Started::OnePerRead(loader.clone()),
            Contender::NoDatabase => Started::NoDatabase,
        }))
    }

    /// Reads `key`; why it failed, if it did.
    pub async fn get(&self, key: String) -> Result<(), String> {
        match &self.0 {
            Started::Pgbatch(b) => b.load(key).await.map(drop).map_err(|e| e.to_string()),
            Started::Minimal(m) => m.get(key).await.map(drop).map_err(|e| format!("{e:#}")),
            Started::DataLoader(dl, _) => {
                dl.load_one(key).await.map(drop).map_err(|e| e.to_string())
            }
            Started::OnePerRead(loader) => pgbatch::Loader::load(loader, vec![key])
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            Started::NoDatabase => Ok(()),
        }
    }

    /// Keys per statement so far.
    pub fn mean_batch(&self) -> f64 {
        match &self.0 {
            Started::Pgbatch(b) => b.stats().batch_size.mean().unwrap_or(f64::NAN),
            Started::Minimal(m) => m.mean_batch(),
            Started::DataLoader(_, counts) => counts.mean_batch(),
            Started::OnePerRead(_) => 1.0,
            Started::NoDatabase => f64::NAN,
        }
    }

    /// Stops what runs in the background.
    pub async fn stop(self) {
        match self.0 {
            Started::Pgbatch(b) => b.shutdown().await,
            Started::Minimal(m) => m.shutdown().await,
            Started::DataLoader(..) | Started::OnePerRead(_) | Started::NoDatabase => {}
        }
    }
}
