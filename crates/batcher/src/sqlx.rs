//! Postgres loaders and a micro-batched writer over sqlx's `PgPool`
//! (feature `sqlx`): what `pgbatch::pg` gives tokio-postgres users, for a
//! service already on sqlx.
//!
//! A [`BatchQuery`] says how to look up many keys with one statement (for
//! example `SELECT ... WHERE pk = ANY($1)`, or a join on `unnest` for a
//! composite key), how to bind a batch's keys to it, and how a row (your
//! own type, read with sqlx's `FromRow`) maps to a key and its value. A
//! [`SqlxLoader`] runs it on a `PgPool` and is a [`Loader`](crate::Loader)
//! for a [`Batcher`](crate::Batcher). [`SqlxLoader::load_one`] looks up one
//! key without batching.
//!
//! For writes, an [`UpsertQuery`] run by a [`Writer`] coalesces concurrent
//! single-row upserts into one statement per batch (the batch's rows bound
//! as one array per column and read with `unnest`), acknowledging each
//! caller after its batch commits; a row the database refuses fails only
//! its own caller. [`copy`] bulk-loads with COPY.
//!
//! The names are those of `pgbatch::pg` (`BatchQuery`, `batch_sql`,
//! `single_sql`, `map_row`, `is_absent`, `UpsertQuery`, `Writer`,
//! `Written`, `RowError`, `StatementMode`, `classify`, `DbErrorKind`,
//! `copy::import`), so code moves between the two drivers by changing how
//! keys and rows are bound and rows read. The driver-neutral types
//! (`Written`, `WriteRequest`, `StatementMode`, `DbErrorKind`, `Scope`) are
//! the same in both; the rest are this module's own:
//! `pgbatch::sqlx::BatchQuery` is not `pgbatch::pg::BatchQuery`, and
//! `RowError` carries sqlx's error. Where
//! the drivers differ, so do the names: statements are sent as a
//! [`StatementMode`] given to `with_statement_mode` (`pg` takes a
//! `Statements`, which also carries a statement timeout), and the loader
//! and writer are `SqlxLoader` and `SqlxWriter`.
//!
//! ```no_run
//! use pgbatch::sqlx::{BatchQuery, PgQuery, SqlxLoader};
//! use pgbatch::Batcher;
//! use sqlx::postgres::{PgPoolOptions, PgRow};
//! use sqlx::{FromRow, Row};
//!
//! /// A row of `users(id bigint PRIMARY KEY, name text NOT NULL, email text)`.
//! #[derive(Debug, Clone)]
//! struct User {
//!     id: i64,
//!     name: String,
//!     email: Option<String>,
//! }
//!
//! // What `#[derive(sqlx::FromRow)]` writes, with sqlx's `derive` feature.
//! impl<'r> FromRow<'r, PgRow> for User {
//!     fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
//!         Ok(User {
//!             id: row.try_get("id")?,
//!             name: row.try_get("name")?,
//!             email: row.try_get("email")?,
//!         })
//!     }
//! }
//!
//! struct UsersById;
//!
//! impl BatchQuery for UsersById {
//!     type Key = i64;
//!     type Row = User;
//!     type Value = User;
//!
//!     fn batch_sql(&self) -> &str {
//!         "SELECT id, name, email FROM users WHERE id = ANY($1)"
//!     }
//!     fn bind_batch<'q>(&self, query: PgQuery<'q>, keys: &'q [i64]) -> PgQuery<'q> {
//!         query.bind(keys)
//!     }
//!     fn map_row(&self, user: User) -> (i64, User) {
//!         (user.id, user)
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = PgPoolOptions::new()
//!     .max_connections(16)
//!     .connect(&std::env::var("DATABASE_URL")?)
//!     .await?;
//! let users: Batcher<i64, User> = Batcher::new(SqlxLoader::new(pool, UsersById));
//!
//! // Concurrent lookups share one `SELECT ... WHERE id = ANY($1)`.
//! let (first, second) = tokio::join!(users.load(1), users.load(2));
//! if let Some(user) = first? {
//!     println!("{} <{:?}>", user.name, user.email);
//! }
//! # let _ = second?;
//! # Ok(()) }
//! ```
//!
//! **Pool size.** sqlx's pool hands out its idle connections first in,
//! first out, with no option for the other order, so a batcher's few loads
//! in flight cycle through every connection of the pool, each a server
//! process with cold caches. `pgbatch::pg`'s pools hand out the connection
//! returned last, which on a CPU-bound server read 1.13x the throughput at
//! the same limit (BENCHMARKS.md, "The engine against a hand-written batcher"). With sqlx, keep `max_connections`
//! close to what the batcher needs: a few above its limit on a nearby
//! database, more only where the round trip is long.
//!
//! Only `batch_sql`, `bind_batch` and `map_row` are required: a batch of
//! one runs the batch statement with a one-element array unless you give
//! [`single_sql`](BatchQuery::single_sql) and
//! [`bind_single`](BatchQuery::bind_single) too (a plain `= $1` costs the
//! server a little less than `= ANY` over one element).
//!
//! A composite key is bound as one array per column and joined with
//! `unnest`, which keeps the statement the same for every batch size:
//!
//! ```
//! use pgbatch::sqlx::{BatchQuery, PgQuery};
//!
//! /// `members(org_id bigint, login text, role text NOT NULL,
//! /// PRIMARY KEY (org_id, login))`.
//! struct Roles;
//!
//! impl BatchQuery for Roles {
//!     type Key = (i64, String);
//!     type Row = (i64, String, String);
//!     type Value = String;
//!
//!     fn batch_sql(&self) -> &str {
//!         "SELECT m.org_id, m.login, m.role \
//!          FROM unnest($1::bigint[], $2::text[]) AS k(org_id, login) \
//!          JOIN members m ON m.org_id = k.org_id AND m.login = k.login"
//!     }
//!     fn bind_batch<'q>(&self, query: PgQuery<'q>, keys: &'q [(i64, String)]) -> PgQuery<'q> {
//!         let (orgs, logins): (Vec<i64>, Vec<String>) = keys.iter().cloned().unzip();
//!         query.bind(orgs).bind(logins)
//!     }
//!     fn map_row(&self, (org_id, login, role): (i64, String, String)) -> ((i64, String), String) {
//!         ((org_id, login), role)
//!     }
//! }
//! ```
//!
//! # Errors
//!
//! The loader's error is sqlx's own `sqlx::Error`; a
//! batcher hands it to every caller of the failed batch, and
//! [`Error::load_error`](crate::Error::load_error)`::<sqlx::Error>()` gets
//! it back. [`classify`] sorts it into the [`DbErrorKind`]s the `pg` module
//! uses (a duplicate key, a refused row, a statement timeout, a lost
//! connection, a lost race), [`is_retryable`] says whether running the
//! work again may succeed, and [`is_pool_timeout`] tells a saturated pool.
//!
//! A batch that failed as [`DbErrorKind::Unavailable`] (the connection
//! lost, the server shutting down) is run once more, on another of the
//! pool's connections: a read is safe to repeat, and so is a write whose
//! [`UpsertQuery::is_idempotent`] says so (otherwise a [`Writer`]'s batch
//! is not run again: its commit may have gone through). sqlx's pool
//! already tests an idle connection before handing it out
//! (`test_before_acquire`, on by default); the second attempt covers one
//! that died in between, or a pool that does not test.
//!
//! A [`Writer`]'s failed batch reaches every caller in it as a
//! `sqlx::Error` too. A row the database refused (class 22 or 23) reaches
//! only its own caller, as
//! [`Error::load_error`](crate::Error::load_error)`::<`[`RowError`]`>()`,
//! and the rest of its batch is committed.
//!
//! # Behind a connection pooler
//!
//! A transaction-mode pooler (PgBouncer, Supavisor, Neon's pooled
//! endpoint, RDS Proxy) gives each transaction a possibly different server
//! connection, so a named statement that sqlx prepared and cached on one is
//! missing on the next, or clashes with another client's of the same name:
//! [`classify`] reports [`DbErrorKind::SessionStateLost`]. Build the loader
//! and the writer with [`StatementMode::Unnamed`].
//!
//! sqlx's `persistent(false)` alone is not enough there: sqlx sends the
//! unnamed statement's `Parse` and its `Bind`/`Execute` in two round trips,
//! each ending in `Sync`, and the pooler may give the second one another
//! server connection, where the unnamed statement is missing or is another
//! client's (launchbadge/sqlx#67). So `Unnamed` also runs each statement
//! in a transaction of its own, which keeps one server connection: four
//! round trips per batch (`BEGIN`, parse, execute, `COMMIT`) where a cached
//! prepared statement takes one. A [`Writer`]'s batch is a transaction
//! already (`BEGIN`, the statement, `COMMIT`; a refused row's batch is
//! written again row by row under savepoints in a second one), so there
//! `Unnamed` adds only the parse's round trip per statement.
//!
//! PgBouncer 1.21 and later can track named statements itself
//! (`max_prepared_statements` above zero, the default from 1.24): there
//! the default [`StatementMode::Prepared`] works and is cheaper.
//!
//! # What sqlx cannot do here
//!
//! - **Binary COPY.** sqlx streams COPY data as raw bytes and has no
//!   binary COPY writer, so [`copy`] sends rows as CSV: each value in
//!   Postgres's text form, parsed by the server (see [`copy`]).
//! - **Several nodes and failover.** sqlx's `PgConnectOptions` names one
//!   host; it has no `target_session_attrs` and no list of nodes to try,
//!   which `pg::parse_config` and `pg::Connector` give tokio-postgres
//!   users. Put a proxy or a DNS name that follows the primary in front.
//! - **Telling a dead node from a busy pool, over TCP.** sqlx's pool keeps
//!   retrying a connection the server refuses until `acquire_timeout` and
//!   then reports `PoolTimedOut`, the same error as a pool with no free
//!   connection (see [`is_pool_timeout`]). A Unix socket that is gone, a
//!   connection reset, or the server's own report of a shutdown are told
//!   apart ([`DbErrorKind::Unavailable`]).
//! - **A statement timeout per transaction.** The `options` startup
//!   parameter that carries `statement_timeout` on a direct connection
//!   (`PgConnectOptions::options`) is refused by PgBouncer; the loader
//!   and the writer do not set one per transaction as `pg::Statements`
//!   does.

