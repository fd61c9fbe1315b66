//! All of the service's SQL, one module per table or concern: the lookups
//! as [`BatchQuery`](pgbatch::pg::BatchQuery)s, the upsert the writer
//! runs, and the plain statements of writes, authentication and set-up.
//! What they answer with, where the service hands it out, is `model`'s
//! (`ObjectStats`, `Repository`, `TokenInfo`, ...); a row only the
//! database sees (`ObjectRow`) is defined here.
//! Elsewhere only what cannot live here: the migrations themselves
//! (`migrations/`) and the listener's `LISTEN`.

pub mod auth;
pub mod kv;
pub mod objects;
pub mod repositories;
pub mod system;
