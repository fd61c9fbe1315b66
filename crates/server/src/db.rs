//! Where the database comes from (`DATABASE_URL`, or an embedded cluster),
//! and the schema migrations applied to it.

use anyhow::Context as _;
use embedded_pg::{Cluster, ClusterOptions};
use tokio_postgres::NoTls;

use crate::queries::database;
use crate::settings::DbSettings;

mod embedded {
    refinery::embed_migrations!("../../migrations");
}

/// The database the service runs on.
#[derive(Debug)]
pub struct Database {
    /// How to connect to it.
    pub config: tokio_postgres::Config,
    /// The embedded cluster, when there is no `DATABASE_URL`; stopped when
    /// dropped.
    pub cluster: Option<Cluster>,
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
        if let Some(url) = &settings.url {
            let config = url
                .parse()
                .context("DATABASE_URL is not a valid Postgres connection string")?;
            return Ok(Self {
                config,
                cluster: None,
            });
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
            cluster: Some(cluster),
        })
    }

    /// Stops the embedded cluster, if any, cleanly.
    pub async fn close(self) {
        if let Some(cluster) = &self.cluster {
            cluster.stop().await;
        }
    }
}

async fn create_database_if_missing(
    admin: &tokio_postgres::Config,
    name: &str,
) -> anyhow::Result<()> {
    let (client, conn) = admin.connect(NoTls).await?;
    let conn = tokio::spawn(conn);
    database::create_database_if_missing(&client, name).await?;
    drop(client);
    let _ = conn.await; // ends as the client is dropped; nothing to report
    Ok(())
}

/// Applies the forward-only migrations in `migrations/` that the database
/// has not seen yet. The server and the tests both call this.
///
/// # Errors
///
/// When the database is unreachable or a migration fails (then nothing of
/// that migration is applied).
pub async fn migrate(config: &tokio_postgres::Config) -> anyhow::Result<()> {
    let (mut client, conn) = config
        .connect(NoTls)
        .await
        .context("could not connect to run migrations")?;
    let conn = tokio::spawn(conn);
    let report = embedded::migrations::runner()
        .run_async(&mut client)
        .await
        .context("migration failed")?;
    for m in report.applied_migrations() {
        tracing::info!(version = m.version(), name = m.name(), "applied migration");
    }
    drop(client);
    let _ = conn.await; // ends as the client is dropped; nothing to report
    Ok(())
}

/// A connection pool of `pool_size` connections, each with a server-side
/// `statement_timeout`: the deadline of the work the pool is for.
///
/// A request abandoned at its deadline stops waiting in the service, but
/// Postgres would go on running (or lock-waiting on) its statement and keep
/// the connection busy; the statement timeout makes the server give up too.
///
/// # Errors
///
/// When the pool settings are invalid (a size of 0).
pub fn pool(
    config: &tokio_postgres::Config,
    pool_size: usize,
    statement_timeout: std::time::Duration,
) -> anyhow::Result<batcher::pg::Pool> {
    let mut config = config.clone();
    let timeout = format!(
        "-c statement_timeout={}",
        statement_timeout.as_millis().max(1)
    );
    let options = match config.get_options() {
        Some(existing) => format!("{existing} {timeout}"),
        None => timeout,
    };
    config.options(&options);
    batcher::pg::pool(config, &batcher::pg::PoolOptions::with_max_size(pool_size))
        .context("invalid pool settings")
}

/// One round trip on a pooled connection: the database answers.
///
/// # Errors
///
/// When no connection can be had or the database does not answer.
pub async fn ping(pool: &batcher::pg::Pool) -> anyhow::Result<()> {
    let client = pool.get().await?;
    database::ping(&client).await?;
    Ok(())
}
