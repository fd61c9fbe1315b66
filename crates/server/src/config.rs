//! Command line and environment configuration.
//!
//! Every flag has an environment fallback (`PGBATCH_*`, and `DATABASE_URL`),
//! so the same binary is configured the same way in a shell, a container or
//! a service manager.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// The object-metadata service.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
pub struct Cli {
    /// What to do; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Where the data lives.
    #[command(flatten)]
    pub db: DbArgs,
    /// Serving options (for `serve`, the default command).
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply migrations, seed demo data if the tables are empty, and serve
    /// HTTP (the default).
    Serve,
    /// Bulk-load demo objects and `random_read_test` rows with binary COPY,
    /// into tables that are still empty, then exit.
    Seed(SeedArgs),
}

/// Which database to use.
#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    /// A Postgres connection string. Without it, a private Postgres cluster
    /// is started in `--data-dir`.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,
    /// Directory of the embedded cluster (created on first start, kept
    /// across restarts; used without `--database-url`).
    #[arg(
        long,
        env = "PGBATCH_DATA_DIR",
        default_value = ".data/pg",
        global = true
    )]
    pub data_dir: PathBuf,
    /// Database connections in the pool.
    #[arg(long, env = "PGBATCH_POOL_SIZE", default_value_t = 16, global = true)]
    pub pool_size: usize,
}

/// How lookups reach Postgres.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReadPathKind {
    /// One statement per lookup, through the pool.
    Naive,
    /// Concurrent lookups coalesced by the batcher into one statement.
    Batched,
}

/// The batcher's flush policy, as a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// Dispatch whenever a load slot is free.
    Eager,
    /// Dispatch when full or `--batch-delay-us` after the first key.
    FixedDelay,
}

/// Serving options.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "PGBATCH_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// How reads reach Postgres.
    #[arg(long, env = "PGBATCH_READ_PATH", value_enum, default_value_t = ReadPathKind::Batched)]
    pub read_path: ReadPathKind,
    /// Most keys per batched statement.
    #[arg(long, env = "PGBATCH_BATCH_SIZE", default_value_t = 64)]
    pub batch_size: usize,
    /// Batch flush policy.
    #[arg(long, env = "PGBATCH_BATCH_POLICY", value_enum, default_value_t = PolicyArg::Eager)]
    pub batch_policy: PolicyArg,
    /// With `fixed-delay`: flush this many microseconds after a batch's
    /// first key.
    #[arg(long, env = "PGBATCH_BATCH_DELAY_US", default_value_t = 500)]
    pub batch_delay_us: u64,
    /// Batched statements running at once, per batcher.
    #[arg(long, env = "PGBATCH_BATCH_CONCURRENCY", default_value_t = 8)]
    pub batch_concurrency: usize,
    /// Requests that may wait for the batcher before new ones get 503.
    #[arg(long, env = "PGBATCH_QUEUE_CAPACITY", default_value_t = 8192)]
    pub queue_capacity: usize,
    /// Deadline of one lookup, in milliseconds; past it the request gets 504.
    #[arg(long, env = "PGBATCH_REQUEST_TIMEOUT_MS", default_value_t = 500)]
    pub request_timeout_ms: u64,
    /// Most paths in one `POST .../objects/stat`.
    #[arg(long, env = "PGBATCH_MAX_STAT_PATHS", default_value_t = 1000)]
    pub max_stat_paths: usize,
    /// Largest accepted request body, in bytes.
    #[arg(long, env = "PGBATCH_MAX_BODY_BYTES", default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// Demo objects to seed on start when the objects table is empty (0:
    /// none).
    #[arg(long, env = "PGBATCH_SEED_OBJECTS", default_value_t = 1_000_000)]
    pub seed_objects: u64,
    /// `random_read_test` rows to seed on start when that table is empty
    /// (0: none).
    #[arg(long, env = "PGBATCH_SEED_KV_ROWS", default_value_t = 1_000_000)]
    pub seed_kv_rows: u64,
}

/// Options of `seed`.
#[derive(Debug, Clone, Args)]
pub struct SeedArgs {
    /// Demo objects to load into repository `demo`.
    #[arg(long, default_value_t = 1_000_000)]
    pub objects: u64,
    /// `random_read_test` rows to load.
    #[arg(long, default_value_t = 1_000_000)]
    pub kv_rows: u64,
}

impl ServeArgs {
    /// The per-lookup deadline.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
}
