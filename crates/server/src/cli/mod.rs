//! Command line and environment configuration, with clap: the only module
//! besides `main` that knows the flags. [`ServeArgs::settings`] and
//! [`DbArgs::settings`] turn them into the typed [`settings`](crate::settings)
//! the rest of the service takes.
//!
//! Every flag has an environment fallback (`PGBATCH_*`, and `DATABASE_URL`),
//! so the same binary is configured the same way in a shell, a container or
//! a service manager. Defaults are the settings' own constants.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use pgbatch::defaults as lib;

use crate::db::tls::SslMode;
use crate::settings::{
    defaults, AuthSettings, BatchSettings, CacheSettings, DbSettings, ImportSettings,
    InvalidationSettings, Limits, Pooler, ReadPath, ReadSettings, ReplicaSettings, Settings,
    TlsOverrides, WriteSettings,
};

fn parse_sslmode(name: &str) -> Result<SslMode, String> {
    SslMode::parse(name).map_err(|e| e.to_string())
}

/// A token's lifetime: a positive whole number with `s`, `m`, `h` or `d`
/// (`90d`, `12h`), up to 100 years.
///
/// # Errors
///
/// A message naming the accepted form.
pub fn parse_expiry(text: &str) -> Result<Duration, String> {
    const UNITS: [(&str, u64); 4] = [
        ("s", 1_000),
        ("m", 60_000),
        ("h", 3_600_000),
        ("d", 86_400_000),
    ];
    let range = 1_000..=100 * 365 * 86_400_000;
    parse_duration(text, &UNITS, "30m, 12h or 90d (s, m, h or d)", range)
        .map_err(|e| e.unwrap_or_else(|| format!("`{text}`: a token lifetime is 1 s to 100 years")))
}

/// A replica lag bound: a whole number with `ms`, `s` or `m` (`500ms`,
/// `5s`), from 1 ms to 1 hour.
///
/// # Errors
///
/// A message naming the accepted form.
pub fn parse_lag(text: &str) -> Result<Duration, String> {
    const UNITS: [(&str, u64); 3] = [("ms", 1), ("s", 1_000), ("m", 60_000)];
    parse_duration(text, &UNITS, "500ms, 5s or 2m (ms, s or m)", 1..=3_600_000).map_err(|e| {
        e.unwrap_or_else(|| format!("`{text}`: a replica lag bound is 1 ms to 1 hour"))
    })
}

/// A whole number followed by one of `units` (each with its length in
/// milliseconds), within `range` milliseconds. Hand-written: the flags
/// take a few units in one form, and a parser crate (humantime) would
/// accept far more forms than docs/configuration.md documents.
///
/// # Errors
///
/// `Some(message)` naming the accepted `forms` when the text is not of
/// that shape; `None` when it is but lies outside `range`.
fn parse_duration(
    text: &str,
    units: &[(&str, u64)],
    forms: &str,
    range: std::ops::RangeInclusive<u64>,
) -> Result<Duration, Option<String>> {
    let bad = || Some(format!("`{text}` is not a duration such as {forms}"));
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let (_, unit_ms) = units.iter().find(|(u, _)| *u == unit).ok_or_else(bad)?;
    let ms = n
        .checked_mul(*unit_ms)
        .filter(|ms| range.contains(ms))
        .ok_or(None)?;
    Ok(Duration::from_millis(ms))
}

/// `d` in whole milliseconds, for a flag's default.
const fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// The object-metadata service.
///
/// `serve` is the default command, so its flags are also accepted without
/// it (`pgbatch-server --listen ...`), as before it owned them.
#[derive(Debug, Parser)]
#[command(
    name = "pgbatch-server",
    version,
    about,
    long_about = None,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// What to do; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Where the data lives.
    #[command(flatten)]
    pub db: DbArgs,
    /// Serving options, when no command is named.
    #[command(flatten)]
    pub serve: ServeArgs,
    /// How log lines are written, to standard error: `text` (coloured only
    /// on a terminal, and never with `NO_COLOR` set) or `json`, one object
    /// per line. Verbosity follows `RUST_LOG` (default `info`).
    #[arg(long, global = true, env = "PGBATCH_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// The format of log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply migrations, seed demo data if the tables are empty, and serve
    /// HTTP (the default).
    Serve(Box<ServeArgs>),
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
    /// List users and their grants.
    List,
    /// Delete a user with their tokens and grants.
    Delete {
        /// The user's name.
        name: String,
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
        /// Make it stop working this long from now: a number with `s`,
        /// `m`, `h` or `d` (`90d`, `12h`). Without it, it never expires.
        #[arg(long, value_name = "DURATION", value_parser = parse_expiry)]
        expires_in: Option<Duration>,
    },
    /// List tokens (ids, users, descriptions; never the tokens).
    List {
        /// Only this user's.
        #[arg(long)]
        user: Option<String>,
    },
    /// Revoke a token by the id `token list` shows. Running servers stop
    /// accepting it when the database's change notification reaches them
    /// (milliseconds).
    Revoke {
        /// The token's id (16 hex digits).
        id: String,
    },
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

