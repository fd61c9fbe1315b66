//! The engine against in-memory loaders, on virtual time where it can: the
//! batcher's behaviour, the automatic concurrency limit, a property test
//! under random concurrency, cancellation and failures, a seeded
//! simulation on the paused clock, and the cache.
//!
//! One test binary per folder, each file a module: every binary is a link
//! of its own on 2 cores, so fewer binaries build faster.
//! `cargo test --test engine cache::` runs one file's tests.

#[path = "../support/mod.rs"]
mod support;

mod auto_limit;
mod batcher;
#[cfg(feature = "cache")]
mod cache;
// Its regressions are in `../proptest-regressions/property.txt`: proptest
// keeps them in a `proptest-regressions/` folder beside the nearest one
// above the test that holds a `main.rs` (this one), not beside the file.
mod property;
mod scopes;
mod sim;
