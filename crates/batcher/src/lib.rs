//! Make Postgres-backed services fast under many tiny queries.
//!
//! Services that answer each request with a single-row `SELECT` pay every
//! statement's fixed cost and round trip once per request. This crate
//! coalesces concurrent single-key lookups into batched loads (one
//! `SELECT ... WHERE key = ANY($1)` for many callers) and routes each row
//! back to the caller that asked for it.
//!
//! The engine is generic: a [`Batcher<K, V>`](Batcher) works with any
//! [`Loader`], and nothing in it depends on a database.
//!
//! ```
//! use std::collections::HashMap;
//! use std::convert::Infallible;
//! use pgbatch::{loader_fn, Batcher};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let users = Batcher::builder()
//!     .max_batch_size(32)
//!     .build(loader_fn(|ids: Vec<u32>| async move {
//!         // One query for the whole batch, e.g. `WHERE id = ANY($1)`.
//!         Ok::<_, Infallible>(
//!             ids.into_iter().map(|id| (id, format!("user {id}"))).collect::<HashMap<_, _>>(),
//!         )
//!     }))?;
//!
//! let name = users.load(7).await?;
//! assert_eq!(name.as_deref(), Some("user 7"));
//!
//! let many = users.load_many([1, 2, 3]).await;
//! assert!(many.iter().all(|r| matches!(r, Ok(Some(_)))));
//! # Ok(()) }
//! ```
//!
//! See [`Batcher`] for the guarantees (per-key results, shared batch
//! errors, deadlines, cancellation, backpressure, shutdown) and
//! [`BatcherBuilder`] for the settings. A multi-tenant service shares one
//! batcher across tenants or database roles with scopes: see [`scopes`].
//! A parent's children, and the first N of each of many parents in one
//! statement: see [`lists`].
//!
//! # Features
//!
//! | feature | adds |
//! |---|---|
//! | (none) | [`Batcher`], [`Loader`], [`loader_fn`], stats: no database, no cache |
//! | `cache` | `cache`: a coalescing TTL cache on moka, in front of any loader or a [`Batcher`] |
//! | `postgres` | `pg`: `PgLoader`, the micro-batched `Writer`, COPY import, pools with timeouts and any TLS connector, multi-host failover |
//! | `sqlx` | `sqlx`: the same over a `sqlx::PgPool`, into your own `FromRow` types |
//! | `metrics` | `metrics`: every batcher's and cache's figures through the `metrics` facade |
//!
//! Whatever the driver, [`Error::is_retryable`] says whether a failed
//! lookup may succeed if asked again.
//!
//! The crate's `examples/` show each: an in-memory batcher, a `PgLoader`
//! and a `SqlxLoader` on a pool, the cache in front of a batcher, an axum
//! handler holding a batcher in its state, tenants under row-level
//! security sharing one scoped batcher, and async-graphql resolvers
//! loading as the request's tenant through a cache and a batcher.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod batcher;
#[cfg(feature = "cache")]
#[cfg_attr(docsrs, doc(cfg(feature = "cache")))]
pub mod cache;
#[cfg(any(feature = "postgres", feature = "sqlx"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "sqlx"))))]
pub mod db;
mod error;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod pg;
#[cfg(feature = "sqlx")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
pub mod sqlx;
#[doc = include_str!("../docs/lists.md")]
pub mod lists {}
#[doc = include_str!("../docs/scopes.md")]
pub mod scopes {}
pub mod stats;

pub use crate::batcher::{
    defaults, loader_fn, scoped_loader_fn, Batcher, BatcherBuilder, Concurrency, FlushPolicy,
    Loaded, Loader, LoaderFn, Overflow, Pair, ScopedLoader, ScopedLoaderFn, Worker,
};
pub use crate::error::{BuildError, Error, SharedError, TimedOut, Waited};
pub use crate::stats::StatsSnapshot;

// The crate README's examples are compiled and run as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "cache", feature = "postgres", feature = "sqlx"))]
pub struct ReadmeDoctests;
