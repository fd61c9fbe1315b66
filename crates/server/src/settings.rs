//! Typed settings of the service's parts, with defaults.
//!
//! The domain takes these, never the command line: `cli` turns flags and
//! environment variables into them, and tests and benchmarks build them
//! directly (`Settings { read: ReadSettings { path: ReadPath::Cached, ..
//! Default::default() }, ..Default::default() }`).
//!
//! Defaults come from one place: [`pgbatch::defaults`] where the value is
//! the library's, [`defaults`] for the service's own.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use pgbatch::pg::{StatementMode, Statements};
use pgbatch::{Concurrency, FlushPolicy};

/// The service's own defaults (the batcher's are in [`pgbatch::defaults`]).
pub mod defaults {
    use std::time::Duration;

    use pgbatch::{Concurrency, FlushPolicy};

    /// Database connections in the pool.
    pub const POOL_SIZE: usize = 16;
    /// Directory of the embedded cluster.
    pub const DATA_DIR: &str = ".data/pg";
    /// The batchers' flush policy: the library's `Eager`. With the
    /// automatic concurrency limit, the limit alone decides how big batches
    /// grow; adaptive's own rule (wait for a full batch once half the
    /// slots are busy) makes the gain of each added slot flat, which
    /// leaves the limit's search without a slope to climb.
    pub const BATCH_POLICY: FlushPolicy = FlushPolicy::Eager;
    /// Batched read statements at once, per lookup kind: found by
    /// measurement, never more than the read pool's connections (each
    /// lookup bounds it by its pool). The best number moves with the
    /// machine, the data and the round trip (BENCHMARKS.md, "How close to the database's limit").
    pub const READ_CONCURRENCY: Concurrency = Concurrency::Auto { max: usize::MAX };
    /// Deadline of one lookup, also the pool's `statement_timeout`.
    pub const REQUEST_TIMEOUT: Duration = Duration::from_millis(500);
    /// Longest wait for room among a lookup's keys in flight before a
    /// request is refused: a tenth of the request deadline, so an
    /// admitted request keeps most of its time.
    pub const ADMISSION_WAIT: Duration = Duration::from_millis(50);
    /// A read replica lagging more than this is skipped.
    pub const MAX_REPLICA_LAG: Duration = Duration::from_secs(5);
    /// Most entries per read cache.
    pub const CACHE_CAPACITY: u64 = 100_000;
    /// Lifetime of a cached value (and of a resolved token), before jitter.
    pub const CACHE_TTL: Duration = Duration::from_secs(20);
    /// Up to this much is added to each cache entry's lifetime.
    pub const CACHE_JITTER: Duration = Duration::from_secs(3);
    /// Tokens held in the auth cache.
    pub const AUTH_CACHE_CAPACITY: u64 = 1_024;
    /// Most object writes committed in one statement.
    pub const WRITE_BATCH_SIZE: usize = 256;
    /// Write statements running at once.
    pub const WRITE_CONCURRENCY: usize = 4;
    /// Deadline of one write.
    pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
    /// Largest import body, in bytes.
    pub const MAX_IMPORT_BYTES: usize = 1 << 30;
    /// Imports running at once; each holds one connection of the import
    /// pool for its whole upload, never one of the read pool.
    pub const IMPORT_CONCURRENCY: usize = 2;
    /// Longest pause between two chunks of an import's body.
    pub const IMPORT_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
    /// Deadline of a whole import, upload included; also the import
    /// connections' `statement_timeout`, so Postgres gives up with us.
    pub const IMPORT_TIMEOUT: Duration = Duration::from_secs(600);
    /// Most paths in one `POST .../objects/stat`.
    pub const MAX_STAT_PATHS: usize = 1000;
    /// Largest request body, in bytes.
    pub const MAX_BODY_BYTES: usize = 1 << 20;
    /// Longest pause between two chunks of a request body (imports have
    /// their own).
    pub const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
    /// Longest time a whole request body may take to arrive: a megabyte at
    /// about 17 KB/s.
    pub const BODY_TIMEOUT: Duration = Duration::from_secs(60);