// One way: `scoped` uses `loader` and `prologue`, `loader` uses
// `prologue`; `writer` uses `loader`'s `PgQuery` and `StatementMode`;
// `loader`, `writer` and `copy` use `error`, which uses nothing of the
// crate but the driver-independent `sqlstate`. Only `loader` (a `Loader`)
// and `writer` (a batcher of upserts) reach the engine, through the crate
// root.
pub mod copy;
mod error;
mod loader;
mod prologue;
mod scoped;
mod writer;

/// The driver the loaders run on, re-exported so `pgbatch` is the only
/// database dependency a sqlx user needs, at the version the crate was
/// built with (`pgbatch::sqlx::sqlx::PgPool`, `postgres::PgPoolOptions`).
/// sqlx's derive macros (`#[derive(sqlx::FromRow)]`) name `::sqlx` itself:
/// with them, depend on sqlx too, at the same version.
pub use ::sqlx;

pub use crate::db::{
    Cursor, DbErrorKind, List, Page, PageError, PageKey, PageSql, PageSqlBuilder, Paged, Scope,
    ScopeBuilder, ScopeError, Single, StatementMode, UnmappedRow, WriteRequest, Written,
};
pub(crate) use error::classified;
pub use error::{classify, is_pool_timeout, is_retryable};
pub use loader::{BatchQuery, PageQuery, PgQuery, SqlxLoader, DEFAULT_ACQUIRE_TIMEOUT};
pub use scoped::ScopedSqlxLoader;
pub use writer::{RowError, SqlxWriter, UpsertQuery, WriteResult, Writer};
