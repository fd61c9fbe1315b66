//! The connection pool: deadpool with every timeout set, connecting
//! through a [`Connector`], and the [`Lease`] a connection is used under.

use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

use deadpool_postgres::{ClientWrapper, Object, Pool, PoolError};

use super::connect::{Connector, TargetSessionAttrs};
use super::error::is_unavailable;

/// Connection-pool settings for [`pool`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PoolOptions {
    /// Most connections. Default 16.
    pub max_size: usize,
    /// How long a caller waits for a free connection before
    /// [`PgError::Pool`](super::PgError::Pool). Default 2 s.
    pub wait_timeout: Duration,
    /// How long opening a new connection may take, every host tried
    /// included. Default 5 s; never less than each host's deadline for
    /// every host, plus a second.
    pub create_timeout: Duration,
    /// How long checking a returned connection may take. Default 2 s.
    pub recycle_timeout: Duration,
    /// How long one host may take to connect, log in and show its role,
    /// before the next host is tried; `None` takes the config's
    /// `connect_timeout`, else 2 s ([`DEFAULT_HOST_TIMEOUT`](super::DEFAULT_HOST_TIMEOUT)).
    pub host_timeout: Option<Duration>,
    /// What the node must be; `None` takes the config's own
    /// `target_session_attrs` (tokio-postgres keeps only `any`,
    /// `read-write` and `read-only`: [`parse_config`](super::parse_config)
    /// returns the others).
    pub target_session_attrs: Option<TargetSessionAttrs>,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            max_size: 16,
            wait_timeout: Duration::from_secs(2),
            create_timeout: Duration::from_secs(5),
            recycle_timeout: Duration::from_secs(2),
            host_timeout: None,
            target_session_attrs: None,
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

    /// These options with `timeout` for each host's attempt.
    #[must_use]
    pub fn host_timeout(mut self, timeout: Duration) -> Self {
        self.host_timeout = Some(timeout);
        self
    }

    /// These options for nodes that are `attrs`.
    #[must_use]
    pub fn target_session_attrs(mut self, attrs: TargetSessionAttrs) -> Self {
        self.target_session_attrs = Some(attrs);
        self
    }
}

/// A connection pool for `config` with every timeout set, without TLS: for
/// a server on a Unix socket or a trusted network. For a server that wants
/// TLS (most managed Postgres services), use [`pool_with_tls`].
///
/// Connections are opened by a [`Connector`] (each host under its own
/// deadline; keepalives and `TCP_USER_TIMEOUT`) and recycled with a cheap
/// check (deadpool's `Fast` method): a connection whose server went away
/// is detected on its next use, and one used through a [`Lease`] is
/// discarded when its statement was abandoned or its node is gone. The
/// connection returned last is handed out first, so light traffic keeps
/// to a few warm server processes.
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
/// use pgbatch::pg::{parse_config, pool_with_tls, PoolOptions};
///
/// // Every node; connections go to whichever is the primary.
/// let (config, attrs) = parse_config(
///     "postgres://app@db1.example.com,db2.example.com/app?sslmode=require&target_session_attrs=primary",
/// )?;
/// let tls = connector(); // e.g. tokio_postgres_rustls::MakeRustlsConnect::new(client_config)
/// let options = PoolOptions::with_max_size(16).target_session_attrs(attrs);
/// let pool = pool_with_tls(config, &options, tls)?;
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
    let mut connector = Connector::new(config.clone(), tls);
    if let Some(timeout) = options.host_timeout {
        connector = connector.host_timeout(timeout);
    }
    if let Some(attrs) = options.target_session_attrs {
        connector = connector.target_session_attrs(attrs);
    }
    pool_with_connector(connector, options)
}

