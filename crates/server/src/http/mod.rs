//! The HTTP edge: connections, the middlewares every request passes, the
//! handlers, and the OpenAPI document that states their contract.
//!
//! A request goes `serve` (the connection) → `observe` (id, span, metrics,
//! caught panic) → `guard` (deadline, token check, write positions) → a
//! handler in `routes` → `domain`. Imports from every layer below (`service`,
//! `metrics`, `domain`, `cluster`, `db`, `settings`, `model`); only `cli` and
//! the crate root import from here. The handlers answer with `model`'s types
//! and reach the database through `domain` (`/readyz` through `db::ping`),
//! never `db::queries`.

pub mod deadline;
pub mod error;
pub mod extract;
pub mod guard;
pub mod observe;
pub mod openapi;
pub mod position;
pub(crate) mod routes;
pub mod serve;
