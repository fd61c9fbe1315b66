//! The Postgres loader against a real server: one statement per batch, an
//! index scan, and errors that say what went wrong.

use std::collections::HashMap;
use std::time::Duration;

use pgbatch::pg::{self, BatchQuery, Params, PgError, PgLoader, PoolOptions};
use pgbatch::{Batcher, Error};
use tokio_postgres::Row;

/// `kv(pk text PRIMARY KEY, payload text NOT NULL)`, the seed's table shape.
struct Kv;

impl BatchQuery for Kv {
    type Key = String;
    type Value = String;

    fn batch_sql(&self) -> &str {
        "SELECT pk, payload FROM kv WHERE pk = ANY($1)"
    }
    fn batch_params<'a>(&self, keys: &'a [String]) -> Params<'a> {
        vec![Box::new(keys)]
    }
    fn single_sql(&self) -> &str {
        "SELECT pk, payload FROM kv WHERE pk = $1"
    }
    fn single_params<'a>(&self, key: &'a String) -> Params<'a> {
        vec![Box::new(key)]
    }
    fn map_row(&self, row: &Row) -> Result<(String, String), tokio_postgres::Error> {
        Ok((row.try_get(0)?, row.try_get(1)?))
    }
}

const ROWS: i64 = 20_000;

fn pk(n: i64) -> String {
    format!("{n:020}")
}

async fn kv_pool(max_size: usize) -> pg::Pool {
    let db = embedded_pg::testing::database()
        .await
        .expect("test database");
    let pool = pg::pool(db.config, &PoolOptions::with_max_size(max_size)).unwrap();
    let client = pool.get().await.unwrap();
    client
        .batch_execute(&format!(
            "CREATE TABLE kv (pk text PRIMARY KEY, payload text NOT NULL);
             INSERT INTO kv SELECT lpad(n::text, 20, '0'), n::text || ' - payload'
               FROM generate_series(1, {ROWS}) AS n;
             ANALYZE kv;"
        ))
        .await
        .unwrap();
    pool
}

#[tokio::test]
async fn a_batch_returns_found_rows_and_omits_missing_keys() {
    let loader = PgLoader::new(kv_pool(2).await, Kv);
    let keys = vec![pk(1), pk(ROWS), pk(ROWS + 1), "nope".to_owned()];
    let rows = pgbatch::Loader::load(&loader, keys).await.unwrap();
    let expected: HashMap<_, _> = [
        (pk(1), "1 - payload".to_owned()),
        (pk(ROWS), format!("{ROWS} - payload")),
    ]
    .into();
    assert_eq!(rows, expected);
    assert_eq!(
        loader.load_one(&pk(7)).await.unwrap().as_deref(),
        Some("7 - payload")
    );
    assert_eq!(loader.load_one(&pk(0)).await.unwrap(), None);
}

/// [`Kv`] with statements that say which one answered.
struct Tagged;

impl BatchQuery for Tagged {
    type Key = String;
    type Value = String;

    fn batch_sql(&self) -> &str {
        "SELECT pk, 'batch' FROM kv WHERE pk = ANY($1)"
    }
    fn batch_params<'a>(&self, keys: &'a [String]) -> Params<'a> {
        vec![Box::new(keys)]
    }
    fn single_sql(&self) -> &str {
        "SELECT pk, 'single' FROM kv WHERE pk = $1"
    }
    fn single_params<'a>(&self, key: &'a String) -> Params<'a> {
        vec![Box::new(key)]
    }
    fn map_row(&self, row: &Row) -> Result<(String, String), tokio_postgres::Error> {
        Ok((row.try_get(0)?, row.try_get(1)?))
    }
}

