//! The running service: [`AppState`](state::AppState), built once from
//! the settings and shared by every handler, and the background task that
//! keeps its caches coherent with other instances.
//!
//! Imports from `metrics`, `domain`, `cluster`, `db` and `settings`; only
//! `http`, `cli` and the crate root import from here.

pub mod invalidation;
pub mod state;
