//! The data the service hands out: objects and their stats
//! ([`objects`]), repositories ([`repositories`]), tokens, grants and the
//! principal a token is ([`auth`]). Plain types, each with its JSON shape (serde) and, where
//! the API shows it, its OpenAPI schema (utoipa, named after the type):
//! `db` reads rows into them, `domain` passes them along, `http` answers
//! with them.
//!
//! Imports nothing of the crate; every layer may import from here. What
//! only one layer needs stays there: a table's row as written
//! (`db::queries::objects::ObjectRow`), a route's own body.

pub mod auth;
pub mod objects;
pub mod repositories;