    /// Demo rows seeded on start, and by `seed`, into empty tables.
    pub const SEED_ROWS: u64 = 1_000_000;

    /// Default of [`EdgeSettings::header_read_timeout`](super::EdgeSettings::header_read_timeout): long enough for a
    /// client on a slow link to send a few KiB of headers, short enough that a
    /// silent or trickling connection is not held for long.
    pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

    /// Default of [`EdgeSettings::max_header_bytes`](super::EdgeSettings::max_header_bytes): the service's requests
    /// need a token and a path or two; 32 KiB leaves room for long object
    /// paths in the query string.
    pub const MAX_HEADER_BYTES: usize = 32 * 1024;

    /// Default of [`EdgeSettings::max_connections`](super::EdgeSettings::max_connections).
    pub const MAX_CONNECTIONS: usize = 1024;

    /// Default of [`EdgeSettings::shutdown_grace`](super::EdgeSettings::shutdown_grace).
    pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

    /// Default of [`EdgeSettings::drain_bytes`](super::EdgeSettings::drain_bytes): a little over the largest
    /// body the app accepts by default (1 MiB), so any body the app could
    /// have read is drained rather than costing the client its connection.
    pub const DRAIN_BYTES: usize = (1 << 20) + (64 << 10);

    /// Default of [`EdgeSettings::drain_time`](super::EdgeSettings::drain_time).
    pub const DRAIN_TIME: Duration = Duration::from_secs(1);

    /// Default of [`EdgeSettings::linger_time`](super::EdgeSettings::linger_time): enough for a client on a slow
    /// link to read its response and close; nginx waits up to 5 s between
    /// reads (`lingering_timeout`).
    pub const LINGER_TIME: Duration = Duration::from_secs(2);
}

/// Everything the running service is configured with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    /// How lookups reach Postgres.
    pub read: ReadSettings,
    /// How writes reach Postgres.
    pub write: WriteSettings,
    /// How NDJSON imports reach Postgres.
    pub import: ImportSettings,
    /// How tokens are resolved.
    pub auth: AuthSettings,
    /// Request limits.
    pub limits: Limits,
    /// The cross-instance invalidation listener.
    pub invalidation: InvalidationSettings,
    /// Read replicas: the lag bound and how they are polled.
    pub replicas: ReplicaSettings,
}

/// How read replicas are chosen and watched (see [`crate::cluster::replicas`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaSettings {
    /// A replica lagging more than this is skipped.
    pub max_lag: Duration,
    /// How often each replica's replay position (and the primary's WAL
    /// position) is read.
    pub poll_every: Duration,
    /// How long a poll may take before the replica counts as down.
    pub poll_timeout: Duration,
}

impl Default for ReplicaSettings {
    fn default() -> Self {
        Self {
            max_lag: defaults::MAX_REPLICA_LAG,
            poll_every: Duration::from_millis(100),
            poll_timeout: Duration::from_secs(1),
        }
    }
}

/// The cross-instance invalidation listener's timing (see
/// [`crate::service::invalidation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidationSettings {
    /// How often the listener's connection is checked.
    pub ping_every: Duration,
    /// How long a check, a connection attempt (per host) or LISTEN may
    /// take. Whenever no ping has arrived for this long the caches are
    /// bypassed; a connection that died silently is given up within
    /// `ping_every + ping_timeout` (while no ping can be sent, within
    /// `3 * ping_every + ping_timeout`), and the caches are flushed before
    /// they are used again.
    pub ping_timeout: Duration,
    /// The first wait before reconnecting; it doubles up to
    /// `reconnect_max`, and starts over once a connection has lasted
    /// [`STABLE_AFTER`](Self::STABLE_AFTER).
    pub reconnect_min: Duration,
    /// The longest wait before reconnecting.
    pub reconnect_max: Duration,
}

