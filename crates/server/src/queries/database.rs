//! Statements about the database as a whole rather than one table's rows:
//! the readiness check, creating the embedded cluster's database, and
//! taking an empty table for a bulk load.

use tokio_postgres::{Client, GenericClient, Transaction};

/// One trivial round trip: the database answers.
///
/// # Errors
///
/// When it does not.
pub async fn ping(client: &Client) -> Result<(), tokio_postgres::Error> {
    client.simple_query("SELECT 1").await?;
    Ok(())
}

/// Creates database `name` unless it exists (on a connection to another
/// database of the cluster).
///
/// # Errors
///
/// When a statement fails.
pub async fn create_database_if_missing(
    client: &Client,
    name: &str,
) -> Result<(), tokio_postgres::Error> {
    let exists = client
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await?
        .is_some();
    if !exists {
        client
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await?;
    }
    Ok(())
}

/// Locks `table` for the rest of `tx` and, if it is empty, truncates it so
/// that `COPY ... FREEZE` may load it in the same transaction; `false` (and
/// nothing truncated) when it has rows.
///
/// # Errors
///
/// When a statement fails.
pub async fn take_if_empty(
    tx: &Transaction<'_>,
    table: &str,
) -> Result<bool, tokio_postgres::Error> {
    // Checked under the lock, so rows that arrive meanwhile are never
    // truncated away.
    tx.batch_execute(&format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
        .await?;
    let has_rows: bool = tx
        .query_one(&format!("SELECT EXISTS (SELECT 1 FROM {table})"), &[])
        .await?
        .get(0);
    if has_rows {
        return Ok(false);
    }
    // Truncating the (empty) table in this transaction lets COPY FREEZE
    // write rows already frozen (no hint-bit rewrites on first read) and,
    // with wal_level=minimal, skip WAL for them.
    tx.batch_execute(&format!("TRUNCATE {table}")).await?;
    Ok(true)
}

/// Rows in `table`.
///
/// # Errors
///
/// When the statement fails.
pub async fn count_rows<C: GenericClient>(
    client: &C,
    table: &str,
) -> Result<u64, tokio_postgres::Error> {
    let n: i64 = client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await?
        .get(0);
    Ok(u64::try_from(n).unwrap_or(0))
}
