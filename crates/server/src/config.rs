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
    /// Manage users.
    #[command(subcommand)]
    User(UserCommand),
    /// Manage API tokens.
    #[command(subcommand)]
    Token(TokenCommand),
}

/// `server user ...`
#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Create a user with the given access.
    Create {
        /// The user's name (1-64 of A-Z a-z 0-9 . _ -).
        name: String,
        /// A repository (or `*` for all) the user may read; repeatable.
        #[arg(long = "read", value_name = "REPO")]
        read: Vec<String>,
        /// A repository (or `*` for all) the user may read and write;
        /// repeatable.
        #[arg(long = "write", value_name = "REPO")]
        write: Vec<String>,
    },
}

/// `server token ...`
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token for a user and print it (it is stored only hashed,
    /// so it cannot be shown again).
    Create {
        /// The user the token authenticates as.
        user: String,
        /// What the token is for.
        #[arg(long, default_value = "")]
        description: String,
    },
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
    /// File the first start writes the generated admin token to.
    #[arg(
        long,
        env = "PGBATCH_ADMIN_TOKEN_FILE",
        default_value = ".data/admin-token",
        global = true
    )]
    pub admin_token_file: PathBuf,
}

/// How lookups reach Postgres.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReadPathKind {
    /// One statement per lookup, through the pool.
    Naive,
    /// Concurrent lookups coalesced by the batcher into one statement.
    Batched,
    /// A coalescing TTL cache in front of the batched path.
    Cached,
}

/// Whether a cache is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    /// Used.
    On,
    /// Not used.
    Off,
}

/// The batcher's flush policy, as a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// Dispatch whenever a load slot is free.
    Eager,
    /// Dispatch when full or `--batch-delay-us` after the first key.
    FixedDelay,
    /// Eager while fewer than half the batch slots are busy, fixed-delay
    /// beyond.
    Adaptive,
}

impl From<PolicyArg> for batcher::FlushPolicy {
    fn from(arg: PolicyArg) -> Self {
        match arg {
            PolicyArg::Eager => Self::Eager,
            PolicyArg::FixedDelay => Self::FixedDelay,
            PolicyArg::Adaptive => Self::Adaptive,
        }
    }
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
    /// Batch flush policy. Adaptive by default: as fast as eager for a lone
    /// request, and it formed larger batches and read the most under a
    /// saturating load (BENCHMARKS.md §5).
    #[arg(long, env = "PGBATCH_BATCH_POLICY", value_enum, default_value_t = PolicyArg::Adaptive)]
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
    /// Most object writes committed in one statement.
    #[arg(long, env = "PGBATCH_WRITE_BATCH_SIZE", default_value_t = 256)]
    pub write_batch_size: usize,
    /// Write statements running at once.
    #[arg(long, env = "PGBATCH_WRITE_CONCURRENCY", default_value_t = 4)]
    pub write_concurrency: usize,
    /// Deadline of one write, in milliseconds (it may still commit after).
    #[arg(long, env = "PGBATCH_WRITE_TIMEOUT_MS", default_value_t = 5_000)]
    pub write_timeout_ms: u64,
    /// Largest accepted import body, in bytes (streamed, not buffered).
    #[arg(long, env = "PGBATCH_MAX_IMPORT_BYTES", default_value_t = 1 << 30)]
    pub max_import_bytes: usize,
    /// Most paths in one `POST .../objects/stat`.
    #[arg(long, env = "PGBATCH_MAX_STAT_PATHS", default_value_t = 1000)]
    pub max_stat_paths: usize,
    /// Largest accepted request body, in bytes.
    #[arg(long, env = "PGBATCH_MAX_BODY_BYTES", default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// With `--read-path cached`: most entries per cache.
    #[arg(long, env = "PGBATCH_CACHE_CAPACITY", default_value_t = 100_000)]
    pub cache_capacity: u64,
    /// With `--read-path cached`: how long a value is served from the cache.
    #[arg(long, env = "PGBATCH_CACHE_TTL_MS", default_value_t = 20_000)]
    pub cache_ttl_ms: u64,
    /// Up to this much is added to each cached value's TTL.
    #[arg(long, env = "PGBATCH_CACHE_JITTER_MS", default_value_t = 3_000)]
    pub cache_jitter_ms: u64,
    /// How long "not found" is cached (0: not cached).
    #[arg(long, env = "PGBATCH_CACHE_NEGATIVE_TTL_MS", default_value_t = 0)]
    pub cache_negative_ttl_ms: u64,
    /// Cache resolved tokens (`off`: look every token up, for comparison).
    #[arg(long, env = "PGBATCH_AUTH_CACHE", value_enum, default_value_t = OnOff::On)]
    pub auth_cache: OnOff,
    /// Tokens held in the auth cache.
    #[arg(long, env = "PGBATCH_AUTH_CACHE_CAPACITY", default_value_t = 1_024)]
    pub auth_cache_capacity: u64,
    /// How long a resolved token is trusted before it is looked up again.
    #[arg(long, env = "PGBATCH_AUTH_CACHE_TTL_MS", default_value_t = 20_000)]
    pub auth_cache_ttl_ms: u64,
    /// Up to this much is added to each token's TTL.
    #[arg(long, env = "PGBATCH_AUTH_CACHE_JITTER_MS", default_value_t = 3_000)]
    pub auth_cache_jitter_ms: u64,
    /// Admin token to create on first start instead of a random one (and
    /// to accept as an admin token afterwards).
    #[arg(long, env = "PGBATCH_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
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

    /// The read cache's settings, when the read path is `cached`.
    pub fn read_cache(&self) -> Option<CacheSettings> {
        (self.read_path == ReadPathKind::Cached).then(|| CacheSettings {
            capacity: self.cache_capacity,
            ttl: Duration::from_millis(self.cache_ttl_ms),
            jitter: Duration::from_millis(self.cache_jitter_ms),
            negative_ttl: (self.cache_negative_ttl_ms > 0)
                .then(|| Duration::from_millis(self.cache_negative_ttl_ms)),
        })
    }

    /// The auth cache's settings, unless it is off.
    pub fn auth_cache(&self) -> Option<crate::auth::AuthCacheConfig> {
        (self.auth_cache == OnOff::On).then(|| crate::auth::AuthCacheConfig {
            capacity: self.auth_cache_capacity,
            ttl: Duration::from_millis(self.auth_cache_ttl_ms),
            jitter: Duration::from_millis(self.auth_cache_jitter_ms),
        })
    }
}

/// Settings of the read caches.
#[derive(Debug, Clone, Copy)]
pub struct CacheSettings {
    /// Most entries per cache.
    pub capacity: u64,
    /// Lifetime of a cached value, before jitter.
    pub ttl: Duration,
    /// Up to this much is added to each lifetime.
    pub jitter: Duration,
    /// Lifetime of a cached "not found", if cached at all.
    pub negative_ttl: Option<Duration>,
}

impl CacheSettings {
    /// A cache builder with these settings.
    pub fn builder<K, V>(&self, name: &str) -> batcher::cache::CacheBuilder<K, V>
    where
        K: Clone + Eq + std::hash::Hash + Send + Sync + 'static,
        V: Clone + Send + Sync + 'static,
    {
        let b = batcher::cache::Cache::builder()
            .name(name)
            .max_capacity(self.capacity)
            .time_to_live(self.ttl)
            .jitter(self.jitter);
        match self.negative_ttl {
            Some(ttl) => b.negative_ttl(ttl),
            None => b,
        }
    }
}
