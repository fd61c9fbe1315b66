//! A `PgLoader` on a pool: concurrent single-row lookups become one
//! `SELECT ... WHERE id = ANY($1)` per batch.
//!
//! It creates, fills and finally drops a table `pgbatch_example_users` in
//! the database `DATABASE_URL` names, so point it at a scratch database:
//!
//! ```sh
//! DATABASE_URL='host=/var/run/postgresql user=postgres dbname=scratch' \
//!     cargo run -p pgbatch --features postgres --example pg_loader
//! ```
//!
//! For a server that requires TLS, build the pool with
//! `pg::pool_with_tls` and a connector such as tokio-postgres-rustls'.

use std::time::Duration;

// The driver's types come through the crate (`pgbatch::pg::tokio_postgres`):
// `pgbatch` is the only dependency this needs.
use pgbatch::pg::tokio_postgres::{Error as PgDriverError, Row};
use pgbatch::pg::{self, BatchQuery, Params, PgLoader, PoolOptions};
use pgbatch::{Batcher, Concurrency};

/// Users by id: how to look up many ids with one statement, and one.
struct UsersById;

impl BatchQuery for UsersById {
    type Key = i64;
    type Value = String;

    fn batch_sql(&self) -> &str {
        // One array parameter: the same prepared statement for every batch
        // size (an `IN ($1, $2, ...)` list would be a new one each time).
        "SELECT id, name FROM pgbatch_example_users WHERE id = ANY($1)"
    }
    fn batch_params<'a>(&self, keys: &'a [i64]) -> Params<'a> {
        vec![Box::new(keys)]
    }
    fn single_sql(&self) -> &str {
        "SELECT id, name FROM pgbatch_example_users WHERE id = $1"
    }
    fn single_params<'a>(&self, key: &'a i64) -> Params<'a> {
        vec![Box::new(key)]
    }
    fn map_row(&self, row: &Row) -> Result<(i64, String), PgDriverError> {
        Ok((row.try_get(0)?, row.try_get(1)?))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .ok_or("set DATABASE_URL to a scratch database (see the example's docs)")?;
    // `pool` sets the wait, create and recycle timeouts deadpool leaves
    // unset: a request never waits forever for a connection.
    let pool = pg::pool(url.parse()?, &PoolOptions::with_max_size(8))?;

    pool.get()
        .await?
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS pgbatch_example_users (id bigint PRIMARY KEY, name text NOT NULL);
             INSERT INTO pgbatch_example_users
               SELECT n, 'user ' || n FROM generate_series(1, 10000) AS n
               ON CONFLICT DO NOTHING;",
        )
        .await?;

    let users: Batcher<i64, String> = Batcher::builder()
        .name("users")
        // Loads at once: found by measurement, never more than the pool's
        // 8 connections.
        .concurrency(Concurrency::Auto { max: 8 })
        .timeout(Duration::from_millis(500))
        .build(PgLoader::new(pool.clone(), UsersById))?;

    let tasks: Vec<_> = (1..=2_000i64)
        .map(|id| {
            let users = users.clone();
            tokio::spawn(async move { users.load(id * 7).await })
        })
        .collect();
    let mut found = 0;
    for task in tasks {
        if task.await??.is_some() {
            found += 1;
        }
    }
    let stats = users.stats();
    println!(
        "{found} of 2000 found with {} statements (mean batch {:.1} keys)",
        stats.batches,
        stats.batch_size.mean().unwrap_or(0.0)
    );

    users.shutdown().await;
    pool.get()
        .await?
        .batch_execute("DROP TABLE pgbatch_example_users")
        .await?;
    Ok(())
}
