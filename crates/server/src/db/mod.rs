//! Where the database comes from (`DATABASE_URL`, or an embedded cluster),
//! and the schema migrations applied to it; below it, every SQL statement
//! (`queries`), TLS to Postgres (`tls`) and the demo data (`seed`).
//!
//! Imports from `settings`, and from `model` the types its queries answer
//! with: the database layer names no HTTP or OpenAPI type, and knows nothing
//! of caches or the domain.

pub mod queries;
pub mod seed;
pub mod tls;

use std::fmt;

use anyhow::Context as _;
use embedded_pg::{Cluster, ClusterOptions};
use std::time::Duration;

use pgbatch::pg::{Connector, DbErrorKind, Lease, TargetSessionAttrs};
use tokio_postgres::GenericClient;

use self::tls::Tls;
use crate::db::queries::system;
use crate::settings::{DbSettings, Pooler};

mod embedded {
    refinery::embed_migrations!("../../migrations");
}

/// What `target`'s connection string leads to, for [`Pooler::Auto`].
/// A transaction-mode pooler is caught handing out server connections: one
/// connection reads its server process id, a second holds a transaction
/// open and reads its own, then the first reads its id again. On a direct
/// connection the second id differs from the first and the first stays the
/// same; a transaction-mode pooler gave the first connection's server
/// process to the second, or moved the first to another. A pooler that
/// refuses the `options` startup parameter (PgBouncer) but keeps each
/// client on its server process is a session-mode one. (A pooler that does
/// neither is taken for a direct connection.)
///
/// # Errors
///
/// When the database cannot be reached.
pub async fn detect_pooler(target: &Postgres) -> anyhow::Result<Pooler> {
    let first = target
        .connect_patiently(STARTUP_CONNECT_TIMEOUT)
        .await
        .context("could not connect")?;
    tokio::time::timeout(DETECT_TIMEOUT, detect_on(target, first))
        .await
        .with_context(|| format!("the database did not answer within {DETECT_TIMEOUT:?}"))?
}

async fn detect_on(target: &Postgres, first: tokio_postgres::Client) -> anyhow::Result<Pooler> {
    let mut second = target.connect().await.context("could not connect")?;
    let p1 = backend_pid(&first).await?;
    let tx = second.transaction().await?;
    let p2 = backend_pid(&tx).await?;
    let p3 = backend_pid(&first).await?;
    tx.rollback().await?;
    if p2 == p1 || p3 != p1 {
        return Ok(Pooler::Transaction);
    }
    let mut with_options = target.clone();
    with_options.config.options("-c statement_timeout=0");
    match with_options.connect().await {
        Err(e) if pgbatch::pg::classify(&e) == DbErrorKind::SessionStateLost => Ok(Pooler::Session),
        _ => Ok(Pooler::None),
    }
}

/// The server process serving `client`'s current transaction.
async fn backend_pid(client: &impl GenericClient) -> anyhow::Result<i32> {
    Ok(system::backend_pid(client).await?)
}

/// A Postgres to connect to: its settings, the TLS connector that carries
/// out their `sslmode` (see [`tls`]), and what pooler stands in between.
#[derive(Clone)]
pub struct Postgres {
    /// Host, port, user, database, `sslmode` as tokio-postgres has it.
    pub config: tokio_postgres::Config,
    /// The connector for every connection to it.
    pub tls: Tls,
    /// The pooler its connections go through (never [`Pooler::Auto`] once
    /// [`Database::open`] has found out).
    pub pooler: Pooler,
    /// What a node among its hosts must be to be connected to.
    pub attrs: TargetSessionAttrs,
}

impl fmt::Debug for Postgres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Postgres")
            .field("config", &self.config)
            .field("pooler", &self.pooler)
            .field("attrs", &self.attrs)
            .finish_non_exhaustive()
    }
}

/// A config alone gets libpq's default TLS policy, `prefer` (unused on a
/// Unix socket), and no pooler: how tests and benchmarks reach their own
/// clusters.
impl From<tokio_postgres::Config> for Postgres {
    fn from(config: tokio_postgres::Config) -> Self {
        Self {
            attrs: config.get_target_session_attrs().into(),
            config,
            tls: tls::default_connector(),
            pooler: Pooler::None,
        }
    }
}

impl From<&tokio_postgres::Config> for Postgres {
    fn from(config: &tokio_postgres::Config) -> Self {
        config.clone().into()
    }
}

impl From<&Postgres> for Postgres {
    fn from(target: &Postgres) -> Self {
        target.clone()
    }
}

