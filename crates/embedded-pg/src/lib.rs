//! A private Postgres cluster, started from the installed server binaries.
//!
//! The demo server runs on one by default (data in `./.data/pg`, kept across
//! restarts), and the tests get throwaway databases from one
//! ([`testing::database`]). Both use the same code, so what the tests run
//! against is what the demo runs.
//!
//! The cluster listens on a Unix socket only (`listen_addresses = ''`) with
//! `trust` authentication. The socket directory is private to the cluster's
//! OS user, so only that user (and root) can connect. The
//! `ClusterOptions::listen_tcp` option adds a loopback TCP listener, also with
//! `trust`: any local user can then connect, so it is meant for benchmarks
//! (a latency proxy needs TCP), not for shared machines.
//!
//! Two facts shape the code:
//! - `initdb` and `postgres` refuse to run as root. When the process is
//!   root, as CI is, they run as the `postgres` OS user, which Debian's
//!   `postgresql` package creates.
//! - A Postgres child must not outlive its owner, even one that is killed.
//!   It is started under a small shell wrapper that shuts it down (fast
//!   shutdown, SIGINT) as soon as its standard input closes. The owner holds
//!   the write end of that pipe; the kernel closes it when the owner exits,
//!   however it exits.

mod cluster;
pub mod pgbouncer;
pub mod testing;

pub use cluster::{processes_of, Cluster, ClusterOptions, Frozen, Running};

use std::path::PathBuf;

/// Why a cluster could not be started or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `initdb` and `postgres` were not found.
    #[error(
        "PostgreSQL server binaries (initdb, postgres) not found in PG_BIN_DIR, \
         /usr/lib/postgresql/*/bin or PATH; install them with \
         `apt-get install -y postgresql` (as root), set PG_BIN_DIR, \
         or set DATABASE_URL to use a running server"
    )]
    BinariesNotFound,

    /// `pgbouncer` was not found (for tests behind a connection pooler).
    #[error(
        "pgbouncer not found in PGBOUNCER, /usr/sbin/pgbouncer or PATH; install it with          `apt-get install -y pgbouncer` (as root; `scripts/ensure-postgres.sh` does)          or set PGBOUNCER to the binary"
    )]
    PgBouncerNotFound,

    /// Running as root, but there is no unprivileged `postgres` user to run
    /// the server as.
    #[error(
        "running as root, and Postgres refuses to run as root, but there is no `postgres` \
         OS user to run it as; install the `postgresql` package (it creates one) or run \
         as an unprivileged user"
    )]
    NoUnprivilegedUser,

    /// The `postgres` OS user cannot reach the data directory.
    #[error(
        "the `postgres` OS user cannot reach {path}: a parent directory is not \
         searchable by other users; choose a data directory elsewhere (for example \
         under /var/tmp)"
    )]
    DataDirNotReachable {
        /// The directory that blocks access.
        path: PathBuf,
    },

    /// A server already runs on the data directory (another process
    /// started it). Two postmasters on one directory must never run.
    #[error(
        "a Postgres server (pid {pid}) already runs on {data_dir}; stop the process that \
         started it, or choose another data directory"
    )]
    AlreadyRunning {
        /// The data directory.
        data_dir: PathBuf,
        /// Its postmaster's PID.
        pid: i32,
    },

    /// The data directory holds files but is not a Postgres cluster.
    #[error("{path} exists and is not empty, but is not a Postgres data directory")]
    NotADataDir {
        /// The directory given as data directory.
        path: PathBuf,
    },

    /// A file-system operation failed.
    #[error("{what} {path}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },

    /// A Postgres program failed; its output is included.
    #[error("{program} failed: {output}")]
    Command {
        /// The program that failed.
        program: &'static str,
        /// What it printed (the end of the server log for `postgres`).
        output: String,
    },

    /// The server did not accept connections in time.
    #[error("postgres did not become ready within {seconds} s; log: {log}")]
    NotReady {
        /// How long we waited.
        seconds: u64,
        /// The end of the server log.
        log: String,
    },

    /// Changing the owner of a path failed.
    #[error("could not give {path} to the postgres user")]
    Chown {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: nix::Error,
    },

    /// A database operation failed.
    #[error("database operation failed")]
    Db(#[from] tokio_postgres::Error),

    /// `DATABASE_URL` is not a valid connection string.
    #[error("DATABASE_URL is not a valid Postgres connection string")]
    InvalidUrl(#[source] tokio_postgres::Error),
}
