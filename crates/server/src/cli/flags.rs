//! The options of `serve`, `seed` and the database, as clap sees them:
//! each flag with its environment fallback and its default.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use pgbatch::defaults as lib;

use crate::settings::{defaults, AuthSettings, ReadPath, SslMode};

use super::values::{
    parse_lag, parse_sslmode, AdmissionArg, ConcurrencyArg, OnOff, PolicyArg, PoolerArg,
    ReadPathArg,
};
use crate::settings::defaults::SEED_ROWS;

/// `d` in whole milliseconds, for a flag's default.
const fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// Which database to use.
#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    /// A Postgres connection string. Without it, a private Postgres cluster
    /// is started in `--data-dir`.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,
    /// TLS to the database (libpq's `sslmode`): `disable`, `prefer`,
    /// `require`, `verify-ca` or `verify-full`. Wins over the URL's.
    #[arg(long, env = "PGBATCH_SSLMODE", global = true, value_parser = parse_sslmode)]
    pub sslmode: Option<SslMode>,
    /// A PEM file of the CAs that sign the database's certificate (libpq's
    /// `sslrootcert`), instead of the system's. Wins over the URL's.
    #[arg(long, env = "PGBATCH_SSLROOTCERT", global = true)]
    pub sslrootcert: Option<PathBuf>,
    /// A read replica of the database (repeatable; the environment
    /// variable takes a comma-separated list): reads go to replicas that
    /// keep up, writes and the invalidation listener to the primary. The
    /// TLS flags apply to replicas too.
    #[arg(
        long = "replica-url",
        env = "PGBATCH_REPLICA_URLS",
        value_delimiter = ',',
        global = true,
        hide_env_values = true
    )]
    pub replica_urls: Vec<String>,
    /// What stands between the service and `--database-url`'s database:
    /// `none` (a direct connection), `session` or `transaction` (a pooler in
    /// that mode: PgBouncer, Supavisor, Neon's or RDS Proxy's endpoint), or
    /// `auto`: found out at start. Behind a transaction-mode pooler
    /// statements are unnamed, statement timeouts are set per transaction,
    /// and the cross-instance listener needs `--direct-url`.
    #[arg(long, env = "PGBATCH_POOLER", value_enum, default_value_t = PoolerArg::Auto, global = true)]
    pub pooler: PoolerArg,
    /// A direct connection string to the same database, for what needs a
    /// session: migrations, the admin commands and the listener that keeps
    /// caches coherent across instances. Use it when `--database-url` goes
    /// through a pooler (Prisma calls it `directUrl`; Supabase and Neon hand
    /// out both). The TLS flags apply to it too.
    #[arg(
        long,
        env = "PGBATCH_DIRECT_URL",
        global = true,
        hide_env_values = true
    )]
    pub direct_url: Option<String>,
    /// Directory of the embedded cluster (created on first start, kept
    /// across restarts; used without `--database-url`).
    #[arg(
        long,
        env = "PGBATCH_DATA_DIR",
        default_value = defaults::DATA_DIR,
        global = true
    )]
    pub data_dir: PathBuf,
    /// Database connections in the pool.
    #[arg(long, env = "PGBATCH_POOL_SIZE", default_value_t = defaults::POOL_SIZE, global = true)]
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

