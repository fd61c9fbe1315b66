//! A database set up the way the service sets up its own, for tests and
//! benchmarks: fresh, migrated, seeded, with an admin whose token is known.

use crate::db::{self, seed, Postgres};
use crate::domain::auth;

/// A fresh database (in a throwaway cluster the calling process starts, or
/// on `DATABASE_URL` when set), migrated and seeded by the service's own
/// code with `objects` demo objects and `kv_rows` `random_read_test` rows,
/// and with user `admin` holding `admin_token`.
///
/// # Errors
///
/// When no database can be had, or setting it up fails.
pub async fn seeded_database(
    objects: u64,
    kv_rows: u64,
    admin_token: &str,
) -> anyhow::Result<tokio_postgres::Config> {
    let db = embedded_pg::testing::database().await?;
    prepare(&db.config, objects, kv_rows, admin_token).await?;
    Ok(db.config)
}

/// Sets up the database at `target` as [`seeded_database`] does its own,
/// for tests and benchmarks that need a cluster of their own (one they
/// stop, freeze, replicate or put a pooler in front of).
///
/// # Errors
///
/// When migrating, seeding or creating the admin fails.
pub async fn prepare(
    target: impl Into<Postgres>,
    objects: u64,
    kv_rows: u64,
    admin_token: &str,
) -> anyhow::Result<()> {
    let target = target.into();
    db::migrate(&target).await?;
    seed::seed(&target, objects, kv_rows).await?;
    auth::bootstrap_admin(&target, Some(admin_token)).await?;
    Ok(())
}
