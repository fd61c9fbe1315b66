//! The micro-batching engine: [`Batcher`] handles, their [`Worker`], and the
//! [`Loader`] they call.
//!
//! ```text
//! caller ──load(k)──▶ bounded queue ──▶ Worker ──batch of keys──▶ Loader (own task)
//!    ▲                                   │ ◀──────values──────────────┘
//!    └──────────── oneshot reply ◀───────┘
//! ```
//!
//! # Choosing the settings
//!
//! - [`concurrency`](BatcherBuilder::concurrency) sets how many loads run at
//!   once. With the default [`FlushPolicy::Eager`] this is also what makes
//!   batches grow: keys wait only while every slot is busy, so an idle
//!   service pays no batching delay at all. By default
//!   ([`Concurrency::Auto`]) the worker finds the number by measurement, up
//!   to a bound you set near the number of database connections the
//!   loader may use.
//! - [`max_batch_size`](BatcherBuilder::max_batch_size) caps the keys per
//!   load. Loads hold at most 64 keys while another slot is free, and grow
//!   past that only under a backlog, toward this cap.
//! - [`channel_capacity`](BatcherBuilder::channel_capacity) bounds the queue;
//!   with the default [`Overflow::Reject`], a full queue fails requests at
//!   once with [`Error::Overloaded`](crate::Error::Overloaded), so overload is
//!   shed instead of turning into unbounded latency and memory.
//! - [`timeout`](BatcherBuilder::timeout) bounds each request's wait; a
//!   [`load_timeout`](BatcherBuilder::load_timeout) also frees the slot of a
//!   hung load.

//! # Modules
//!
//! A module uses only modules listed below it (`builder` and `handle` name
//! each other, as a type and its builder do):
//!
//! ```text
//! builder   BatcherBuilder: validates a Config, builds a pair or spawns it
//! handle    Batcher: enqueues keys, loads directly when idle, shuts down
//! worker    Worker: the async shell over the ledger: receives, times,
//!           runs each load in a task, answers
//! intake    a request into the ledger; what it hands back answered
//! alarm     a timer polled only while set
//! run       one load, whoever runs it: its start, timeout, panic capture,
//!           Outcome, its statistics, its answers
//! message   what travels from a handle to the worker
//! ledger    every decision, no I/O: lanes, running loads, deadlines, which
//!           keys of which scopes a load takes
//! policy    the flush policy's decisions, as pure functions
//! limit     the automatic concurrency limit: the search, as arithmetic
//! shared    state of the handles and the worker; the LoadSlot guard
//! queue     the bounded queue from the handles to the worker
//! observer  what a load tells whoever watches it (a cache built over it)
//! config    the validated settings and their defaults
//! loader    the Loader and ScopedLoader traits, loader_fn, scoped_loader_fn
//! loaded    Loaded: what a load returns, per key
//! ```

mod alarm;
mod builder;
mod config;
mod handle;
mod intake;
mod ledger;
mod limit;
mod loaded;
mod loader;
mod message;
mod observer;
mod policy;
mod queue;
mod run;
mod shared;
mod worker;

pub use builder::{BatcherBuilder, Pair};
pub use config::{defaults, Concurrency, FlushPolicy, Overflow};
pub use handle::Batcher;
pub use loaded::Loaded;
pub use loader::{loader_fn, scoped_loader_fn, Loader, LoaderFn, ScopedLoader, ScopedLoaderFn};
#[cfg(feature = "cache")]
pub(crate) use observer::{BoxFuture, Ended, Observer, ObserverFn, Stamp};
pub use worker::Worker;