impl InvalidationSettings {
    /// How long a connection must last for the backoff to start over, so a
    /// listener that connects and drops again does not flush every cache
    /// every `reconnect_min`.
    pub const STABLE_AFTER: Duration = Duration::from_secs(10);
}

impl Default for InvalidationSettings {
    fn default() -> Self {
        Self {
            ping_every: Duration::from_secs(1),
            ping_timeout: Duration::from_secs(2),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(5),
        }
    }
}

/// Which database to use.
#[derive(Debug, Clone, PartialEq)]
pub struct DbSettings {
    /// A Postgres connection string; `None` starts the embedded cluster.
    pub url: Option<String>,
    /// Directory of the embedded cluster (used without `url`).
    pub data_dir: PathBuf,
    /// Connections in the service's pool.
    pub pool_size: usize,
    /// TLS settings given apart from the URL, which win over it.
    pub tls: TlsOverrides,
    /// Connection strings of read replicas of `url`'s database (the same
    /// TLS overrides apply); reads go to them, writes never.
    pub replica_urls: Vec<String>,
    /// What stands between the service and `url`'s database.
    pub pooler: Pooler,
    /// A direct connection string to `url`'s database, for what needs a
    /// session (migrations, the invalidation listener) when `url` goes
    /// through a pooler.
    pub direct_url: Option<String>,
}

/// What stands between the service and Postgres (`--pooler`).
///
/// A transaction-mode pooler (the default endpoint of many managed
/// offerings: Supabase's Supavisor, Heroku's and Azure's PgBouncer, Neon's
/// pooled endpoint, RDS Proxy) gives each transaction a possibly different
/// server connection, so nothing of a session carries over: named
/// prepared statements, session settings, `LISTEN`. Behind one, the
/// service sends unnamed statements, sets each kind of work's statement
/// timeout per transaction, and listens for other instances' changes only
/// on a direct connection (`--direct-url`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooler {
    /// Found out at start (see [`crate::db::detect_pooler`]). The default.
    #[default]
    Auto,
    /// No pooler: a direct connection.
    None,
    /// A session-mode pooler: a client keeps one server connection, but
    /// the `options` startup parameter is refused (PgBouncer).
    Session,
    /// A transaction-mode pooler.
    Transaction,
}

impl Pooler {
    /// How statements are sent through this pooler, with `timeout` as the
    /// server-side statement timeout where it cannot be a setting of the
    /// connection (behind any pooler).
    pub fn statements(self, timeout: Duration) -> Statements {
        match self {
            Pooler::Auto | Pooler::None => Statements::default(),
            Pooler::Session => Statements::default().statement_timeout(timeout),
            Pooler::Transaction => Statements::default()
                .mode(StatementMode::Unnamed)
                .statement_timeout(timeout),
        }
    }

    /// Whether a session (`LISTEN`, session settings) survives between
    /// transactions.
    pub fn keeps_sessions(self) -> bool {
        self != Pooler::Transaction
    }
}

/// `sslmode` and `sslrootcert` given as flags (or their environment
/// variables) rather than in `DATABASE_URL`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOverrides {
    /// libpq's `sslmode`.
    pub mode: Option<SslMode>,
    /// A PEM file of the CAs to trust.
    pub root_cert: Option<PathBuf>,
}

impl Default for DbSettings {
    fn default() -> Self {
        Self {
            url: None,
            data_dir: PathBuf::from(defaults::DATA_DIR),
            pool_size: defaults::POOL_SIZE,
            tls: TlsOverrides::default(),
            replica_urls: Vec::new(),
            pooler: Pooler::Auto,
            direct_url: None,
        }
    }
}

/// How lookups reach Postgres.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ReadPath {
    /// One statement per lookup, through the pool.
    Naive,
    /// Concurrent lookups coalesced by a batcher into one statement.
    #[default]
    Batched,
    /// A coalescing TTL cache in front of the batched path.
    Cached,
}

