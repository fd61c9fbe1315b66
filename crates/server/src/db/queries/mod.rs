//! All of the service's SQL, one module per table or concern: the lookups
//! as [`BatchQuery`](pgbatch::pg::BatchQuery)s, the upsert the writer
//! runs, and the plain statements of writes, authentication and set-up.
//! No other module holds SQL.

pub mod auth;
pub mod kv;
pub mod objects;
pub mod repositories;
pub mod system;
