//! What the service does, independent of routes, status codes and
//! headers (an import takes the request body as a stream, nothing more of
//! HTTP): reads through lookups and caches, writes that invalidate them, imports, listings, tokens and
//! grants, input validation, and the one domain error.
//!
//! Imports from `cluster`, `db`, `settings` and `model` only.

pub mod auth;
pub mod failure;
pub mod import;
pub mod input;
pub mod invalidation;
pub mod listing;
pub mod lookup;
pub mod reads;
pub mod writes;
