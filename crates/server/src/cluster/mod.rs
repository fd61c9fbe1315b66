//! Several instances and read replicas: which database serves a read
//! (`replicas`), and whether caches may be used at all (`coherence`, off
//! while this instance cannot hear the others' changes).
//!
//! Imports from `db` and `settings` only; the listener that applies other
//! instances' changes needs the caches, so it lives above, in
//! `service::invalidation`.

pub mod coherence;
pub mod replicas;