/// `--pooler`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PoolerArg {
    /// Found out at start.
    Auto,
    /// A direct connection.
    None,
    /// A session-mode pooler.
    Session,
    /// A transaction-mode pooler.
    Transaction,
}

impl From<PoolerArg> for Pooler {
    fn from(arg: PoolerArg) -> Self {
        match arg {
            PoolerArg::Auto => Self::Auto,
            PoolerArg::None => Self::None,
            PoolerArg::Session => Self::Session,
            PoolerArg::Transaction => Self::Transaction,
        }
    }
}

/// How lookups reach Postgres, as a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReadPathArg {
    /// One statement per lookup, through the pool.
    Naive,
    /// Concurrent lookups coalesced by the batcher into one statement.
    Batched,
    /// A coalescing TTL cache in front of the batched path.
    Cached,
}

impl From<ReadPathArg> for ReadPath {
    fn from(arg: ReadPathArg) -> Self {
        match arg {
            ReadPathArg::Naive => Self::Naive,
            ReadPathArg::Batched => Self::Batched,
            ReadPathArg::Cached => Self::Cached,
        }
    }
}

impl From<ReadPath> for ReadPathArg {
    fn from(path: ReadPath) -> Self {
        match path {
            ReadPath::Naive => Self::Naive,
            ReadPath::Batched => Self::Batched,
            ReadPath::Cached => Self::Cached,
        }
    }
}

/// Which loaded values a cache stores, as a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AdmissionArg {
    /// Every loaded value.
    Always,
    /// A key's value from its second miss within a window on.
    SecondMiss,
}

impl From<AdmissionArg> for pgbatch::cache::Admission {
    fn from(arg: AdmissionArg) -> Self {
        match arg {
            AdmissionArg::Always => Self::Always,
            AdmissionArg::SecondMiss => Self::SecondMiss,
        }
    }
}

/// Whether a cache is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    /// Used.
    On,
    /// Not used.
    Off,
}

impl From<bool> for OnOff {
    fn from(on: bool) -> Self {
        if on {
            Self::On
        } else {
            Self::Off
        }
    }
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

impl From<PolicyArg> for pgbatch::FlushPolicy {
    fn from(arg: PolicyArg) -> Self {
        match arg {
            PolicyArg::Eager => Self::Eager,
            PolicyArg::FixedDelay => Self::FixedDelay,
            PolicyArg::Adaptive => Self::Adaptive,
        }
    }
}

impl PolicyArg {
    /// The flag value for `policy`, if it has one.
    pub fn of(policy: pgbatch::FlushPolicy) -> Option<Self> {
        Self::value_variants()
            .iter()
            .copied()
            .find(|arg| pgbatch::FlushPolicy::from(*arg) == policy)
    }
}

/// `--batch-concurrency`: `auto`, or a fixed number of statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConcurrencyArg(pub pgbatch::Concurrency);

impl FromStr for ConcurrencyArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(Self(defaults::READ_CONCURRENCY));
        }
        match s.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Self(pgbatch::Concurrency::Fixed(n))),
            _ => Err(format!(
                "`{s}` is neither `auto` nor a number of statements (1 or more)"
            )),
        }
    }
}

impl fmt::Display for ConcurrencyArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            pgbatch::Concurrency::Fixed(n) => write!(f, "{n}"),
            _ => f.write_str("auto"),
        }
    }
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
    /// Batch flush policy. Adaptive by default: as fast as eager for a lone
    /// request, and it formed larger batches and read the most under a
    /// saturating load (BENCHMARKS.md §5).
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
    #[arg(long, env = "PGBATCH_HEADER_READ_TIMEOUT_MS", default_value_t = ms(crate::http::serve::DEFAULT_HEADER_READ_TIMEOUT), help_heading = "HTTP edge")]
    pub header_read_timeout_ms: u64,
    /// Largest request head (request line and headers), in bytes; a
    /// larger one gets 431.
    #[arg(long, env = "PGBATCH_MAX_HEADER_BYTES", default_value_t = crate::http::serve::DEFAULT_MAX_HEADER_BYTES, help_heading = "HTTP edge")]
    pub max_header_bytes: usize,
    /// Most client connections open at once; more get 503 and are closed
    /// at once. Keep it below the open-files limit, less what the database
    /// pool needs.
    #[arg(long, env = "PGBATCH_MAX_CONNECTIONS", default_value_t = crate::http::serve::DEFAULT_MAX_CONNECTIONS, help_heading = "HTTP edge")]
    pub max_connections: usize,
    /// On SIGINT or SIGTERM, how long in-flight requests may take to
    /// finish, in milliseconds, before their connections are dropped.
    #[arg(long, env = "PGBATCH_SHUTDOWN_GRACE_MS", default_value_t = ms(crate::http::serve::DEFAULT_SHUTDOWN_GRACE), help_heading = "HTTP edge")]
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

