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
//!
//! # Several nodes, and failover
//!
//! A connection string may name every node, as libpq's does
//! (`postgres://app@db1:5432,db2:5432/app?target_session_attrs=primary`,
//! or `host=db1,db2 port=5432,5432 ...`); read it with [`parse_config`],
//! which knows every `target_session_attrs` libpq does. The pool's
//! [`Connector`] tries each node under a deadline of its own (connect,
//! login and the role check together), the ones that failed lately last,
//! and keeps TCP keepalives and a `TCP_USER_TIMEOUT` on every connection.
//! A connection is used through a [`Lease`], which hands it back to the
//! pool only when its work ended: one whose statement was abandoned (its
//! future dropped at a deadline) or which met a node that is gone or no
//! longer a primary ([`DbErrorKind::Unavailable`]) is discarded, with the
//! pool's idle ones, so the next statement connects to whichever node is
//! the primary now. [`PgLoader`] and [`Writer`] run a batch that failed
//! that way once more, on a new connection: reads, and upserts, are safe
//! to repeat.

// One way: `writer` uses `loader`'s parameter types; `writer`, `copy`
// and `loader` use `pool`, `statements` and `error`; `pool` uses
// `connect` and `error`, which use nothing of the crate. Only `loader` (a `Loader`) and `writer` (a
// batcher of upserts) reach the engine, through the crate root.
mod connect;
pub mod copy;
mod error;
mod loader;
mod pipelined;
mod pool;
mod reads;
mod scoped;
mod statements;
mod writer;

pub use crate::db::{
    Cursor, List, Page, PageError, PageKey, PageSql, PageSqlBuilder, Paged, Scope, ScopeBuilder,
    ScopeError, Single, UnmappedRow, WriteRequest, Written,
};
pub use connect::{
    parse_config, ConfigError, Connector, TargetSessionAttrs, UnknownTargetSessionAttrs,
    DEFAULT_HOST_TIMEOUT,
};
pub(crate) use error::classified;
pub use error::{classify, DbErrorKind};
pub(crate) use loader::pool_error_is_retryable;
pub use loader::{BatchQuery, PageQuery, Params, PgError, PgLoader, Withheld};
pub use pool::{pool, pool_with_connector, pool_with_tls, AsPgError, Lease, PoolOptions};
pub use scoped::ScopedPgLoader;
pub use statements::{Sql, StatementMode, Statements};
pub use writer::{PgWriter, RowError, UpsertQuery, WriteResult, Writer};

pub use deadpool_postgres::Pool;

/// The driver the loaders run on, re-exported so `pgbatch` is the only
/// Postgres dependency a tokio-postgres user needs, at the version the
/// crate was built with (`pgbatch::pg::tokio_postgres::Row`, `types::ToSql`).
pub use tokio_postgres;

/// The pool the loaders draw connections from, re-exported for the same
/// reason (`pgbatch::pg::deadpool_postgres::Config`, `Runtime`).
pub use deadpool_postgres;
