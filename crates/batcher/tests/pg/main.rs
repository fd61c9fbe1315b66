//! The Postgres loaders, writers and imports against real servers (the
//! workspace's embedded-pg: a shared cluster, or private ones for fault
//! tests), behind PgBouncer, across failovers; the same for sqlx; and the
//! GraphQL example.
//!
//! One test binary per folder, each file a module: every binary is a link
//! of its own on 2 cores, so fewer binaries build faster. Each file needs
//! its own features, so each module is gated on them rather than the
//! binary on their union. `cargo test --test pg sqlx_writer::` runs one
//! file's tests.

#[cfg(all(feature = "postgres", feature = "sqlx"))]
mod errors;
#[cfg(all(feature = "postgres", feature = "sqlx", feature = "cache"))]
mod examples;
#[cfg(all(feature = "postgres", feature = "cache"))]
mod graphql;
#[cfg(all(feature = "postgres", feature = "sqlx", feature = "cache"))]
mod lists;
#[cfg(feature = "postgres")]
mod pg_failover;
#[cfg(feature = "postgres")]
mod pg_loader;
#[cfg(feature = "postgres")]
mod pg_pooler;
#[cfg(feature = "postgres")]
mod pg_writer;
#[cfg(all(feature = "postgres", feature = "sqlx", feature = "cache"))]
mod scopes;
#[cfg(feature = "sqlx")]
mod sqlx_connect;
#[cfg(feature = "sqlx")]
mod sqlx_loader;
#[cfg(feature = "sqlx")]
mod sqlx_writer;
