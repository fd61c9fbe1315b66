//! Statements about the database as a whole rather than one table's rows:
//! the readiness check, creating the embedded cluster's database, taking
//! an empty table for a bulk load, counting rows, a session's backend pid,
//! sending a notification, and the WAL positions replicas are judged by.

use tokio_postgres::types::{PgLsn, Type};
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
        .query_typed_opt(
            "SELECT 1 FROM pg_database WHERE datname = $1",
            &[(&name, Type::TEXT)],
        )
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
        .query_typed_one(&format!("SELECT EXISTS (SELECT 1 FROM {table})"), &[])
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

/// The process id of the server process running `client`'s statement
/// (through a pooler: of whichever server connection it got).
///
/// # Errors
///
/// When the statement fails.
pub async fn backend_pid<C: GenericClient>(client: &C) -> Result<i32, tokio_postgres::Error> {
    client
        .query_typed_one("SELECT pg_backend_pid()", &[])
        .await?
        .try_get(0)
}

/// Sends `payload` on notification `channel`, in a transaction of its own
/// (delivered at once). One unnamed statement with both as parameters:
/// safe through any pooler, whatever the text.
///
/// # Errors
///
/// When the statement fails.
pub async fn notify<C: GenericClient>(
    client: &C,
    channel: &str,
    payload: &str,
) -> Result<(), tokio_postgres::Error> {
    client
        .query_typed(
            "SELECT pg_notify($1, $2)",
            &[(&channel, Type::TEXT), (&payload, Type::TEXT)],
        )
        .await
        .map(drop)
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
        .query_typed_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await?
        .get(0);
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The insert position, minus the page header it points past when the
/// last record ended exactly at a page's end (40 bytes at a segment's
/// start, 24 at a page's): Postgres reports the insert position as where
/// the next record's bytes will go, which no replica ever reports as
/// replayed, so without this an idle primary (just after a WAL segment
/// switch, say) would show every replica behind forever. The header sizes
/// are Postgres's on 64-bit machines.
const WAL_POSITION: &str = "\
WITH p(lsn) AS (SELECT pg_current_wal_insert_lsn()) \
SELECT CASE \
    WHEN (lsn - '0/0') % pg_size_bytes(current_setting('wal_segment_size')) = 40 THEN lsn - 40 \
    WHEN (lsn - '0/0') % current_setting('wal_block_size')::int = 24 THEN lsn - 24 \
    ELSE lsn END \
FROM p";

/// The primary's current WAL insert position: every transaction that has
/// committed before this is read is at or before it, so a replica that has
/// replayed up to it shows them all (read-your-writes positions, cache
/// fill floors, lag samples).
///
/// # Errors
///
/// When the statement fails (on a replica, for one).
pub async fn wal_position(client: &impl GenericClient) -> Result<PgLsn, tokio_postgres::Error> {
    let row = client.query_typed_one(WAL_POSITION, &[]).await?;
    row.try_get(0)
}

/// Whether this server is a replica (in recovery), and the WAL position it
/// has replayed up to (`None` before it replayed anything, or when it is
/// not a replica).
///
/// # Errors
///
/// When the statement fails.
pub async fn replay_state(client: &Client) -> Result<(bool, Option<PgLsn>), tokio_postgres::Error> {
    let row = client
        .query_typed_one("SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()", &[])
        .await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}
