//! Postgres loaders over tokio-postgres and deadpool-postgres (feature
//! `postgres`).
//!
//! A [`BatchQuery`] says how to look up many keys with one statement (for
//! example `SELECT ... WHERE pk = ANY($1)`, or a join on `unnest` for a
//! composite key) and one key with one statement. A [`PgLoader`] runs it on
//! a pooled connection, as a prepared statement cached per connection, and
//! is a [`Loader`](crate::Loader) for a [`Batcher`](crate::Batcher).
//! [`PgLoader::load_one`] runs the single-key statement, for comparison or
//! for callers that do not want batching.
//!
//! For writes, an [`UpsertQuery`] run by a [`Writer`] coalesces concurrent
//! single-row upserts into one statement per batch, acknowledging each
//! caller after its batch commits; [`copy`] bulk-loads with binary COPY.
//!
//! [`classify`] sorts database errors into the [`DbErrorKind`]s callers act
//! on (a duplicate key, a refused row, a statement timeout, a session
//! state the connection lost); the loaders, the writer and the import all
//! use it.
//!
//! # Behind a connection pooler
//!
//! A transaction-mode pooler (PgBouncer, Supavisor, Neon's pooled
//! endpoint, RDS Proxy) gives each transaction a possibly different server
//! connection, so nothing of a session carries over: named prepared
//! statements, session `SET`s, `LISTEN`. Give the loader, the writer and
//! the import [`Statements`] with [`StatementMode::Unnamed`], and a
//! [`statement_timeout`](Statements::statement_timeout) if you want one
//! (the `options` startup parameter that carries it on a direct
//! connection is refused by PgBouncer). A session-mode pooler keeps a
//! client on one server connection, so the defaults work there.
//!
//! Build the pool with [`pool`], which sets the wait, create and recycle
//! timeouts that deadpool leaves unset by default: without them, a request
//! waits forever for a connection when the database is slow or gone.

// One way: `writer` uses `loader`'s parameter types; `writer`, `copy`
// and `loader` use `statements` and `error`, which use nothing of the
// crate. Only `loader` (a `Loader`) and `writer` (a
// batcher of upserts) reach the engine, through the crate root.
pub mod copy;
mod error;
mod loader;
mod statements;
mod writer;

pub use error::{classify, DbErrorKind};
pub use loader::{BatchQuery, Params, PgError, PgLoader};
pub use statements::{Sql, StatementMode, Statements};
pub use writer::{PgWriter, RowError, UpsertQuery, WriteRequest, WriteResult, Writer, Written};

use std::time::Duration;

pub use deadpool_postgres::Pool;

/// Connection-pool settings for [`pool`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PoolOptions {
    /// Most connections. Default 16.
    pub max_size: usize,
    /// How long a caller waits for a free connection before
    /// [`PgError::Pool`]. Default 2 s.
    pub wait_timeout: Duration,
    /// How long opening a new connection may take. Default 5 s.
    pub create_timeout: Duration,
    /// How long checking a returned connection may take. Default 2 s.
    pub recycle_timeout: Duration,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            max_size: 16,
            wait_timeout: Duration::from_secs(2),
            create_timeout: Duration::from_secs(5),
            recycle_timeout: Duration::from_secs(2),
        }
    }
}

impl PoolOptions {
    /// Default options with `max_size` connections.
    pub fn with_max_size(max_size: usize) -> Self {
        Self {
            max_size,
            ..Self::default()
        }
    }
}

/// A connection pool for `config` with every timeout set, without TLS: for
/// a server on a Unix socket or a trusted network. For a server that wants
/// TLS (most managed Postgres services), use [`pool_with_tls`].
///
/// Connections are recycled with a cheap check (deadpool's `Fast` method):
/// a connection whose server went away is detected on its next use, and the
/// pool replaces it.
///
/// # Errors
///
/// When the options are invalid (for example `max_size` 0).
pub fn pool(
    config: tokio_postgres::Config,
    options: &PoolOptions,
) -> Result<Pool, deadpool_postgres::BuildError> {
    pool_with_tls(config, options, tokio_postgres::NoTls)
}

/// A connection pool for `config` with every timeout set, connecting
/// through `tls`: any tokio-postgres TLS connector, for example
/// tokio-postgres-rustls' `MakeRustlsConnect` or postgres-native-tls'.
/// Whether TLS is used, preferred or required is `config`'s `ssl_mode`.
///
/// ```no_run
/// # fn connector() -> tokio_postgres::NoTls { tokio_postgres::NoTls }
/// use pgbatch::pg::{pool_with_tls, PoolOptions};
///
/// let config: tokio_postgres::Config =
///     "host=db.example.com user=app dbname=app sslmode=require".parse()?;
/// let tls = connector(); // e.g. tokio_postgres_rustls::MakeRustlsConnect::new(client_config)
/// let pool = pool_with_tls(config, &PoolOptions::with_max_size(16), tls)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// When the options are invalid (for example `max_size` 0).
pub fn pool_with_tls<T>(
    config: tokio_postgres::Config,
    options: &PoolOptions,
    tls: T,
) -> Result<Pool, deadpool_postgres::BuildError>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket> + Clone + Sync + Send + 'static,
    T::Stream: Sync + Send,
    T::TlsConnect: Sync + Send,
    <T::TlsConnect as tokio_postgres::tls::TlsConnect<tokio_postgres::Socket>>::Future: Send,
{
    use deadpool_postgres::{Manager, ManagerConfig, RecyclingMethod, Runtime};
    let manager = Manager::from_config(
        config,
        tls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(options.max_size)
        .wait_timeout(Some(options.wait_timeout))
        .create_timeout(Some(options.create_timeout))
        .recycle_timeout(Some(options.recycle_timeout))
        .runtime(Runtime::Tokio1)
        .build()
}
