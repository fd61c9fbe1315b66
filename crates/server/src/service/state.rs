//! What every handler shares: the reads, the writes, token resolution,
//! metrics, the pool and the limits, built once from [`Settings`].

use std::sync::Arc;

use pgbatch::pg::Pool;
use pgbatch::BuildError;
use tokio_util::sync::CancellationToken;

use crate::cluster::coherence::Coherence;
use crate::cluster::replicas::ReadRouter;
use crate::db::{self, Postgres};
use crate::domain::auth::Authenticator;
use crate::domain::reads::Reads;
use crate::domain::writes::Writes;
use crate::metrics::Metrics;
use crate::service::invalidation::{self, Caches};
use crate::settings::{Pooler, Settings};

/// The service's connection pools, one per kind of work, so that each
/// kind's connections carry the `statement_timeout` of its own deadline
/// (see [`db::pool`]) and no kind can take the connections of another.
#[derive(Debug, Clone)]
pub struct Pools {
    /// Lookups and token resolution; statements time out with the read
    /// deadline.
    pub read: Pool,
    /// Upserts, deletes, repository changes; statements time out with the
    /// write deadline.
    pub write: Pool,
    /// Imports, one connection each for its whole upload; statements time
    /// out with the import deadline.
    pub import: Pool,
    /// Where the invalidation listener's pings are sent from: on a direct
    /// connection, a pool of one of their own, so that a ping never waits
    /// behind reads (the caches are bypassed whenever no ping has come
    /// through for 2 s); behind a pooler, whose server connections are
    /// few, the read pool.
    pub notify: Pool,
    /// Each read replica and its pool (the read pool's size and
    /// deadline).
    pub replicas: Vec<(Postgres, Pool)>,
    /// The pooler in front of the database: how statements must be sent
    /// on these pools, and where their statement timeouts are set.
    pub pooler: Pooler,
}

/// Write connections beside the writer's batches: deletes and repository
/// changes, which do not go through the writer.
const WRITE_POOL_EXTRA: usize = 4;

impl Pools {
    /// Pools to `config`: `read_size` read connections, enough write
    /// connections for the writer's batches and a few more, and one import
    /// connection per concurrent import.
    ///
    /// # Errors
    ///
    /// When a pool setting is invalid (a size of 0).
    pub fn connect(
        target: impl Into<Postgres>,
        read_size: usize,
        settings: &Settings,
    ) -> anyhow::Result<Self> {
        let target = target.into();
        let write_size = settings.write.batch.concurrency.max() + WRITE_POOL_EXTRA;
        // One connector for the three: once one pool finds a node gone
        // after a failover, the others try the promoted one first too.
        let connector = target.connector();
        let pooler = target.pooler;
        let read = db::pool_with(&connector, pooler, read_size, settings.read.timeout)?;
        let notify = if pooler == Pooler::None {
            db::pool_with(&connector, pooler, 1, settings.invalidation.ping_timeout)?
        } else {
            read.clone()
        };
        Ok(Self {
            pooler,
            write: db::pool_with(&connector, pooler, write_size, settings.write.timeout)?,
            import: db::pool_with(
                &connector,
                pooler,
                settings.import.concurrency,
                settings.import.timeout,
            )?,
            read,
            notify,
            replicas: Vec::new(),
        })
    }

    /// These pools and one read pool of `read_size` connections to each
    /// of `replicas`.
    ///
    /// # Errors
    ///
    /// When a pool setting is invalid.
    pub fn with_replicas(
        mut self,
        replicas: &[Postgres],
        read_size: usize,
        settings: &Settings,
    ) -> anyhow::Result<Self> {
        for replica in replicas {
            let pool = db::pool(replica, read_size, settings.read.timeout)?;
            self.replicas.push((replica.clone(), pool));
        }
        Ok(self)
    }

    /// Closes every pool.
    pub fn close(&self) {
        self.read.close();
        self.write.close();
        self.import.close();
        self.notify.close();
        for (_, pool) in &self.replicas {
            pool.close();
        }
    }
}

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
    /// The invalidation listener's pings' connection (one).
    pub notify: Pool,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
    /// What the service was configured with: request limits and
    /// deadlines.
    pub settings: Settings,
    /// Whether the caches may be used (off while the invalidation
    /// listener is down), and the listener's counts.
    pub coherence: Coherence,
    /// Where reads go: the primary, or replicas that keep up.
    pub router: ReadRouter,
    /// Stops the invalidation listener.
    stop: CancellationToken,
    /// Whether a listener was started.
    listening: std::sync::atomic::AtomicBool,
    /// The OpenAPI document for these settings as JSON, rendered by
    /// `http::openapi` when first asked (it is fixed for the state's life).
    pub(crate) openapi_json: std::sync::OnceLock<String>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // A state dropped without `shutdown` leaves no listener behind.
        self.stop.cancel();
    }
}