/// Settings of the read path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReadSettings {
    /// Naive, batched or cached.
    pub path: ReadPath,
    /// The batchers (batched and cached paths).
    pub batch: BatchSettings,
    /// Deadline of one lookup.
    pub timeout: Duration,
    /// Longest wait for room among the keys in flight (see
    /// [`Lookup`](crate::domain::lookup::Lookup)'s admission) before 503.
    pub admission_wait: Duration,
    /// The caches (cached path).
    pub cache: CacheSettings,
}

impl Default for ReadSettings {
    fn default() -> Self {
        Self {
            path: ReadPath::default(),
            batch: BatchSettings::default(),
            timeout: defaults::REQUEST_TIMEOUT,
            admission_wait: defaults::ADMISSION_WAIT,
            cache: CacheSettings::default(),
        }
    }
}

/// How a batcher (of lookups or of writes) forms batches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchSettings {
    /// Most keys (or rows) per statement.
    pub max_batch_size: usize,
    /// When a batch that is not full goes out.
    pub policy: FlushPolicy,
    /// With [`FlushPolicy::FixedDelay`] (and a busy adaptive batcher): how
    /// long after its first key a batch goes out.
    pub max_delay: Duration,
    /// Statements running at once: found by measurement
    /// ([`Concurrency::Auto`], the reads' default; a lookup bounds it by its
    /// pool's size), or fixed.
    pub concurrency: Concurrency,
    /// Requests that may wait before new ones are rejected as overload.
    pub queue_capacity: usize,
}

impl Default for BatchSettings {
    fn default() -> Self {
        Self {
            max_batch_size: pgbatch::defaults::MAX_BATCH_SIZE,
            policy: defaults::BATCH_POLICY,
            max_delay: pgbatch::defaults::MAX_DELAY,
            concurrency: defaults::READ_CONCURRENCY,
            queue_capacity: pgbatch::defaults::CHANNEL_CAPACITY,
        }
    }
}

impl BatchSettings {
    /// These settings with the automatic concurrency kept within `loads`
    /// (the connections of the pool the batcher loads from): more loads
    /// than connections would only queue for the pool.
    #[must_use]
    pub fn bounded_by(self, loads: usize) -> Self {
        let concurrency = match self.concurrency {
            Concurrency::Auto { max } => Concurrency::Auto {
                max: max.min(loads).max(1),
            },
            fixed => fixed,
        };
        Self {
            concurrency,
            ..self
        }
    }

    /// A batcher builder named `name` with these settings, giving each
    /// request `timeout`.
    pub fn builder<K, V>(
        &self,
        name: &'static str,
        timeout: Duration,
    ) -> pgbatch::BatcherBuilder<K, V>
    where
        K: Clone + Eq + std::hash::Hash + Send + 'static,
        V: Clone + Send + 'static,
    {
        pgbatch::Batcher::builder()
            .name(name)
            .max_batch_size(self.max_batch_size)
            .concurrency(self.concurrency)
            .channel_capacity(self.queue_capacity)
            .policy(self.policy)
            .max_delay(self.max_delay)
            .timeout(timeout)
            // A load still running a second past its callers' deadline
            // (its statement timeout fires at the deadline) is on a node
            // that stopped answering: abandoned, its connection is
            // discarded and its slot freed (`pgbatch::pg::Lease`).
            .load_timeout(timeout + LOAD_GRACE)
    }
}

/// How long past its callers' deadline a load may run before it is
/// abandoned.
pub const LOAD_GRACE: Duration = Duration::from_secs(1);