/// A pool whose connections `connector` opens. Pools made from clones of
/// one connector share what it learned of the hosts: after a failover,
/// once one of them finds the old primary gone, the others try the new one
/// first too. `options`' host timeout and target are the connector's.
///
/// # Errors
///
/// When the options are invalid (for example `max_size` 0).
pub fn pool_with_connector<T>(
    connector: Connector<T>,
    options: &PoolOptions,
) -> Result<Pool, deadpool_postgres::BuildError>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket> + Clone + Sync + Send + 'static,
    T::Stream: Sync + Send,
    T::TlsConnect: Sync + Send,
    <T::TlsConnect as tokio_postgres::tls::TlsConnect<tokio_postgres::Socket>>::Future: Send,
{
    use deadpool_postgres::{
        Hook, HookError, Manager, ManagerConfig, QueueMode, RecyclingMethod, Runtime,
    };
    let judge = connector.clone();
    let manager = Manager::from_connect(
        connector.config().clone(),
        connector,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    // Every host must get its turn: a create cancelled while a hung host
    // holds it would never reach the next one.
    let create_timeout = options
        .create_timeout
        .max(judge.worst_case() + Duration::from_secs(1));
    Pool::builder(manager)
        // An idle connection to the node connections no longer go to (the
        // old primary, after a failover) is dropped, not handed out.
        .pre_recycle(Hook::sync_fn(move |_, metrics| {
            if judge.is_current(metrics.created) {
                Ok(())
            } else {
                Err(HookError::message(
                    "opened to a node that connections no longer go to",
                ))
            }
        }))
        .max_size(options.max_size)
        // The connection used last goes out first, so a batcher at its
        // limit keeps a few warm server processes busy instead of cycling
        // through all of them: first-in-first-out read 0.75 of a
        // hand-written batcher's throughput at the same limit, this 0.85
        // (BENCHMARKS.md, "The engine against a hand-written batcher"). The ones at the bottom may stay idle for long:
        // one the server closed meanwhile (`idle_session_timeout`) is
        // found closed by the `Fast` recycle check and replaced, one a
        // middlebox dropped silently by the keepalives, and `pre_recycle`
        // drops those opened to a node no longer current.
        .queue_mode(QueueMode::Lifo)
        .wait_timeout(Some(options.wait_timeout))
        .create_timeout(Some(create_timeout))
        .recycle_timeout(Some(options.recycle_timeout))
        .runtime(Runtime::Tokio1)
        .build()
}

/// A statement abandoned after holding its connection this long suggests
/// a node that stopped answering (a healthy one has cancelled it at its
/// `statement_timeout` by then, or answered): the pool's idle connections
/// go too.
const HUNG_AFTER: Duration = Duration::from_secs(1);

/// A pooled connection, handed back to the pool only when the work on it
/// is known to have ended.
///
/// A tokio-postgres connection whose statement was abandoned (its future
/// dropped at a deadline) still waits for that statement's answer, and a
/// connection to a node that hangs (a frozen host after a failover) waits
/// forever: returned to the pool, it would take the next statement down
/// with it. So a lease dropped without [`release`](Self::release) or
/// [`settle`](Self::settle) discards its connection, and one that held it
/// for over a second discards the pool's idle connections too. A lease
/// settled with an error that says the node is gone or is no longer a
/// primary ([`DbErrorKind::Unavailable`](super::DbErrorKind::Unavailable))
/// does the same: the pool then connects anew, to whichever node its
/// connector finds.
///
/// ```no_run
/// # async fn f(pool: &pgbatch::pg::Pool) -> Result<(), Box<dyn std::error::Error>> {
/// use pgbatch::pg::Lease;
///
/// let lease = Lease::get(pool).await?;
/// let result = lease.query_one("SELECT 1", &[]).await;
/// lease.settle(&result); // back to the pool, unless the node is gone
/// let row = result?;
/// # Ok(()) }
/// ```
#[must_use = "a lease dropped without `release` or `settle` discards its connection"]
pub struct Lease {
    object: Option<Object>,
    since: Instant,
    hung_after: Duration,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("held_for", &self.since.elapsed())
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// A connection from `pool`.
    ///
    /// # Errors
    ///
    /// As deadpool's `Pool::get`: none free within the wait timeout, or
    /// opening one failed.
    pub async fn get(pool: &Pool) -> Result<Self, PoolError> {
        Self::get_for(pool, HUNG_AFTER).await
    }

    /// As [`get`](Self::get), for a statement that a healthy node ends
    /// within `hung_after` (its `statement_timeout` and some margin): only
    /// a lease abandoned after holding its connection that long takes the
    /// pool's idle connections with it. For leases that a client going away
    /// may drop early, in a request handler, so that such a client does not
    /// empty the pool.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get).
    pub async fn get_for(pool: &Pool, hung_after: Duration) -> Result<Self, PoolError> {
        let object = pool.get().await?;
        Ok(Self {
            object: Some(object),
            since: Instant::now(),
            hung_after,
        })
    }

    /// The work ended: the connection goes back to the pool.
    pub fn release(mut self) {
        drop(self.object.take());
    }

    /// The work ended with `result`: the connection goes back to the pool,
    /// unless the error says the node is gone or no longer fits; then it is
    /// discarded, and so are the pool's idle connections.
    pub fn settle<T, E: AsPgError>(self, result: &Result<T, E>) {
        match result {
            Err(e) if e.as_pg_error().is_some_and(is_unavailable) => self.discard(true),
            _ => self.release(),
        }
    }

    /// Discards the connection, and with `idle_too` the pool's idle ones.
    pub fn discard(mut self, idle_too: bool) {
        if let Some(object) = self.object.take() {
            discard(object, idle_too);
        }
    }
}

/// Takes `object` out of its pool and closes it; with `idle_too`, the
/// pool's idle connections as well.
fn discard(object: Object, idle_too: bool) {
    let pool = Object::pool(&object);
    drop(Object::take(object));
    if let (true, Some(pool)) = (idle_too, pool) {
        let removed = pool.retain(|_, _| false).removed.len();
        tracing::debug!(
            idle_discarded = removed,
            "a database connection was lost or abandoned; its pool's idle connections are closed"
        );
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(object) = self.object.take() {
            // Abandoned: a statement may still be running on it.
            discard(object, self.since.elapsed() >= self.hung_after);
        }
    }
}

/// As deadpool's pooled object does: `&**lease` is the
/// `tokio_postgres::Client`.
impl Deref for Lease {
    type Target = ClientWrapper;

    fn deref(&self) -> &ClientWrapper {
        self.object.as_ref().expect("present until released")
    }
}

impl DerefMut for Lease {
    fn deref_mut(&mut self) -> &mut ClientWrapper {
        self.object.as_mut().expect("present until released")
    }
}

/// An error that may carry a tokio-postgres error, for
/// [`Lease::settle`].
pub trait AsPgError {
    /// The tokio-postgres error inside, if any.
    fn as_pg_error(&self) -> Option<&tokio_postgres::Error>;
}

impl AsPgError for tokio_postgres::Error {
    fn as_pg_error(&self) -> Option<&tokio_postgres::Error> {
        Some(self)
    }
}

impl AsPgError for super::PgError {
    fn as_pg_error(&self) -> Option<&tokio_postgres::Error> {
        match self {
            super::PgError::Query(e)
            | super::PgError::Withheld(super::Withheld { error: e, .. }) => Some(e),
            super::PgError::Pool(PoolError::Backend(e)) => Some(e),
            super::PgError::Pool(_) | super::PgError::Scope(_) => None,
        }
    }
}
