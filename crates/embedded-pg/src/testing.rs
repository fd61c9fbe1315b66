//! Throwaway databases for tests.
//!
//! [`database`] gives each test its own, freshly created database, so tests
//! run in parallel without seeing each other's rows. With `DATABASE_URL`
//! set, the databases are created on that server (its user needs
//! `CREATEDB`). Without it, one private cluster is started per test process,
//! in a temporary directory, with durability off for speed. Tests never skip
//! for lack of a server.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use tokio::sync::OnceCell;
use tokio_postgres::NoTls;

use crate::{Cluster, ClusterOptions, Error};

/// Where the server for this test process lives.
#[derive(Debug)]
enum Server {
    Embedded(Cluster),
    External(tokio_postgres::Config),
}

impl Server {
    fn config(&self, dbname: &str) -> tokio_postgres::Config {
        match self {
            Server::Embedded(c) => c.config(dbname),
            Server::External(base) => {
                let mut config = base.clone();
                config.dbname(dbname);
                config
            }
        }
    }

    fn admin_config(&self) -> tokio_postgres::Config {
        match self {
            Server::Embedded(c) => c.config("postgres"),
            Server::External(base) => base.clone(),
        }
    }
}

static SERVER: OnceCell<Server> = OnceCell::const_new();
static NEXT: AtomicU64 = AtomicU64::new(0);

/// A database created for one test.
#[derive(Debug, Clone)]
pub struct TestDatabase {
    /// Its name.
    pub name: String,
    /// Connection settings for it.
    pub config: tokio_postgres::Config,
}

/// Creates a new, empty database for the calling test.
///
/// # Errors
///
/// When no server can be started or reached; the error says what to
/// install or set.
pub async fn database() -> Result<TestDatabase, Error> {
    let server = SERVER.get_or_try_init(start_server).await?;
    let name = format!("test_{}_{}", std::process::id(), NEXT.fetch_add(1, Relaxed));
    let (client, conn) = server.admin_config().connect(NoTls).await?;
    let conn = tokio::spawn(conn);
    client
        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .await?;
    drop(client);
    let _ = conn.await; // ends when the client is dropped; nothing to report
    Ok(TestDatabase {
        config: server.config(&name),
        name,
    })
}

/// Starts a cluster of the calling test's own, for fault tests that stop,
/// freeze or crash the server, which would hurt every other test on the
/// shared one. Always local, even with `DATABASE_URL` set: a test must not
/// freeze a server it does not own. Stopped when dropped; its directory is
/// removed by a later run, as the shared cluster's is.
///
/// # Errors
///
/// When the server binaries are missing or the cluster cannot start.
pub async fn private_cluster() -> Result<Cluster, Error> {
    private_cluster_with(|options| options).await
}

/// Like [`private_cluster`], with `customize` applied to its options (TCP,
/// TLS, settings). Its port is one that was free a moment before.
///
/// # Errors
///
/// As [`private_cluster`], or when no free port can be found.
pub async fn private_cluster_with(
    customize: impl FnOnce(ClusterOptions) -> ClusterOptions,
) -> Result<Cluster, Error> {
    Cluster::start(customize(private_options()?)).await
}

/// A streaming replica of `primary` (a [`private_cluster`]) in a private
/// directory of its own, with `customize` applied to its options (a
/// `recovery_min_apply_delay`, say). Restart it after a stop with
/// `Cluster::start` on the same options.
///
/// # Errors
///
/// As [`private_cluster`], or when the base backup fails.
pub async fn private_replica_with(
    primary: &Cluster,
    customize: impl FnOnce(ClusterOptions) -> ClusterOptions,
) -> Result<Cluster, Error> {
    Cluster::start(customize(private_options()?.replica_of(primary))).await
}

/// Options of a throwaway cluster in a fresh private directory, on a port
/// that was free a moment before.
pub fn private_options() -> Result<ClusterOptions, Error> {
    let base = std::env::temp_dir().join("pgbatch-test");
    remove_stale_clusters(&base);
    let dir = base.join(format!(
        "{}.private-{}",
        std::process::id(),
        NEXT.fetch_add(1, Relaxed)
    ));
    // The port also names the socket, which lives in the cluster's own
    // directory, so only TCP needs it free.
    let port = crate::cluster::fresh_port(&dir)?;
    Ok(ClusterOptions::new(dir)
        .port(port)
        .durable(false)
        .setting("shared_buffers", "16MB"))
}

async fn start_server() -> Result<Server, Error> {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        let config = url.parse().map_err(Error::InvalidUrl)?;
        return Ok(Server::External(config));
    }
    let base = std::env::temp_dir().join("pgbatch-test");
    remove_stale_clusters(&base);
    let dir = base.join(std::process::id().to_string());
    let cluster = Cluster::start(
        ClusterOptions::new(dir)
            .durable(false)
            .setting("max_connections", "300")
            .setting("shared_buffers", "64MB"),
    )
    .await?;
    Ok(Server::Embedded(cluster))
}

/// Removes the clusters of earlier test processes that have exited. Static
/// clusters are never dropped, so their directories are cleaned here, by
/// the next run, instead.
fn remove_stale_clusters(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.split('.').next()?.parse::<u32>().ok())
        else {
            continue;
        };
        if !PathBuf::from(format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path()); // best effort: another run may race us
            let _ = std::fs::remove_file(entry.path()); // the `<pid>.log` beside it
        }
    }
}