/// Settings of a coalescing TTL cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSettings {
    /// Most entries.
    pub capacity: u64,
    /// Lifetime of a cached value, before jitter.
    pub ttl: Duration,
    /// Up to this much is added to each lifetime.
    pub jitter: Duration,
    /// Lifetime of a cached "not found", if cached at all.
    pub negative_ttl: Option<Duration>,
    /// Which loaded values are stored: a key's from its second miss on
    /// (the default for the read caches), or all (the token cache's).
    /// BENCHMARKS.md, "What the cache buys": with reads spread over far more keys than
    /// the cache holds, storing every value made the cached path read
    /// 0.56x of the batched one, storing second misses 0.82x; a key read
    /// often pays one extra load to be admitted.
    pub admission: pgbatch::cache::Admission,
}

impl Default for CacheSettings {
    fn default() -> Self {
        Self {
            capacity: defaults::CACHE_CAPACITY,
            ttl: defaults::CACHE_TTL,
            jitter: defaults::CACHE_JITTER,
            negative_ttl: None,
            admission: pgbatch::cache::Admission::SecondMiss,
        }
    }
}

impl CacheSettings {
    /// A cache builder named `name` with these settings.
    pub fn builder<K, V>(&self, name: &str) -> pgbatch::cache::CacheBuilder<K, V>
    where
        K: Clone + Eq + std::hash::Hash + Send + Sync + 'static,
        V: Clone + Send + Sync + 'static,
    {
        let b = pgbatch::cache::Cache::builder()
            .name(name)
            .max_capacity(self.capacity)
            .time_to_live(self.ttl)
            .jitter(self.jitter)
            .admission(self.admission);
        match self.negative_ttl {
            Some(ttl) => b.negative_ttl(ttl),
            None => b,
        }
    }
}

/// Settings of the write path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WriteSettings {
    /// The micro-batched object writer.
    pub batch: BatchSettings,
    /// Deadline of one write request (it may still commit after): an
    /// upsert, a delete, a repository created or deleted.
    pub timeout: Duration,
}

impl Default for WriteSettings {
    fn default() -> Self {
        Self {
            batch: BatchSettings {
                max_batch_size: defaults::WRITE_BATCH_SIZE,
                concurrency: Concurrency::Fixed(defaults::WRITE_CONCURRENCY),
                ..BatchSettings::default()
            },
            timeout: defaults::WRITE_TIMEOUT,
        }
    }
}

/// Settings of NDJSON imports. Imports run on a pool of their own, so a
/// slow uploader never holds a connection that reads need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportSettings {
    /// Largest accepted body, in bytes.
    pub max_bytes: usize,
    /// Imports at once (the import pool's size); more get 503 at once.
    pub concurrency: usize,
    /// Longest pause between two chunks of the body before the import is
    /// abandoned with 408.
    pub idle_timeout: Duration,
    /// Deadline of the whole import, and the import connections'
    /// `statement_timeout`.
    pub timeout: Duration,
}

impl Default for ImportSettings {
    fn default() -> Self {
        Self {
            max_bytes: defaults::MAX_IMPORT_BYTES,
            concurrency: defaults::IMPORT_CONCURRENCY,
            idle_timeout: defaults::IMPORT_IDLE_TIMEOUT,
            timeout: defaults::IMPORT_TIMEOUT,
        }
    }
}

/// Settings of token resolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthSettings {
    /// The token cache; `None` looks every token up (for comparison).
    pub cache: Option<CacheSettings>,
}

impl AuthSettings {
    /// How tokens are looked up, beside the other reads' `reads`: through
    /// the token cache, or batched with none; the other reads' batching,
    /// deadline and admission.
    pub fn reads(&self, reads: &ReadSettings) -> ReadSettings {
        ReadSettings {
            path: if self.cache.is_some() {
                ReadPath::Cached
            } else {
                ReadPath::Batched
            },
            cache: self.cache.unwrap_or_default(),
            ..*reads
        }
    }
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            cache: Some(CacheSettings {
                capacity: defaults::AUTH_CACHE_CAPACITY,
                // Few, hot keys: each is worth storing at once.
                admission: pgbatch::cache::Admission::Always,
                ..CacheSettings::default()
            }),
        }
    }
}