#[tokio::test]
async fn a_batch_of_one_runs_the_single_key_statement() {
    let loader = PgLoader::new(kv_pool(2).await, Tagged);
    let one = pgbatch::Loader::load(&loader, vec![pk(3)]).await.unwrap();
    assert_eq!(one, HashMap::from([(pk(3), "single".to_owned())]));
    let two = pgbatch::Loader::load(&loader, vec![pk(3), pk(4)])
        .await
        .unwrap();
    assert_eq!(two[&pk(3)], "batch");
    assert_eq!(two.len(), 2);
    assert!(pgbatch::Loader::load(&loader, vec![pk(0)])
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn the_batch_statement_uses_the_primary_key_index() {
    let pool = kv_pool(1).await;
    let client = pool.get().await.unwrap();
    let keys: Vec<String> = (1..=16).map(|n| pk(n * 997)).collect();
    let plan: Vec<String> = client
        .query(&format!("EXPLAIN {}", Kv.batch_sql()), &[&keys])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let plan = plan.join("\n");
    assert!(
        plan.contains("Index Scan") || plan.contains("Index Only Scan"),
        "{plan}"
    );
    assert!(!plan.contains("Seq Scan"), "{plan}");
}

#[tokio::test]
async fn concurrent_lookups_through_a_batcher_match_single_key_lookups() {
    let loader = PgLoader::new(kv_pool(4).await, Kv);
    let batcher: Batcher<String, String> = Batcher::builder()
        .max_concurrent_batches(2)
        .build(loader.clone())
        .unwrap();

    // Keys spread over the table, some missing, some repeated.
    let keys: Vec<String> = (0..500).map(|i| pk((i * 7919) % (ROWS + 300))).collect();
    let tasks: Vec<_> = keys
        .iter()
        .cloned()
        .map(|k| {
            let b = batcher.clone();
            tokio::spawn(async move { b.load(k).await })
        })
        .collect();
    for (key, task) in keys.iter().zip(tasks) {
        let batched = task.await.unwrap().unwrap();
        let single = loader.load_one(key).await.unwrap();
        assert_eq!(batched, single, "key {key}");
    }
    let stats = batcher.stats();
    assert!(
        stats.batches < 500,
        "500 concurrent lookups took {} statements",
        stats.batches
    );
}

#[tokio::test]
async fn an_exhausted_pool_times_out_with_a_typed_error() {
    let db = embedded_pg::testing::database().await.unwrap();
    let mut options = PoolOptions::with_max_size(1);
    options.wait_timeout = Duration::from_millis(100);
    let pool = pg::pool(db.config, &options).unwrap();
    let _held = pool.get().await.unwrap();

    let err = PgLoader::new(pool.clone(), Kv)
        .load_one(&pk(1))
        .await
        .unwrap_err();
    assert!(err.is_pool_timeout(), "{err:?}");
    assert_eq!(err.to_string(), "no database connection available");
}

#[tokio::test]
async fn a_failing_statement_reaches_every_waiter_with_the_server_error() {
    // No `kv` table in this database.
    let db = embedded_pg::testing::database().await.unwrap();
    let pool = pg::pool(db.config, &PoolOptions::with_max_size(1)).unwrap();
    let batcher: Batcher<String, String> = Batcher::new(PgLoader::new(pool, Kv));

    let results = batcher.load_many([pk(1), pk(2)]).await;
    for r in results {
        let err = r.unwrap_err();
        assert!(matches!(err, Error::Load(_)), "{err:?}");
        let pg_err = err.load_error::<PgError>().expect("a PgError");
        let db_err = pg_err.as_db_error().expect("a server error");
        assert_eq!(db_err.code().code(), "42P01", "undefined_table: {db_err}");
        assert_eq!(pg_err.kind(), pg::DbErrorKind::Other);
    }
}

#[tokio::test]
async fn a_statement_timeout_is_reported_as_such() {
    let db = embedded_pg::testing::database().await.unwrap();
    let mut config = db.config.clone();
    config.options("-c statement_timeout=50");
    let pool = pg::pool(config, &PoolOptions::with_max_size(1)).unwrap();
    let client = pool.get().await.unwrap();
    let err: PgError = client
        .simple_query("SELECT pg_sleep(1)")
        .await
        .unwrap_err()
        .into();
    assert!(err.is_statement_timeout(), "{err:?}");
    assert_eq!(err.kind(), pg::DbErrorKind::StatementTimeout);
    assert!(!err.is_pool_timeout());
}
