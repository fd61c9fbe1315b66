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
    let rows = pgbatch::Loader::load(&loader, keys)
        .await
        .unwrap()
        .into_values();
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
    let one = pgbatch::Loader::load(&loader, vec![pk(3)])
        .await
        .unwrap()
        .into_values();
    assert_eq!(one, HashMap::from([(pk(3), "single".to_owned())]));
    let two = pgbatch::Loader::load(&loader, vec![pk(3), pk(4)])
        .await
        .unwrap()
        .into_values();
    assert_eq!(two[&pk(3)], "batch");
    assert_eq!(two.len(), 2);
    assert!(pgbatch::Loader::load(&loader, vec![pk(0)])
        .await
        .unwrap()
        .into_values()
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
    assert!(err.is_retryable(), "a saturated pool may have room later");
    assert_eq!(
        err.to_string(),
        "no database connection available: Timeout occurred while waiting for a slot to become available"
    );
}

/// The pool hands out the connection used last: a batcher at its limit
/// keeps reusing a few warm server processes instead of cycling through
/// the whole pool, which on a CPU-bound server read 0.75 of a hand-written
/// batcher's throughput with first-in-first-out (BENCHMARKS.md, "The engine against a hand-written batcher").
#[tokio::test]
async fn the_pool_hands_out_the_connection_returned_last() {
    let db = embedded_pg::testing::database().await.unwrap();
    let pool = pg::pool(db.config, &PoolOptions::with_max_size(4)).unwrap();
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(pool.get().await.unwrap());
    }
    let mut pids = Vec::new();
    for client in &held {
        let row = client.query_one("SELECT pg_backend_pid()", &[]).await;
        pids.push(row.unwrap().get::<_, i32>(0));
    }
    // Returned in order: the last one back is `pids[3]`.
    for client in held {
        drop(client);
    }
    for _ in 0..3 {
        let client = pool.get().await.unwrap();
        let row = client.query_one("SELECT pg_backend_pid()", &[]).await;
        assert_eq!(
            row.unwrap().get::<_, i32>(0),
            pids[3],
            "not the warmest connection"
        );
    }
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
        assert!(!pg_err.is_retryable(), "a missing table fails again");
        assert!(!err.is_retryable());
    }
}

/// `pairs(a int, b int, v text, PRIMARY KEY (a, b))`, looked up by both
/// columns with only the batch statement: the single-key one is the
/// default.
struct Pairs;

impl BatchQuery for Pairs {
    type Key = (i32, i32);
    type Value = String;

    fn batch_sql(&self) -> &str {
        "SELECT p.a, p.b, p.v FROM pairs p \
         JOIN unnest($1::int4[], $2::int4[]) AS k(a, b) ON (p.a, p.b) = (k.a, k.b)"
    }
    fn batch_params<'a>(&self, keys: &'a [(i32, i32)]) -> Params<'a> {
        let (a, b): (Vec<i32>, Vec<i32>) = keys.iter().copied().unzip();
        vec![Box::new(a), Box::new(b)]
    }
    fn map_row(&self, row: &Row) -> Result<((i32, i32), String), tokio_postgres::Error> {
        Ok(((row.try_get(0)?, row.try_get(1)?), row.try_get(2)?))
    }
}

#[tokio::test]
async fn a_composite_key_needs_only_the_batch_statement() {
    let db = embedded_pg::testing::database().await.unwrap();
    let pool = pg::pool(db.config, &PoolOptions::with_max_size(2)).unwrap();
    pool.get()
        .await
        .unwrap()
        .batch_execute(
            "CREATE TABLE pairs (a int, b int, v text NOT NULL, PRIMARY KEY (a, b));
             INSERT INTO pairs SELECT a, b, a || '/' || b
               FROM generate_series(1, 30) a, generate_series(1, 30) b;",
        )
        .await
        .unwrap();
    let loader = PgLoader::new(pool, Pairs);
    // A batch of one runs the default single-key statement.
    assert_eq!(
        loader.load_one(&(3, 4)).await.unwrap().as_deref(),
        Some("3/4")
    );
    assert_eq!(loader.load_one(&(3, 31)).await.unwrap(), None);
    let batcher = Batcher::new(loader);
    let keys: Vec<(i32, i32)> = (1..=40).map(|n| (n % 31, (n * 7) % 33)).collect();
    let got = batcher.load_many(keys.clone()).await;
    for (key, got) in keys.iter().zip(got) {
        let want = (1..=30).contains(&key.0) && (1..=30).contains(&key.1);
        assert_eq!(
            got.unwrap(),
            want.then(|| format!("{}/{}", key.0, key.1)),
            "{key:?}"
        );
    }
}

#[tokio::test]
async fn retryable_errors_are_told_from_the_rest_by_the_server_s_answer() {
    let db = embedded_pg::testing::database().await.unwrap();
    let pool = pg::pool(db.config, &PoolOptions::with_max_size(2)).unwrap();
    let client = pool.get().await.unwrap();
    for (sql, retryable) in [
        (
            "DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '40001'; END $$",
            true,
        ),
        (
            "DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '40P01'; END $$",
            true,
        ),
        (
            "DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '53300'; END $$",
            true,
        ),
        (
            "DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '57P03'; END $$",
            true,
        ),
        ("SELEC 1", false),
        ("SELECT 1/0", false),
        (
            "CREATE TABLE t (k int PRIMARY KEY); INSERT INTO t VALUES (1), (1)",
            false,
        ),
    ] {
        let err: PgError = client.batch_execute(sql).await.unwrap_err().into();
        assert!(err.as_db_error().is_some(), "{sql}: {err:?}");
        assert_eq!(err.is_retryable(), retryable, "{sql}: {err:?}");
        let through_batcher = Error::load(err);
        assert_eq!(through_batcher.is_retryable(), retryable, "{sql}");
    }
    // A connection the server ended: retryable, with no server report left
    // on the next statement.
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let other = pool.get().await.unwrap();
    other
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    let mut lost = None;
    for _ in 0..50 {
        match client.simple_query("SELECT 1").await {
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => {
                lost = Some(PgError::from(e));
                break;
            }
        }
    }
    let lost = lost.expect("the terminated connection fails");
    assert_eq!(lost.kind(), pg::DbErrorKind::Unavailable, "{lost:?}");
    assert!(lost.is_retryable());
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
    assert!(
        !err.is_retryable(),
        "a statement out of time would only load the server more"
    );
}
