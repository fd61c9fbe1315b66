//! The micro-batching engine: [`Batcher`] handles, their [`Worker`], and the
//! [`Loader`] they call.
//!
//! ```text
//! caller ──load(k)──▶ bounded mpsc ──▶ Worker ──batch of keys──▶ Loader (own task)
//!    ▲                                   │ ◀──────values──────────────┘
//!    └──────────── oneshot reply ◀───────┘
//! ```
//!
//! # Choosing the settings
//!
//! - [`max_concurrent_batches`](BatcherBuilder::max_concurrent_batches) caps
//!   how many loads run at once; set it near the number of database
//!   connections the loader may use. With the default [`FlushPolicy::Eager`]
//!   this is also what makes batches grow: keys wait only while every slot
//!   is busy, so an idle service pays no batching delay at all.
//! - [`max_batch_size`](BatcherBuilder::max_batch_size) caps the keys per
//!   load.
//! - [`channel_capacity`](BatcherBuilder::channel_capacity) bounds the queue;
//!   with the default [`Overflow::Reject`], a full queue fails requests at
//!   once with [`Error::Overloaded`](crate::Error::Overloaded), so overload is
//!   shed instead of turning into unbounded latency and memory.
//! - [`timeout`](BatcherBuilder::timeout) bounds each request's wait; a
//!   [`load_timeout`](BatcherBuilder::load_timeout) also frees the slot of a
//!   hung load.

mod builder;
mod handle;
mod loader;
mod message;
mod worker;

pub use builder::{defaults, BatcherBuilder, FlushPolicy, Overflow, Pair};
pub use handle::Batcher;
pub use loader::{loader_fn, Loader, LoaderFn};
pub use worker::Worker;
