//! A cluster of nodes: cross-instance invalidation, read replicas, and a primary failover.
//!
//! One test binary per folder, each file a module: every binary is a link
//! of the whole server on 2 cores, so fewer binaries build faster.

#[path = "../support/mod.rs"]
mod support;

mod coherence;
mod failover;
mod replicas;
