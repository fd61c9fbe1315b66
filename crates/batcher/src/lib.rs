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
//! use batcher::{loader_fn, Batcher};
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
//! [`BatcherBuilder`] for the settings.

mod batcher;
pub mod cache;
mod error;
#[cfg(feature = "postgres")]
pub mod pg;
pub mod stats;

pub use crate::batcher::{
    defaults, loader_fn, Batcher, BatcherBuilder, FlushPolicy, Loader, LoaderFn, Overflow, Pair,
    Worker,
};
pub use crate::error::{BuildError, Error, SharedError};
pub use crate::stats::StatsSnapshot;

// The project README's examples are compiled and run as doc tests.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