/// Request limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most paths in one `POST .../objects/stat`.
    pub max_stat_paths: usize,
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: usize,
    /// Longest pause between two chunks of a (non-import) request body;
    /// the request's deadline starts once its body has arrived.
    pub body_idle_timeout: Duration,
    /// Longest time for a whole (non-import) request body to arrive.
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_stat_paths: defaults::MAX_STAT_PATHS,
            max_body_bytes: defaults::MAX_BODY_BYTES,
            body_idle_timeout: defaults::BODY_IDLE_TIMEOUT,
            body_timeout: defaults::BODY_TIMEOUT,
        }
    }
}

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Never TLS.
    Disable,
    /// TLS if the server offers it; the certificate is not checked.
    #[default]
    Prefer,
    /// Always TLS; the certificate is checked only with `sslrootcert`.
    Require,
    /// Always TLS, with a certificate chaining to a trusted CA.
    VerifyCa,
    /// As `VerifyCa`, and the certificate names the host connected to.
    VerifyFull,
}

impl SslMode {
    /// Parses libpq's names.
    ///
    /// # Errors
    ///
    /// An unknown name; the message lists the known ones.
    pub fn parse(name: &str) -> anyhow::Result<Self> {
        Ok(match name {
            "disable" => Self::Disable,
            "allow" | "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => bail!(
                "unknown sslmode `{other}` (disable, prefer, require, verify-ca or verify-full)"
            ),
        })
    }
}

/// Limits on clients, below the router: how long a request head may take,
/// how large it may be, how many connections may be open, and how long a
/// shutdown waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdgeSettings {
    /// Longest wait for a complete request head, counted from when the
    /// connection starts waiting for it: at accept, or when a keep-alive
    /// connection goes idle after a response. Past it the connection is
    /// closed without a response. This is also the idle keep-alive
    /// timeout.
    pub header_read_timeout: Duration,
    /// Largest request head (request line and headers), in bytes; a larger
    /// one is answered 431 and its connection closed.
    pub max_header_bytes: usize,
    /// Most connections open at once; a connection beyond them is answered
    /// 503 and closed at once.
    pub max_connections: usize,
    /// On shutdown, how long in-flight requests (and responses still being
    /// written) may take before their connections are dropped.
    pub shutdown_grace: Duration,
    /// Most bytes of a request body the handler left unread that are read
    /// and thrown away so the connection can be kept; past it, the
    /// response closes the connection.
    pub drain_bytes: usize,
    /// Longest time spent draining such a body before the response goes
    /// out with `Connection: close` instead.
    pub drain_time: Duration,
    /// After a connection's last response, for how long at most what the
    /// client still sends is read and thrown away, its write side already
    /// shut down, before the socket is closed (sooner when the client
    /// closes or goes quiet).
    pub linger_time: Duration,
}

impl Default for EdgeSettings {
    fn default() -> Self {
        Self {
            header_read_timeout: defaults::HEADER_READ_TIMEOUT,
            max_header_bytes: defaults::MAX_HEADER_BYTES,
            max_connections: defaults::MAX_CONNECTIONS,
            shutdown_grace: defaults::SHUTDOWN_GRACE,
            drain_bytes: defaults::DRAIN_BYTES,
            drain_time: defaults::DRAIN_TIME,
            linger_time: defaults::LINGER_TIME,
        }
    }
}

impl EdgeSettings {
    /// An error naming the first setting that would make the server refuse
    /// or drop every request.
    pub fn validate(&self) -> std::io::Result<()> {
        let invalid = |what: &str| Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, what));
        if self.header_read_timeout.is_zero() {
            return invalid("the header read timeout must be above zero");
        }
        if self.max_header_bytes == 0 {
            return invalid("the request head limit must be above zero");
        }
        if self.max_connections == 0 {
            return invalid("the connection limit must be above zero");
        }
        Ok(())
    }
}
