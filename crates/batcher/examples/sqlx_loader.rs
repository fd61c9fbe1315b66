//! A `SqlxLoader` on sqlx's `PgPool`: concurrent single-row lookups become
//! one `SELECT ... WHERE id = ANY($1)` per batch, read into your own row
//! type. `pgbatch` is the only dependency it needs: it re-exports sqlx
//! (`pgbatch::sqlx::sqlx`).
//!
//! It creates, fills and finally drops a table `pgbatch_example_sqlx_users`
//! in the database `DATABASE_URL` names, so point it at a scratch database:
//!
//! ```sh
//! DATABASE_URL='postgres://postgres@localhost/scratch' \
//!     cargo run -p pgbatch --features sqlx --example sqlx_loader
//! ```

use std::time::Duration;

use pgbatch::sqlx::sqlx::{self, postgres::PgPoolOptions};
use pgbatch::sqlx::{BatchQuery, PgQuery, SqlxLoader};
use pgbatch::{Batcher, Concurrency};

/// Users by id: the statement for a batch of ids, how the ids are bound to
/// it, and the row each id maps to.
struct UsersById;

impl BatchQuery for UsersById {
    type Key = i64;
    /// A tuple is a sqlx `FromRow` already; a struct of yours can be too.
    type Row = (i64, String);
    type Value = String;

    fn batch_sql(&self) -> &str {
        // One array parameter: the same prepared statement for every batch
        // size (an `IN ($1, $2, ...)` list would be a new one each time).
        "SELECT id, name FROM pgbatch_example_sqlx_users WHERE id = ANY($1)"
    }
    fn bind_batch<'q>(&self, query: PgQuery<'q>, keys: &'q [i64]) -> PgQuery<'q> {
        query.bind(keys)
    }
    fn map_row(&self, (id, name): (i64, String)) -> (i64, String) {
        (id, name)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .ok_or("set DATABASE_URL to a scratch database (see the example's docs)")?;
    let pool = PgPoolOptions::new()
        .max_connections(8)
        // sqlx's default is 30 s. The loader waits at most 1 s for a
        // connection whatever this says (`SqlxLoader::acquire_timeout`),
        // so an outage reaches callers as a retryable error within their
        // deadline; this bounds everything else on the pool.
        .acquire_timeout(Duration::from_secs(2))
        .connect(&url)
        .await?;

    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS pgbatch_example_sqlx_users (id bigint PRIMARY KEY, name text NOT NULL);
         INSERT INTO pgbatch_example_sqlx_users
           SELECT n, 'user ' || n FROM generate_series(1, 10000) AS n
           ON CONFLICT DO NOTHING;",
    )
    .execute(&pool)
    .await?;

    let users: Batcher<i64, String> = Batcher::builder()
        .name("users")
        // Loads at once: found by measurement, never more than the pool's
        // 8 connections.
        .concurrency(Concurrency::Auto { max: 8 })
        .timeout(Duration::from_millis(500))
        .build(SqlxLoader::new(pool.clone(), UsersById))?;

    let tasks: Vec<_> = (1..=2_000i64)
        .map(|id| {
            let users = users.clone();
            tokio::spawn(async move { users.load(id * 7).await })
        })
        .collect();
    let mut found = 0;
    for task in tasks {
        match task.await? {
            Ok(Some(_)) => found += 1,
            Ok(None) => {}
            // The cause is in the message: "batch load failed: ...".
            Err(e) => {
                return Err(format!("lookup failed (retryable: {}): {e}", e.is_retryable()).into())
            }
        }
    }
    let stats = users.stats();
    println!(
        "{found} of 2000 found with {} statements (mean batch {:.1} keys)",
        stats.batches,
        stats.batch_size.mean().unwrap_or(0.0)
    );

    users.shutdown().await;
    sqlx::raw_sql("DROP TABLE pgbatch_example_sqlx_users")
        .execute(&pool)
        .await?;
    Ok(())
}