impl From<&Database> for Postgres {
    fn from(database: &Database) -> Self {
        Self {
            config: database.config.clone(),
            tls: database.tls.clone(),
            pooler: database.pooler,
            attrs: database.attrs,
        }
    }
}

impl Postgres {
    /// What opens its connections: each host in turn under a deadline of
    /// its own (connect, login, role check), the ones that failed lately
    /// last, until one is what [`attrs`](Self::attrs) asks for.
    pub fn connector(&self) -> Connector<Tls> {
        Connector::new(self.config.clone(), self.tls.clone()).target_session_attrs(self.attrs)
    }

    /// One connection, driven by a task of its own until the client is
    /// dropped.
    ///
    /// # Errors
    ///
    /// When no host can be reached in time, refuses the login, fails the
    /// TLS handshake or certificate check, or is not what
    /// [`attrs`](Self::attrs) asks for.
    pub async fn connect(&self) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let (client, conn) = self.connector().connect().await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "database connection ended");
            }
        });
        Ok(client)
    }

    /// [`connect`](Self::connect), tried again (backing off from 100 ms to
    /// 1 s) while the database is unavailable, for at most `within`: at
    /// start, during a failover, the service comes up as soon as a node
    /// that fits accepts connections. An error that is not an outage
    /// (a refused login, a TLS failure) is returned at once.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect), the last one once `within` has passed.
    pub async fn connect_patiently(
        &self,
        within: Duration,
    ) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let deadline = tokio::time::Instant::now() + within;
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.connect().await {
                Ok(client) => return Ok(client),
                Err(e)
                    if pgbatch::pg::classify(&e) == DbErrorKind::Unavailable
                        && tokio::time::Instant::now() + backoff < deadline =>
                {
                    tracing::warn!(error = %e, retry_in = ?backoff, "the database is not reachable yet");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// How long start-up waits for the database to accept connections (a
/// restart during a failover waits for the promoted node).
pub const STARTUP_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long pooler detection may take once connected.
const DETECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the migrations may take in all.
pub const MIGRATION_TIMEOUT: Duration = Duration::from_secs(300);

/// The database the service runs on.
#[derive(Debug)]
pub struct Database {
    /// How to connect to it.
    pub config: tokio_postgres::Config,
    /// The TLS connector for it, from `sslmode` and `sslrootcert`.
    pub tls: Tls,
    /// The embedded cluster, when there is no `DATABASE_URL`; stopped when
    /// dropped.
    pub cluster: Option<Cluster>,
    /// Read replicas of it (`--replica-url`).
    pub replicas: Vec<Postgres>,
    /// The pooler `config` goes through, resolved (never
    /// [`Pooler::Auto`]).
    pub pooler: Pooler,
    /// What a node among `config`'s hosts must be: `read-write` unless the
    /// URL says otherwise and names one host.
    pub attrs: TargetSessionAttrs,
    /// A direct connection to the same database (`--direct-url`), for what
    /// needs a session: migrations and the invalidation listener.
    pub direct: Option<Postgres>,
}

/// The database name used inside the embedded cluster.
const EMBEDDED_DB: &str = "pgbatch";

impl Database {
    /// Connects to `DATABASE_URL`, or starts the embedded cluster in the
    /// data directory (creating it and its database on first start).
    ///
    /// # Errors
    ///
    /// When the URL is invalid or the cluster cannot start; the message says
    /// what to install or change.
    pub async fn open(settings: &DbSettings) -> anyhow::Result<Self> {
        Self::open_with(settings, |options| options).await
    }

    /// Like [`open`](Self::open), with `customize` applied to the embedded
    /// cluster's options (the benchmarks turn on its TCP listener).
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open).
    pub async fn open_with(
        settings: &DbSettings,
        customize: impl FnOnce(ClusterOptions) -> ClusterOptions,
    ) -> anyhow::Result<Self> {
        let mut replicas = settings
            .replica_urls
            .iter()
            .enumerate()
            .map(|(i, url)| {
                target_of(url, &settings.tls, false)
                    .with_context(|| format!("replica URL number {} is not usable", i + 1))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let direct = settings
            .direct_url
            .as_deref()
            .map(|url| target_of(url, &settings.tls, true).context("the direct URL is not usable"))
            .transpose()?;
        if let Some(url) = &settings.url {
            let mut target = target_of(url, &settings.tls, true)?;
            target.pooler = match settings.pooler {
                Pooler::Auto => {
                    let found = detect_pooler(&target).await.context(
                        "could not reach the database to see whether a pooler is in between",
                    )?;
                    tracing::info!(pooler = ?found, "found out what DATABASE_URL leads to (set --pooler to say it instead)");
                    found
                }
                given => given,
            };
            let Postgres {
                config,
                tls,
                pooler,
                attrs,
            } = target;
            // Replicas are reached as the primary is (a managed offering
            // fronts both with the same kind of pooler), and the read
            // router sends one kind of statement to all of them.
            for replica in &mut replicas {
                replica.pooler = pooler;
            }
            return Ok(Self {
                config,
                tls,
                cluster: None,
                replicas,
                pooler,
                attrs,
                direct,
            });
        }
        if direct.is_some() {
            anyhow::bail!(
                "--direct-url needs --database-url; the embedded cluster is reached directly"
            );
        }
        if !replicas.is_empty() {
            anyhow::bail!(
                "read replicas (--replica-url) need the primary's --database-url; \
                 the embedded cluster has no replicas"
            );
        }
        // No replication from the embedded cluster, so WAL need only cover
        // crash recovery; bulk loads into fresh tables then skip it.
        let options = customize(
            ClusterOptions::new(&settings.data_dir)
                .setting("wal_level", "minimal")
                .setting("max_wal_senders", "0"),
        );
        let cluster = Cluster::start(options)
            .await
            .context("could not start the embedded Postgres")?;
        create_database_if_missing(&cluster.config("postgres"), EMBEDDED_DB).await?;
        Ok(Self {
            config: cluster.config(EMBEDDED_DB),
            tls: tls::default_connector(),
            cluster: Some(cluster),
            replicas: Vec::new(),
            pooler: Pooler::None,
            attrs: TargetSessionAttrs::Any,
            direct: None,
        })
    }

    /// Where what needs a session goes (migrations, the invalidation
    /// listener): the direct URL if given, else the database itself unless
    /// it is behind a transaction-mode pooler.
    pub fn session_target(&self) -> Option<Postgres> {
        match &self.direct {
            Some(direct) => Some(direct.clone()),
            None if self.pooler.keeps_sessions() => Some(self.into()),
            None => None,
        }
    }

    /// Like [`open`](Self::open), but when the embedded cluster already
    /// runs (a server is serving it), connects to that one through its
    /// socket instead of starting a second postmaster on the directory:
    /// for the admin commands, which may run beside a serving server.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open).
    pub async fn open_or_attach(settings: &DbSettings) -> anyhow::Result<Self> {
        if settings.url.is_none() {
            if let Some(running) = embedded_pg::Running::find(&settings.data_dir) {
                tracing::info!(
                    pid = running.pid,
                    data_dir = %settings.data_dir.display(),
                    "using the embedded Postgres that is already running"
                );
                return Ok(Self {
                    config: running.config(EMBEDDED_DB),
                    tls: tls::default_connector(),
                    cluster: None,
                    replicas: Vec::new(),
                    pooler: Pooler::None,
                    attrs: TargetSessionAttrs::Any,
                    direct: None,
                });
            }
        }
        Self::open(settings).await
    }

    /// Stops the embedded cluster, if any, cleanly.
    pub async fn close(self) {
        if let Some(cluster) = &self.cluster {
            cluster.stop().await;
        }
    }
}

/// The target a connection string names, its TLS settings overridden by
/// flags (which win over the URL).
fn target_of(
    url: &str,
    overrides: &crate::settings::TlsOverrides,
    writable: bool,
) -> anyhow::Result<Postgres> {
    let (mut config, mut tls_settings, attrs) = tls::parse_url_with_target(url)?;
    // Several hosts for the primary: the one that takes writes, wherever
    // it is after a failover (libpq's default, `any`, would take a
    // standby first if it is listed first).
    let hosts = config.get_hosts().len().max(config.get_hostaddrs().len());
    let attrs = attrs.unwrap_or(if writable && hosts > 1 {
        TargetSessionAttrs::ReadWrite
    } else {
        TargetSessionAttrs::Any
    });
    if let Some(mode) = overrides.mode {
        tls_settings.mode = mode;
    }
    if let Some(root) = &overrides.root_cert {
        tls_settings.root_cert = Some(root.clone());
    }
    config.ssl_mode(tls_settings.mode.for_tokio_postgres());
    let tls = tls::connector(&tls_settings)?;
    Ok(Postgres {
        config,
        tls,
        pooler: Pooler::None,
        attrs,
    })
}

async fn create_database_if_missing(
    admin: &tokio_postgres::Config,
    name: &str,
) -> anyhow::Result<()> {
    let client = Postgres::from(admin)
        .connect_patiently(STARTUP_CONNECT_TIMEOUT)
        .await?;
    tokio::time::timeout(
        DETECT_TIMEOUT,
        system::create_database_if_missing(&client, name),
    )
    .await
    .context("creating the database timed out")??;
    Ok(())
}

/// Applies the forward-only migrations in `migrations/` that the database
/// has not seen yet. The server and the tests both call this.
///
/// # Errors
///
/// When the database is unreachable or a migration fails (then nothing of
/// that migration is applied).
pub async fn migrate(target: impl Into<Postgres>) -> anyhow::Result<()> {
    let client = target
        .into()
        .connect_patiently(STARTUP_CONNECT_TIMEOUT)
        .await
        .context("could not connect to run migrations")?;
    tokio::time::timeout(MIGRATION_TIMEOUT, migrate_on(client))
        .await
        .with_context(|| format!("the migrations did not finish within {MIGRATION_TIMEOUT:?}"))?
}

async fn migrate_on(mut client: tokio_postgres::Client) -> anyhow::Result<()> {
    let runner = embedded::migrations::runner();
    let report = runner
        .run_async(&mut client)
        .await
        .context("migration failed")?;
    for m in report.applied_migrations() {
        tracing::info!(version = m.version(), name = m.name(), "applied migration");
    }
    Ok(())
}

/// A connection pool of `pool_size` connections whose statements the server
/// gives up on after `statement_timeout`: the deadline of the work the
/// pool is for. On a direct connection each connection carries it as a
/// setting; behind a pooler, which refuses it or would let it leak to other
/// clients, it is set in each transaction instead (see
/// [`Pooler::statements`], which whoever uses the pool must follow).
///
/// A request abandoned at its deadline stops waiting in the service, but
/// Postgres would go on running (or lock-waiting on) its statement and keep
/// the connection busy; the statement timeout makes the server give up too.
///
/// # Errors
///
/// When the pool settings are invalid (a size of 0).
pub fn pool(
    target: impl Into<Postgres>,
    pool_size: usize,
    statement_timeout: Duration,
) -> anyhow::Result<pgbatch::pg::Pool> {
    let target = target.into();
    pool_with(
        &target.connector(),
        target.pooler,
        pool_size,
        statement_timeout,
    )
}

/// As [`pool`], opening connections through a clone of `connector`, so
/// that pools to one database share what it learned of the hosts (after a
/// failover, which one is gone).
///
/// # Errors
///
/// As [`pool`].
pub fn pool_with(
    connector: &Connector<Tls>,
    pooler: Pooler,
    pool_size: usize,
    statement_timeout: Duration,
) -> anyhow::Result<pgbatch::pg::Pool> {
    let mut config = connector.config().clone();
    if pooler == Pooler::None {
        let timeout = format!(
            "-c statement_timeout={}",
            statement_timeout.as_millis().max(1)
        );
        let options = match config.get_options() {
            Some(existing) => format!("{existing} {timeout}"),
            None => timeout,
        };
        config.options(&options);
    }
    pgbatch::pg::pool_with_connector(
        connector.with_config(config),
        &pgbatch::pg::PoolOptions::with_max_size(pool_size),
    )
    .context("invalid pool settings")
}

/// How long past a statement's timeout a lease that is dropped unreleased
/// still counts as a client going away rather than a node that hangs.
pub const LEASE_MARGIN: Duration = Duration::from_secs(1);

/// How long a request's statement may hold its connection before, dropped
/// unreleased, it is taken for one on a node that hangs, and the pool's
/// idle connections go with it (see [`Lease`]): past every deadline but
/// an import's, so a client that goes away mid-request costs one
/// connection, never the pool's.
pub const REQUEST_HUNG_AFTER: Duration = Duration::from_secs(10);

/// A connection from `pool` for a request's statements (see
/// [`REQUEST_HUNG_AFTER`]).
///
/// # Errors
///
/// As deadpool's `Pool::get`.
pub async fn lease(pool: &pgbatch::pg::Pool) -> Result<Lease, deadpool_postgres::PoolError> {
    Lease::get_for(pool, REQUEST_HUNG_AFTER).await
}

/// One round trip on a pooled connection: the database answers.
///
/// # Errors
///
/// When no connection can be had or the database does not answer.
pub async fn ping(pool: &pgbatch::pg::Pool) -> anyhow::Result<()> {
    let client = lease(pool).await?;
    let answered = system::ping(&client).await;
    client.settle(&answered);
    answered?;
    Ok(())
}