impl std::ops::Deref for AppState {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    /// State for serving from `pools` with `settings`; starts the batchers
    /// on the current runtime, but no background task: the caches are
    /// used as if this instance were alone (until [`listen`](Self::listen)),
    /// and replicas are polled only by state from
    /// [`connect`](Self::connect) or [`for_database`](Self::for_database).
    ///
    /// # Errors
    ///
    /// When a batcher or cache setting is invalid.
    pub fn new(pools: Pools, settings: &Settings) -> Result<Self, BuildError> {
        let Pools {
            read: pool,
            write,
            import,
            notify,
            replicas,
            pooler,
        } = pools;
        let coherence = Coherence::default();
        let router = ReadRouter::new(
            pool.clone(),
            replicas,
            pooler.statements(settings.read.timeout),
            &settings.replicas,
            settings.read.timeout,
            coherence.clone(),
        );
        let reads = Reads::new(router.clone(), &settings.read, &settings.auth, &coherence)?;
        let auth = Authenticator::new(&reads, &settings.auth, &coherence);
        let writes = Writes::new(
            write,
            import,
            reads.clone(),
            &settings.write,
            &settings.import,
            pooler,
        )?;
        let metrics = Metrics::new(
            reads.clone(),
            writes.clone(),
            auth.clone(),
            pool.clone(),
            coherence.clone(),
            router.clone(),
        );
        Ok(Self(Arc::new(Inner {
            reads,
            writes,
            auth,
            pool,
            notify,
            metrics: Arc::new(metrics),
            settings: settings.clone(),
            coherence,
            router,
            stop: CancellationToken::new(),
            listening: std::sync::atomic::AtomicBool::new(false),
            openapi_json: std::sync::OnceLock::new(),
        })))
    }

    /// Starts the state's background tasks: the replicas' poller, and
    /// the invalidation listener on `session` (or, without one, bypasses
    /// the caches for good). Both stop at [`shutdown`](Self::shutdown).
    fn start(&self, session: Option<Postgres>) {
        tokio::spawn(
            self.router
                .clone()
                .poll(self.settings.replicas, self.stop.clone()),
        );
        match session {
            Some(target) => self.listen(target),
            None => self.never_listen(),
        }
    }

    /// Starts listening on `target` for other instances' changes (see
    /// [`invalidation`]); until the listener is up, and whenever it is
    /// down, the caches are bypassed. Stopped by [`shutdown`](Self::shutdown).
    pub fn listen(&self, target: Postgres) {
        if self
            .listening
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            return; // one listener per state
        }
        self.coherence.set_usable(false);
        let caches = Caches {
            reads: self.reads.clone(),
            auth: self.auth.clone(),
            router: self.router.clone(),
        };
        tokio::spawn(invalidation::listen(
            target,
            self.notify.clone(),
            caches,
            self.coherence.clone(),
            self.settings.invalidation,
            self.stop.clone(),
        ));
    }

    /// State over new [`Pools`] to `target`, the read pool of `pool_size`
    /// connections.
    ///
    /// # Errors
    ///
    /// When a pool, batcher or cache setting is invalid.
    pub fn connect(
        target: impl Into<Postgres>,
        pool_size: usize,
        settings: &Settings,
    ) -> anyhow::Result<Self> {
        Self::connect_with_replicas(target, &[], pool_size, settings)
    }

    /// As [`connect`](Self::connect), reading from `replicas` too (each
    /// with a read pool of `pool_size`) while they keep up.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    pub fn connect_with_replicas(
        target: impl Into<Postgres>,
        replicas: &[Postgres],
        pool_size: usize,
        settings: &Settings,
    ) -> anyhow::Result<Self> {
        let target = target.into();
        let pools = Pools::connect(&target, pool_size, settings)?
            .with_replicas(replicas, pool_size, settings)?;
        let state = Self::new(pools, settings)?;
        state.start(target.pooler.keeps_sessions().then_some(target));
        Ok(state)
    }

    /// State over `database`, as `serve` runs it: read pools of
    /// `pool_size` connections to it and its replicas, and the
    /// invalidation listener on its session target (the direct URL, or the
    /// database itself unless it is behind a transaction-mode pooler).
    /// Without one, the caches are bypassed for good, and that is logged:
    /// a cache nobody can invalidate would serve stale data.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    pub fn for_database(
        database: &db::Database,
        pool_size: usize,
        settings: &Settings,
    ) -> anyhow::Result<Self> {
        let pools = Pools::connect(database, pool_size, settings)?.with_replicas(
            &database.replicas,
            pool_size,
            settings,
        )?;
        let state = Self::new(pools, settings)?;
        state.start(database.session_target());
        Ok(state)
    }

    /// Bypasses the caches for good: there is no connection that could
    /// hear other instances' changes.
    fn never_listen(&self) {
        self.coherence.set_usable(false);
        tracing::warn!(
            "DATABASE_URL goes through a transaction-mode pooler, which cannot carry LISTEN, \
             and no --direct-url (PGBATCH_DIRECT_URL) is set: other instances' changes cannot \
             be heard, so the caches (tokens included) are bypassed and every read goes to \
             the database; set --direct-url to a direct connection to the same database to \
             use them"
        );
    }

    /// Commits and acknowledges queued writes, answers queued reads, then
    /// closes the pool.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        tokio::join!(self.writes.shutdown(), self.reads.shutdown());
        self.pool.close();
        self.notify.close();
    }
}
