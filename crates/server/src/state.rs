//! What every handler shares: the reads, the writes, token resolution,
//! metrics, the pool and the limits, built once from [`Settings`].

use std::sync::Arc;

use batcher::pg::Pool;
use batcher::BuildError;

use crate::auth::Authenticator;
use crate::db;
use crate::metrics::Metrics;
use crate::reads::Reads;
use crate::settings::Settings;
use crate::writes::Writes;

/// The application state. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Inner>);

/// The contents of [`AppState`].
#[derive(Debug)]
pub struct Inner {
    /// Every read, through the configured read path.
    pub reads: Reads,
    /// Every write.
    pub writes: Writes,
    /// Resolves bearer tokens.
    pub auth: Authenticator,
    /// The connection pool (readiness checks).
    pub pool: Pool,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
    /// What the service was configured with: request limits and
    /// deadlines.
    pub settings: Settings,
}

impl std::ops::Deref for AppState {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    /// State for serving from `pool`, with imports on `import_pool`, with
    /// `settings`; starts the batchers on the current runtime.
    ///
    /// # Errors
    ///
    /// When a batcher or cache setting is invalid.
    pub fn new(pool: Pool, import_pool: Pool, settings: &Settings) -> Result<Self, BuildError> {
        let reads = Reads::new(pool.clone(), &settings.read)?;
        let auth = Authenticator::new(pool.clone(), &settings.auth)?;
        let writes = Writes::new(
            pool.clone(),
            import_pool,
            reads.clone(),
            &settings.write,
            &settings.import,
        )?;
        let metrics = Metrics::new(reads.clone(), writes.clone(), auth.clone(), pool.clone());
        Ok(Self(Arc::new(Inner {
            reads,
            writes,
            auth,
            pool,
            metrics: Arc::new(metrics),
            settings: settings.clone(),
        })))
    }

    /// State over a new pool of `pool_size` connections to `config`, whose
    /// statements time out with the lookups, and a pool of
    /// `settings.import.concurrency` connections for imports, whose
    /// statements time out with the import (see [`db::pool`]).
    ///
    /// # Errors
    ///
    /// When a pool, batcher or cache setting is invalid.
    pub fn connect(
        config: &tokio_postgres::Config,
        pool_size: usize,
        settings: &Settings,
    ) -> anyhow::Result<Self> {
        let pool = db::pool(config, pool_size, settings.read.timeout)?;
        let import_pool = db::pool(config, settings.import.concurrency, settings.import.timeout)?;
        Ok(Self::new(pool, import_pool, settings)?)
    }

    /// Commits and acknowledges queued writes, answers queued reads, then
    /// closes the pool.
    pub async fn shutdown(&self) {
        tokio::join!(self.writes.shutdown(), self.reads.shutdown());
        self.pool.close();
    }
}