/// Demo rows seeded on start, and by `seed`, into empty tables.
const SEED_ROWS: u64 = 1_000_000;

impl ServeArgs {
    /// The demo rows to seed on start, (objects, `random_read_test` rows):
    /// on the embedded cluster the defaults unless given; on an external
    /// database none unless asked for (`--seed-demo`, or a count given).
    pub fn seed_rows(&self, embedded: bool) -> (u64, u64) {
        let default = if embedded || self.seed_demo {
            SEED_ROWS
        } else {
            0
        };
        (
            self.seed_objects.unwrap_or(default),
            self.seed_kv_rows.unwrap_or(default),
        )
    }

    /// Whether to create the admin user on first start: always on the
    /// embedded cluster; on an external database only when asked
    /// (`--bootstrap-admin`, or an `--admin-token` given).
    pub fn creates_admin(&self, embedded: bool) -> bool {
        embedded || self.bootstrap_admin || self.admin_token.is_some()
    }

    /// The typed settings these flags ask for.
    pub fn settings(&self) -> Settings {
        let batch = BatchSettings {
            max_batch_size: self.batch_size,
            policy: self.batch_policy.into(),
            max_delay: Duration::from_micros(self.batch_delay_us),
            concurrency: self.batch_concurrency.0,
            queue_capacity: self.queue_capacity,
        };
        Settings {
            read: ReadSettings {
                path: self.read_path.into(),
                batch,
                timeout: Duration::from_millis(self.request_timeout_ms),
                admission_wait: Duration::from_millis(self.admission_wait_ms),
                cache: CacheSettings {
                    capacity: self.cache_capacity,
                    ttl: Duration::from_millis(self.cache_ttl_ms),
                    jitter: Duration::from_millis(self.cache_jitter_ms),
                    negative_ttl: (self.cache_negative_ttl_ms > 0)
                        .then(|| Duration::from_millis(self.cache_negative_ttl_ms)),
                    admission: self.cache_admission.into(),
                },
            },
            write: WriteSettings {
                batch: BatchSettings {
                    max_batch_size: self.write_batch_size,
                    concurrency: pgbatch::Concurrency::Fixed(self.write_concurrency),
                    ..batch
                },
                timeout: Duration::from_millis(self.write_timeout_ms),
            },
            import: ImportSettings {
                max_bytes: self.max_import_bytes,
                concurrency: self.import_concurrency,
                idle_timeout: Duration::from_millis(self.import_idle_timeout_ms),
                timeout: Duration::from_millis(self.import_timeout_ms),
            },
            auth: AuthSettings {
                cache: (self.auth_cache == OnOff::On).then(|| CacheSettings {
                    capacity: self.auth_cache_capacity,
                    ttl: Duration::from_millis(self.auth_cache_ttl_ms),
                    jitter: Duration::from_millis(self.auth_cache_jitter_ms),
                    negative_ttl: None,
                    // Few, hot keys: each is worth storing at once.
                    admission: pgbatch::cache::Admission::Always,
                }),
            },
            limits: Limits {
                max_stat_paths: self.max_stat_paths,
                max_body_bytes: self.max_body_bytes,
                body_idle_timeout: Duration::from_millis(self.body_idle_timeout_ms),
                body_timeout: Duration::from_millis(self.body_timeout_ms),
            },
            invalidation: InvalidationSettings::default(),
            replicas: ReplicaSettings {
                max_lag: self.max_replica_lag,
                ..ReplicaSettings::default()
            },
        }
    }
}

impl DbArgs {
    /// The typed settings these flags ask for.
    pub fn settings(&self) -> DbSettings {
        DbSettings {
            url: self.database_url.clone(),
            data_dir: self.data_dir.clone(),
            pool_size: self.pool_size,
            tls: TlsOverrides {
                mode: self.sslmode,
                root_cert: self.sslrootcert.clone(),
            },
            replica_urls: self.replica_urls.clone(),
            pooler: self.pooler.into(),
            direct_url: self.direct_url.clone(),
        }
    }
}

