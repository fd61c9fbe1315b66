//! What the metrics promise: the Grafana dashboard names only exported series,
//! and the automatic limit shows where it stands.
//!
//! One test binary per folder, each file a module: every binary is a link
//! of the whole server on 2 cores, so fewer binaries build faster.

#[path = "../support/mod.rs"]
mod support;

mod grafana;
mod limit;