/// Serving options.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(
        long,
        env = "PGBATCH_LISTEN",
        default_value = "127.0.0.1:8080",
        help_heading = "Serving"
    )]
    pub listen: SocketAddr,
    /// How reads reach Postgres.
    #[arg(long, env = "PGBATCH_READ_PATH", value_enum, default_value_t = ReadPath::default().into(), help_heading = "Reads")]
    pub read_path: ReadPathArg,
    /// Most keys per batched statement.
    #[arg(long, env = "PGBATCH_BATCH_SIZE", default_value_t = lib::MAX_BATCH_SIZE, help_heading = "Reads")]
    pub batch_size: usize,
    /// Batch flush policy. Eager by default: with the automatic
    /// concurrency limit, the limit alone decides how big batches grow
    /// (see `settings::defaults::BATCH_POLICY`).
    #[arg(long, env = "PGBATCH_BATCH_POLICY", value_enum, default_value_t = PolicyArg::of(defaults::BATCH_POLICY).expect("every policy has a flag"), help_heading = "Reads")]
    pub batch_policy: PolicyArg,
    /// With `fixed-delay`: flush this many microseconds after a batch's
    /// first key.
    #[arg(long, env = "PGBATCH_BATCH_DELAY_US", default_value_t = lib::MAX_DELAY.as_micros() as u64, help_heading = "Reads")]
    pub batch_delay_us: u64,
    /// Batched statements running at once, per lookup kind: `auto` (found
    /// by measurement and kept adapting, never more than `--pool-size`), or
    /// a fixed number.
    #[arg(long, env = "PGBATCH_BATCH_CONCURRENCY", default_value_t = ConcurrencyArg(defaults::READ_CONCURRENCY), help_heading = "Reads")]
    pub batch_concurrency: ConcurrencyArg,
    /// Requests that may wait for the batcher before new ones get 503.
    #[arg(long, env = "PGBATCH_QUEUE_CAPACITY", default_value_t = lib::CHANNEL_CAPACITY, help_heading = "Reads")]
    pub queue_capacity: usize,
    /// Deadline of one lookup, in milliseconds; past it the request gets 504.
    #[arg(long, env = "PGBATCH_REQUEST_TIMEOUT_MS", default_value_t = ms(defaults::REQUEST_TIMEOUT), help_heading = "Reads")]
    pub request_timeout_ms: u64,
    /// Longest wait, in milliseconds, for room among a lookup kind's keys
    /// in flight (`--queue-capacity`) before a request gets 503.
    #[arg(long, env = "PGBATCH_ADMISSION_WAIT_MS", default_value_t = ms(defaults::ADMISSION_WAIT), help_heading = "Reads")]
    pub admission_wait_ms: u64,
    /// Read replicas (`--replica-url`) lagging more than this (`500ms`,
    /// `5s`, `1m`) are skipped until they catch up; with none usable,
    /// reads go to the primary.
    #[arg(long, env = "PGBATCH_MAX_REPLICA_LAG", value_parser = parse_lag, default_value = "5s", help_heading = "Replicas")]
    pub max_replica_lag: Duration,
    /// Most object writes committed in one statement.
    #[arg(long, env = "PGBATCH_WRITE_BATCH_SIZE", default_value_t = defaults::WRITE_BATCH_SIZE, help_heading = "Writes")]
    pub write_batch_size: usize,
    /// Write statements running at once.
    #[arg(long, env = "PGBATCH_WRITE_CONCURRENCY", default_value_t = defaults::WRITE_CONCURRENCY, help_heading = "Writes")]
    pub write_concurrency: usize,
    /// Deadline of one write, in milliseconds (it may still commit after).
    #[arg(long, env = "PGBATCH_WRITE_TIMEOUT_MS", default_value_t = ms(defaults::WRITE_TIMEOUT), help_heading = "Writes")]
    pub write_timeout_ms: u64,
    /// Largest accepted import body, in bytes (streamed, not buffered).
    #[arg(long, env = "PGBATCH_MAX_IMPORT_BYTES", default_value_t = defaults::MAX_IMPORT_BYTES, help_heading = "Imports")]
    pub max_import_bytes: usize,
    /// Imports running at once, on connections of their own (never the
    /// read pool's); more get 503 at once.
    #[arg(long, env = "PGBATCH_IMPORT_CONCURRENCY", default_value_t = defaults::IMPORT_CONCURRENCY, help_heading = "Imports")]
    pub import_concurrency: usize,
    /// Longest pause between two chunks of an import body, in
    /// milliseconds; past it the import is abandoned with 408.
    #[arg(long, env = "PGBATCH_IMPORT_IDLE_TIMEOUT_MS", default_value_t = ms(defaults::IMPORT_IDLE_TIMEOUT), help_heading = "Imports")]
    pub import_idle_timeout_ms: u64,
    /// Deadline of a whole import (upload included), in milliseconds; also
    /// the import connections' statement_timeout.
    #[arg(long, env = "PGBATCH_IMPORT_TIMEOUT_MS", default_value_t = ms(defaults::IMPORT_TIMEOUT), help_heading = "Imports")]
    pub import_timeout_ms: u64,
    /// Most paths in one `POST .../objects/stat`.
    #[arg(long, env = "PGBATCH_MAX_STAT_PATHS", default_value_t = defaults::MAX_STAT_PATHS, help_heading = "Request limits")]
    pub max_stat_paths: usize,
    /// Largest accepted request body, in bytes.
    #[arg(long, env = "PGBATCH_MAX_BODY_BYTES", default_value_t = defaults::MAX_BODY_BYTES, help_heading = "Request limits")]
    pub max_body_bytes: usize,
    /// Longest pause, in milliseconds, between two chunks of a request
    /// body (imports: `--import-idle-timeout-ms`); past it, 408. A
    /// request's deadline starts once its body has arrived.
    #[arg(long, env = "PGBATCH_BODY_IDLE_TIMEOUT_MS", default_value_t = ms(defaults::BODY_IDLE_TIMEOUT), help_heading = "Request limits")]
    pub body_idle_timeout_ms: u64,
    /// Longest time, in milliseconds, for a whole request body to arrive
    /// (imports: `--import-timeout-ms`); past it, 408.
    #[arg(long, env = "PGBATCH_BODY_TIMEOUT_MS", default_value_t = ms(defaults::BODY_TIMEOUT), help_heading = "Request limits")]
    pub body_timeout_ms: u64,
    /// With `--read-path cached`: most entries per cache.
    #[arg(long, env = "PGBATCH_CACHE_CAPACITY", default_value_t = defaults::CACHE_CAPACITY, help_heading = "Caches")]
    pub cache_capacity: u64,
    /// With `--read-path cached`: how long a value is served from the cache.
    #[arg(long, env = "PGBATCH_CACHE_TTL_MS", default_value_t = ms(defaults::CACHE_TTL), help_heading = "Caches")]
    pub cache_ttl_ms: u64,
    /// Up to this much is added to each cached value's TTL.
    #[arg(long, env = "PGBATCH_CACHE_JITTER_MS", default_value_t = ms(defaults::CACHE_JITTER), help_heading = "Caches")]
    pub cache_jitter_ms: u64,
    /// How long "not found" is cached (0: not cached).
    #[arg(
        long,
        env = "PGBATCH_CACHE_NEGATIVE_TTL_MS",
        default_value_t = 0,
        help_heading = "Caches"
    )]
    pub cache_negative_ttl_ms: u64,
    /// Which loaded values the cache stores: `second-miss` (a key's value
    /// from its second miss within a window on; keys read once never
    /// displace the hot ones, nor cost an insert), or `always`.
    #[arg(long, env = "PGBATCH_CACHE_ADMISSION", value_enum, default_value_t = AdmissionArg::SecondMiss, help_heading = "Caches")]
    pub cache_admission: AdmissionArg,
    /// Cache resolved tokens (`off`: look every token up, for comparison).
    #[arg(long, env = "PGBATCH_AUTH_CACHE", value_enum, default_value_t = OnOff::from(AuthSettings::default().cache.is_some()), help_heading = "Authentication")]
    pub auth_cache: OnOff,
    /// Tokens held in the auth cache.
    #[arg(long, env = "PGBATCH_AUTH_CACHE_CAPACITY", default_value_t = defaults::AUTH_CACHE_CAPACITY, help_heading = "Authentication")]
    pub auth_cache_capacity: u64,
    /// How long a resolved token is trusted before it is looked up again.
    #[arg(long, env = "PGBATCH_AUTH_CACHE_TTL_MS", default_value_t = ms(defaults::CACHE_TTL), help_heading = "Authentication")]
    pub auth_cache_ttl_ms: u64,
    /// Up to this much is added to each token's TTL.
    #[arg(long, env = "PGBATCH_AUTH_CACHE_JITTER_MS", default_value_t = ms(defaults::CACHE_JITTER), help_heading = "Authentication")]
    pub auth_cache_jitter_ms: u64,
    /// Admin token to create on first start instead of a random one (and
    /// to accept as an admin token afterwards). Setting it asks for the
    /// admin on an external database too.
    #[arg(
        long,
        env = "PGBATCH_ADMIN_TOKEN",
        hide_env_values = true,
        help_heading = "Authentication"
    )]
    pub admin_token: Option<String>,
    /// On an external database (`--database-url`), create the user `admin`
    /// with a random token on first start, as the embedded cluster always
    /// does.
    #[arg(long, env = "PGBATCH_BOOTSTRAP_ADMIN", help_heading = "Authentication")]
    pub bootstrap_admin: bool,
    /// Demo objects to seed on start when the objects table is empty (0:
    /// none). Default: 1,000,000 on the embedded cluster; none on an
    /// external database unless `--seed-demo` is given.
    #[arg(long, env = "PGBATCH_SEED_OBJECTS", help_heading = "Demo data")]
    pub seed_objects: Option<u64>,
    /// `random_read_test` rows to seed on start when that table is empty
    /// (0: none). Default as for `--seed-objects`.
    #[arg(long, env = "PGBATCH_SEED_KV_ROWS", help_heading = "Demo data")]
    pub seed_kv_rows: Option<u64>,
    /// On an external database, seed the demo data (1,000,000 rows of each
    /// table, unless the counts are given).
    #[arg(long, env = "PGBATCH_SEED_DEMO", help_heading = "Demo data")]
    pub seed_demo: bool,
    /// Longest wait for a request's head, in milliseconds, from accept or
    /// from the end of the previous response; past it the connection is
    /// closed. So also how long an idle keep-alive connection stays open.
    #[arg(long, env = "PGBATCH_HEADER_READ_TIMEOUT_MS", default_value_t = ms(crate::settings::defaults::HEADER_READ_TIMEOUT), help_heading = "HTTP edge")]
    pub header_read_timeout_ms: u64,
    /// Largest request head (request line and headers), in bytes; a
    /// larger one gets 431.
    #[arg(long, env = "PGBATCH_MAX_HEADER_BYTES", default_value_t = crate::settings::defaults::MAX_HEADER_BYTES, help_heading = "HTTP edge")]
    pub max_header_bytes: usize,
    /// Most client connections open at once; more get 503 and are closed
    /// at once. Keep it below the open-files limit, less what the database
    /// pool needs.
    #[arg(long, env = "PGBATCH_MAX_CONNECTIONS", default_value_t = crate::settings::defaults::MAX_CONNECTIONS, help_heading = "HTTP edge")]
    pub max_connections: usize,
    /// On SIGINT or SIGTERM, how long in-flight requests may take to
    /// finish, in milliseconds, before their connections are dropped.
    #[arg(long, env = "PGBATCH_SHUTDOWN_GRACE_MS", default_value_t = ms(crate::settings::defaults::SHUTDOWN_GRACE), help_heading = "HTTP edge")]
    pub shutdown_grace_ms: u64,
}

/// Options of `seed`.
#[derive(Debug, Clone, Args)]
pub struct SeedArgs {
    /// Demo objects to load into repository `demo`.
    #[arg(long, default_value_t = SEED_ROWS)]
    pub objects: u64,
    /// `random_read_test` rows to load.
    #[arg(long, default_value_t = SEED_ROWS)]
    pub kv_rows: u64,
}