impl ServeArgs {
    /// The limits on clients these flags ask for.
    pub fn edge(&self) -> crate::http::serve::EdgeSettings {
        crate::http::serve::EdgeSettings {
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            max_header_bytes: self.max_header_bytes,
            max_connections: self.max_connections,
            shutdown_grace: Duration::from_millis(self.shutdown_grace_ms),
            ..crate::http::serve::EdgeSettings::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgbatch::cache::Admission;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("server").chain(args.iter().copied()))
            .expect("valid flags")
    }

    #[test]
    fn replica_flags_parse_and_default_to_the_settings_default() {
        let cli = parse(&[]);
        assert_eq!(
            cli.serve.settings().replicas.max_lag,
            defaults::MAX_REPLICA_LAG
        );
        assert!(cli.db.settings().replica_urls.is_empty());
        let cli = parse(&[
            "--replica-url",
            "postgres://r1/x",
            "--replica-url",
            "postgres://r2/x",
            "--max-replica-lag",
            "250ms",
        ]);
        assert_eq!(cli.db.settings().replica_urls.len(), 2);
        let replicas = cli.serve.settings().replicas;
        assert_eq!(replicas.max_lag, Duration::from_millis(250));
        assert_eq!(parse_lag("2m"), Ok(Duration::from_secs(120)));
        for bad in ["", "5", "0s", "5h", "ms", "-1s", "2h"] {
            assert!(parse_lag(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_external_database_gets_demo_data_and_an_admin_only_when_asked() {
        let quiet = parse(&["--database-url", "postgres://db/x"]);
        assert_eq!(quiet.serve.seed_rows(false), (0, 0));
        assert!(!quiet.serve.creates_admin(false));
        assert_eq!(quiet.serve.seed_rows(true), (SEED_ROWS, SEED_ROWS));
        assert!(quiet.serve.creates_admin(true));
        let asked = parse(&["--seed-demo", "--bootstrap-admin"]);
        assert_eq!(asked.serve.seed_rows(false), (SEED_ROWS, SEED_ROWS));
        assert!(asked.serve.creates_admin(false));
        let counts = parse(&["--seed-objects", "5", "--admin-token", "t"]);
        assert_eq!(counts.serve.seed_rows(false), (5, 0));
        assert!(counts.serve.creates_admin(false));
        let none = parse(&["--seed-objects", "0", "--seed-kv-rows", "0"]);
        assert_eq!(none.serve.seed_rows(true), (0, 0));
    }

    #[test]
    fn serve_owns_its_flags_and_they_still_work_without_it() {
        let cli = parse(&[
            "serve",
            "--listen",
            "127.0.0.1:9001",
            "--read-path",
            "naive",
        ]);
        let Some(Command::Serve(args)) = &cli.command else {
            panic!("serve: {:?}", cli.command);
        };
        assert_eq!(args.listen.to_string(), "127.0.0.1:9001");
        assert_eq!(args.settings().read.path, ReadPath::Naive);
        let cli = parse(&["--listen", "127.0.0.1:9002"]);
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.listen.to_string(), "127.0.0.1:9002");
        // The database flags are global; serving flags are not the token
        // command's.
        let cli = parse(&["token", "create", "alice", "--data-dir", "/tmp/x"]);
        assert_eq!(cli.db.data_dir, PathBuf::from("/tmp/x"));
        let err = Cli::try_parse_from(["server", "token", "create", "alice", "--listen", "x"])
            .unwrap_err();
        assert!(err.to_string().contains("--listen"), "{err}");
        let help = Cli::try_parse_from(["server", "serve", "--help"])
            .unwrap_err()
            .to_string();
        for heading in ["Reads:", "Imports:", "HTTP edge:", "--listen"] {
            assert!(
                help.contains(heading),
                "serve --help lacks {heading}:\n{help}"
            );
        }
    }

    /// One test, because it changes the process's environment: the flags'
    /// defaults are the settings' defaults, and flags and environment
    /// variables reach the fields they name.
    #[test]
    fn flags_and_environment_map_to_settings() {
        for (name, _) in std::env::vars() {
            if name.starts_with("PGBATCH_") {
                std::env::remove_var(name);
            }
        }
        let cli = parse(&[]);
        assert_eq!(cli.serve.settings(), Settings::default());
        assert_eq!(
            DbSettings {
                url: None,
                ..cli.db.settings()
            },
            DbSettings::default()
        );
        assert_eq!(cli.serve.seed_rows(true), (SEED_ROWS, SEED_ROWS));

        let cli = parse(&[
            "--read-path",
            "cached",
            "--batch-size",
            "7",
            "--batch-policy",
            "fixed-delay",
            "--batch-delay-us",
            "250",
            "--batch-concurrency",
            "3",
            "--queue-capacity",
            "9",
            "--request-timeout-ms",
            "1500",
            "--cache-negative-ttl-ms",
            "40",
            "--auth-cache",
            "off",
            "--write-batch-size",
            "11",
            "--write-concurrency",
            "2",
            "--write-timeout-ms",
            "700",
            "--max-import-bytes",
            "2000",
            "--max-stat-paths",
            "5",
            "--max-body-bytes",
            "4096",
            "--pool-size",
            "6",
        ]);
        let s = cli.serve.settings();
        let batch = BatchSettings {
            max_batch_size: 7,
            policy: pgbatch::FlushPolicy::FixedDelay,
            max_delay: Duration::from_micros(250),
            concurrency: pgbatch::Concurrency::Fixed(3),
            queue_capacity: 9,
        };
        assert_eq!(s.read.path, ReadPath::Cached);
        assert_eq!(s.read.batch, batch);
        assert_eq!(s.read.timeout, Duration::from_millis(1500));
        assert_eq!(s.read.cache.negative_ttl, Some(Duration::from_millis(40)));
        assert_eq!(s.read.cache.admission, Admission::SecondMiss);
        assert_eq!(s.auth.cache, None);
        // The writer batches with its own size and concurrency, and the
        // shared policy, delay and queue.
        assert_eq!(
            s.write.batch,
            BatchSettings {
                max_batch_size: 11,
                concurrency: pgbatch::Concurrency::Fixed(2),
                ..batch
            }
        );
        assert_eq!(s.write.timeout, Duration::from_millis(700));
        assert_eq!(s.import.max_bytes, 2000);
        assert_eq!(
            s.limits,
            Limits {
                max_stat_paths: 5,
                max_body_bytes: 4096,
                ..Limits::default()
            }
        );
        assert_eq!(cli.db.settings().pool_size, 6);

        std::env::set_var("PGBATCH_CACHE_TTL_MS", "1234");
        std::env::set_var("PGBATCH_AUTH_CACHE_JITTER_MS", "0");
        std::env::set_var("PGBATCH_READ_PATH", "naive");
        std::env::set_var("PGBATCH_CACHE_ADMISSION", "always");
        let s = parse(&[]).serve.settings();
        std::env::remove_var("PGBATCH_CACHE_TTL_MS");
        std::env::remove_var("PGBATCH_AUTH_CACHE_JITTER_MS");
        std::env::remove_var("PGBATCH_READ_PATH");
        std::env::remove_var("PGBATCH_CACHE_ADMISSION");
        assert_eq!(s.read.cache.ttl, Duration::from_millis(1234));
        assert_eq!(s.read.cache.admission, Admission::Always);
        // The token cache's keys are few and hot: always stored.
        assert_eq!(s.auth.cache.map(|c| c.admission), Some(Admission::Always));
        assert_eq!(s.auth.cache.map(|c| c.jitter), Some(Duration::ZERO));
        assert_eq!(s.read.path, ReadPath::Naive);
    }

    #[test]
    fn batch_concurrency_is_auto_or_a_number() {
        assert_eq!(
            parse(&[]).serve.settings().read.batch.concurrency,
            defaults::READ_CONCURRENCY
        );
        for auto in ["auto", "AUTO"] {
            let s = parse(&["--batch-concurrency", auto]).serve.settings();
            assert!(s.read.batch.concurrency.is_auto());
        }
        for bad in ["0", "1.5", "many", ""] {
            let err = Cli::try_parse_from(["pgbatch-server", "--batch-concurrency", bad])
                .expect_err(bad)
                .to_string();
            assert!(err.contains("neither `auto` nor a number"), "{bad}: {err}");
        }
        assert_eq!(
            ConcurrencyArg(defaults::READ_CONCURRENCY).to_string(),
            "auto"
        );
    }

    #[test]
    fn every_policy_has_a_flag() {
        for policy in [
            pgbatch::FlushPolicy::Eager,
            pgbatch::FlushPolicy::FixedDelay,
            pgbatch::FlushPolicy::Adaptive,
        ] {
            assert_eq!(
                PolicyArg::of(policy).map(pgbatch::FlushPolicy::from),
                Some(policy)
            );
        }
    }
}
