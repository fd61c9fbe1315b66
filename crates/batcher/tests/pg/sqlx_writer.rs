//! The sqlx micro-batched writer against a real server: concurrent upserts
//! share statements and transactions and are readable once acknowledged,
//! the later write of a key wins, a refused row fails only its caller,
//! upserts update existing rows, a batch failure commits nothing, unnamed
//! statements (also behind a real PgBouncer in transaction mode), and a
//! lost connection written again only for an idempotent query.

use std::time::Duration;

use embedded_pg::pgbouncer::{PgBouncer, PoolMode};
use pgbatch::sqlx::{
    classify, DbErrorKind, PgQuery, RowError, SqlxWriter, StatementMode, UpsertQuery, WriteRequest,
    WriteResult, Writer, Written,
};
use pgbatch::{BatcherBuilder, Error, FlushPolicy};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};

use crate::sqlx_connect::connect_options;
use sqlx::{Connection, PgConnection, Postgres, Row};

fn pool_options(max_connections: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
}

/// A database of this test's own.
async fn database() -> PgConnectOptions {
    let db = embedded_pg::testing::database()
        .await
        .expect("test database");
    connect_options(&db.config)
}

/// `items(k text PRIMARY KEY, v bigint NOT NULL CHECK (v >= 0))`.
const CREATE: &str = "CREATE TABLE items (k text PRIMARY KEY, v bigint NOT NULL CHECK (v >= 0))";

/// A pool of `max_connections` on a database of its own holding an empty
/// `items`.
async fn items_pool(max_connections: u32) -> PgPool {
    let pool = pool_options(max_connections)
        .connect_with(database().await)
        .await
        .unwrap();
    sqlx::raw_sql(CREATE).execute(&pool).await.unwrap();
    pool
}

/// Upserts into `items`, with a single-row statement of their own.
struct Items {
    idempotent: bool,
}

/// [`Items`], not idempotent (the default of `UpsertQuery`).
const ITEMS: Items = Items { idempotent: false };

impl UpsertQuery for Items {
    type Key = String;
    type Row = (String, i64);

    fn key(&self, row: &(String, i64)) -> String {
        row.0.clone()
    }
    fn batch_sql(&self) -> &str {
        "INSERT INTO items (k, v) SELECT * FROM unnest($1::text[], $2::int8[]) \
         ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v RETURNING k, (xmax = 0)"
    }
    fn bind_batch<'q>(&self, query: PgQuery<'q>, rows: &'q [(String, i64)]) -> PgQuery<'q> {
        let ks: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        let vs: Vec<i64> = rows.iter().map(|r| r.1).collect();
        query.bind(ks).bind(vs)
    }
    fn map_returned(&self, row: &PgRow) -> Result<(String, bool), sqlx::Error> {
        Ok((row.try_get(0)?, row.try_get(1)?))
    }
    fn single_sql(&self) -> &str {
        "INSERT INTO items (k, v) VALUES ($1, $2) \
         ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v RETURNING k, (xmax = 0)"
    }
    fn bind_single<'q>(&self, query: PgQuery<'q>, row: &'q (String, i64)) -> PgQuery<'q> {
        query.bind(row.0.as_str()).bind(row.1)
    }
    fn is_idempotent(&self) -> bool {
        self.idempotent
    }
}

/// `items`, in key order. Unnamed, like every read of the tests' own, so
/// that the session's named statements are the writer's.
async fn table(pool: &PgPool) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT k, v FROM items ORDER BY k")
        .persistent(false)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// How many transactions wrote the rows of `items` now there: the rows a
/// transaction wrote carry its id as their `xmin`.
async fn transactions(pool: &PgPool) -> u64 {
    let n: i64 = sqlx::query_scalar("SELECT count(DISTINCT xmin::text) FROM items")
        .persistent(false)
        .fetch_one(pool)
        .await
        .unwrap();
    u64::try_from(n).unwrap()
}

fn kv(k: &str, v: i64) -> (String, i64) {
    (k.to_owned(), v)
}

/// Batching settings that flush exactly when three writes have arrived.
fn batches_of_three<Q: UpsertQuery>() -> BatcherBuilder<WriteRequest<Q::Row>, WriteResult> {
    Writer::builder()
        .policy(FlushPolicy::FixedDelay)
        .max_batch_size(3)
        .max_delay(Duration::from_secs(60))
}

/// A writer of `items` that flushes exactly when three writes have arrived,
/// over a pool of one connection: every batch, and every check of the
/// table, runs on the connection the previous batch left.
async fn items_in_threes() -> (PgPool, Writer<(String, i64)>) {
    let pool = items_pool(1).await;
    let writer = Writer::new(
        SqlxWriter::new(pool.clone(), ITEMS),
        batches_of_three::<Items>(),
    )
    .unwrap();
    (pool, writer)
}

/// The row refusal `result` failed with, with the batch as a whole not
/// failed.
fn refusal(result: Result<Written, Error>) -> (Error, DbErrorKind, String) {
    let err = result.expect_err("the row was refused");
    let row_err = err
        .load_error::<RowError>()
        .expect("a row refusal, not a batch failure");
    let code = row_err
        .as_db_error()
        .expect("the server's report")
        .code()
        .to_owned();
    let kind = row_err.kind();
    (err, kind, code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_share_batches_and_are_visible_once_acknowledged() {
    let pool = items_pool(4).await;
    let writer = Writer::new(SqlxWriter::new(pool.clone(), ITEMS), Writer::builder()).unwrap();

    let tasks: Vec<_> = (0..300)
        .map(|i| {
            let w = writer.clone();
            tokio::spawn(async move { w.write(kv(&format!("k{i:03}"), i)).await })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), Written::Created);
    }
    // Acknowledged means committed: a read on the pool sees every row, with
    // the value its caller wrote.
    let expected: Vec<(String, i64)> = (0..300).map(|i| kv(&format!("k{i:03}"), i)).collect();
    assert_eq!(table(&pool).await, expected);
    let batches = writer.stats().batches;
    assert!(
        batches < 300,
        "300 concurrent writes took {batches} statements"
    );
    // One transaction per batch, as the server counts them.
    assert_eq!(transactions(&pool).await, batches);
    assert_eq!(writer.stats().failed_batches, 0);

    assert_eq!(writer.write(kv("k000", 7)).await.unwrap(), Written::Updated);
    assert_eq!(table(&pool).await[0], kv("k000", 7));
}

#[tokio::test]
async fn within_a_batch_the_later_write_of_a_key_wins() {
    let (pool, writer) = items_in_threes().await;

    // join! polls in argument order, so that is the arrival order.
    let (a1, a2, b) = tokio::join!(
        writer.write(kv("a", 1)),
        writer.write(kv("a", 2)),
        writer.write(kv("b", 1)),
    );
    assert_eq!(writer.stats().batches, 1);
    assert_eq!(
        a1.unwrap(),
        Written::Created,
        "the first write of a new key created it"
    );
    assert_eq!(a2.unwrap(), Written::Updated);
    assert_eq!(b.unwrap(), Written::Created);
    assert_eq!(table(&pool).await, vec![kv("a", 2), kv("b", 1)]);
}

#[tokio::test]
async fn upserts_update_existing_rows() {
    let (pool, writer) = items_in_threes().await;
    sqlx::raw_sql("INSERT INTO items VALUES ('a', 1), ('b', 1)")
        .execute(&pool)
        .await
        .unwrap();

    let (a, c, b) = tokio::join!(
        writer.write(kv("a", 10)),
        writer.write(kv("c", 30)),
        writer.write(kv("b", 20)),
    );
    assert_eq!(writer.stats().batches, 1);
    assert_eq!(a.unwrap(), Written::Updated);
    assert_eq!(b.unwrap(), Written::Updated);
    assert_eq!(c.unwrap(), Written::Created);
    assert_eq!(
        table(&pool).await,
        vec![kv("a", 10), kv("b", 20), kv("c", 30)]
    );

    // The same through the row-by-row path a refused row sends its batch
    // down: an update still reads as one.
    let (a, b, d) = tokio::join!(
        writer.write(kv("a", 11)),
        writer.write(kv("b", -1)),
        writer.write(kv("d", 4)),
    );
    assert_eq!(writer.stats().batches, 2);
    assert_eq!(a.unwrap(), Written::Updated);
    assert_eq!(d.unwrap(), Written::Created);
    assert_eq!(refusal(b).1, DbErrorKind::OtherRowFault);
    assert_eq!(
        table(&pool).await,
        vec![kv("a", 11), kv("b", 20), kv("c", 30), kv("d", 4)]
    );
}

#[tokio::test]
async fn two_batches_with_the_same_keys_in_opposite_orders_do_not_deadlock() {
    let pool = items_pool(4).await;
    // Each row takes 0.3 s before it is inserted, so the two batches run
    // side by side: written in arrival order, each would hold its first key
    // while waiting for the other's, and Postgres would abort one of them
    // (40P01) after deadlock_timeout.
    sqlx::raw_sql(
        "CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_sleep(0.3); RETURN NEW; END $$; \
         CREATE TRIGGER slow_row BEFORE INSERT ON items \
         FOR EACH ROW EXECUTE FUNCTION slow_row()",
    )
    .execute(&pool)
    .await
    .unwrap();
    let builder = Writer::builder()
        .policy(FlushPolicy::FixedDelay)
        .max_batch_size(2)
        .max_concurrent_batches(2)
        .max_delay(Duration::from_secs(60));
    let writer = Writer::new(SqlxWriter::new(pool.clone(), ITEMS), builder).unwrap();

    // join! polls in argument order: batch one is (x, y), batch two (y, x).
    let (x1, y1, y2, x2) = tokio::join!(
        writer.write(kv("x", 1)),
        writer.write(kv("y", 1)),
        writer.write(kv("y", 2)),
        writer.write(kv("x", 2)),
    );
    for (name, r) in [("x1", x1), ("y1", y1), ("y2", y2), ("x2", x2)] {
        assert!(r.is_ok(), "{name}: {r:?}");
    }
    assert_eq!(writer.stats().batches, 2);
    // Both batches locked x first, so whichever got it second waited for
    // the other to commit and then overwrote both rows: the table holds one
    // batch's values, not a mix.
    let rows = table(&pool).await;
    assert!(
        rows == vec![kv("x", 1), kv("y", 1)] || rows == vec![kv("x", 2), kv("y", 2)],
        "{rows:?}"
    );
}

#[tokio::test]
async fn a_refused_row_fails_only_its_caller() {
    let (pool, writer) = items_in_threes().await;

    let (x, bad, y) = tokio::join!(
        writer.write(kv("x", 1)),
        writer.write(kv("bad", -1)),
        writer.write(kv("y", 2)),
    );
    // One batch: the others were committed with the refused row, not
    // apart from it.
    assert_eq!(writer.stats().batches, 1);
    assert_eq!(writer.stats().failed_batches, 0);
    assert_eq!(x.unwrap(), Written::Created);
    assert_eq!(y.unwrap(), Written::Created);
    let (err, kind, code) = refusal(bad);
    assert_eq!(code, "23514", "check_violation");
    assert_eq!(kind, DbErrorKind::OtherRowFault);
    assert!(
        !err.is_retryable(),
        "a refused row fails the same way again"
    );
    let row_err = err.load_error::<RowError>().unwrap();
    assert_eq!(
        row_err.as_db_error().unwrap().constraint(),
        Some("items_v_check")
    );
    assert_eq!(classify(row_err.as_sqlx_error()), kind);
    assert_eq!(table(&pool).await, vec![kv("x", 1), kv("y", 2)]);

    // Both writes of a key whose last row is refused are refused; the
    // connection the savepoints ran on serves the next batch.
    let (z1, w, z2) = tokio::join!(
        writer.write(kv("z", 1)),
        writer.write(kv("w", 1)),
        writer.write(kv("z", -1)),
    );
    assert_eq!(writer.stats().batches, 2);
    assert_eq!(w.unwrap(), Written::Created);
    assert_eq!(refusal(z1).2, "23514");
    assert_eq!(refusal(z2).2, "23514");
    assert_eq!(table(&pool).await, vec![kv("w", 1), kv("x", 1), kv("y", 2)]);
}

/// Upserts into `ledger`, whose key must be an account's: only the
/// required methods, so a refused batch is written again row by row with
/// the batch statement over one row.
struct Ledger;

impl UpsertQuery for Ledger {
    type Key = String;
    type Row = (String, i64);

    fn key(&self, row: &(String, i64)) -> String {
        row.0.clone()
    }
    fn batch_sql(&self) -> &str {
        "INSERT INTO ledger (k, v) SELECT * FROM unnest($1::text[], $2::int8[]) \
         ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v RETURNING k, (xmax = 0)"
    }
    fn bind_batch<'q>(&self, query: PgQuery<'q>, rows: &'q [(String, i64)]) -> PgQuery<'q> {
        let (ks, vs): (Vec<String>, Vec<i64>) = rows.iter().cloned().unzip();
        query.bind(ks).bind(vs)
    }
    fn map_returned(&self, row: &PgRow) -> Result<(String, bool), sqlx::Error> {
        Ok((row.try_get(0)?, row.try_get(1)?))
    }
}

async fn ledger(pool: &PgPool) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT k, v FROM ledger ORDER BY k")
        .persistent(false)
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_row_with_a_missing_reference_fails_only_its_caller() {
    let pool = pool_options(1)
        .connect_with(database().await)
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE TABLE accounts (k text PRIMARY KEY);
         CREATE TABLE ledger (k text PRIMARY KEY REFERENCES accounts, v bigint NOT NULL);
         INSERT INTO accounts VALUES ('a'), ('b'), ('c');",
    )
    .execute(&pool)
    .await
    .unwrap();
    let writer = Writer::new(
        SqlxWriter::new(pool.clone(), Ledger),
        batches_of_three::<Ledger>(),
    )
    .unwrap();

    let (a, ghost, b) = tokio::join!(
        writer.write(kv("a", 1)),
        writer.write(kv("ghost", 2)),
        writer.write(kv("b", 3)),
    );
    assert_eq!(writer.stats().batches, 1);
    assert_eq!(a.unwrap(), Written::Created);
    assert_eq!(b.unwrap(), Written::Created);
    let (_, kind, code) = refusal(ghost);
    assert_eq!(code, "23503", "foreign_key_violation");
    assert_eq!(kind, DbErrorKind::ForeignKeyViolation);
    assert_eq!(ledger(&pool).await, vec![kv("a", 1), kv("b", 3)]);

    // A batch with no refusal after it, on the same connection.
    let (b, c, a) = tokio::join!(
        writer.write(kv("b", 30)),
        writer.write(kv("c", 5)),
        writer.write(kv("a", 10)),
    );
    assert_eq!(writer.stats().batches, 2);
    assert_eq!(b.unwrap(), Written::Updated);
    assert_eq!(c.unwrap(), Written::Created);
    assert_eq!(a.unwrap(), Written::Updated);
    assert_eq!(
        ledger(&pool).await,
        vec![kv("a", 10), kv("b", 30), kv("c", 5)]
    );
}

#[tokio::test]
async fn a_database_failure_fails_the_whole_batch_and_commits_nothing() {
    let (pool, writer) = items_in_threes().await;
    // A failure that is not the row's: a serialization failure raised for
    // one row. The batch is not written row by row; every caller gets it.
    sqlx::raw_sql(
        "CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN IF NEW.k = 'boom' THEN \
              RAISE EXCEPTION 'boom' USING ERRCODE = '40001'; \
            END IF; RETURN NEW; END $$; \
         CREATE TRIGGER boom BEFORE INSERT ON items \
         FOR EACH ROW EXECUTE FUNCTION boom()",
    )
    .execute(&pool)
    .await
    .unwrap();

    let (a, boom, c) = tokio::join!(
        writer.write(kv("a", 1)),
        writer.write(kv("boom", 1)),
        writer.write(kv("c", 1)),
    );
    assert_eq!(writer.stats().batches, 1);
    assert_eq!(writer.stats().failed_batches, 1);
    for (name, r) in [("a", a), ("boom", boom), ("c", c)] {
        let err = r.expect_err(name);
        assert!(matches!(err, Error::Load(_)), "{name}: {err:?}");
        assert!(err.load_error::<RowError>().is_none(), "{name}: {err:?}");
        let e = err.load_error::<sqlx::Error>().expect("sqlx's error");
        assert_eq!(classify(e), DbErrorKind::Conflict, "{name}: {e:?}");
        assert!(err.is_retryable());
    }
    assert!(table(&pool).await.is_empty());

    // No table at all: the statement fails, but not because of a row.
    let pool = pool_options(1)
        .connect_with(database().await)
        .await
        .unwrap();
    let writer = Writer::new(SqlxWriter::new(pool, ITEMS), Writer::builder()).unwrap();
    let err = writer.write(kv("a", 1)).await.unwrap_err();
    assert!(matches!(err, Error::Load(_)), "{err:?}");
    assert!(err.load_error::<RowError>().is_none());
    let e = err.load_error::<sqlx::Error>().expect("sqlx's error");
    assert_eq!(
        e.as_database_error().and_then(|db| db.code()).as_deref(),
        Some("42P01"),
        "undefined_table: {e:?}"
    );
}

/// How many named prepared statements the session holds.
async fn prepared_statements(pool: &PgPool) -> i64 {
    sqlx::query_scalar::<Postgres, i64>("SELECT count(*) FROM pg_prepared_statements")
        .persistent(false)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn unnamed_statements_write_and_leave_nothing_prepared() {
    // One connection, so every statement below runs in the same session.
    let pool = items_pool(1).await;
    assert_eq!(prepared_statements(&pool).await, 0);

    let unnamed = Writer::new(
        SqlxWriter::with_statement_mode(pool.clone(), ITEMS, StatementMode::Unnamed),
        batches_of_three::<Items>(),
    )
    .unwrap();
    // The batch statement, then (for the refused row) the single one under
    // savepoints.
    let (x, bad, y) = tokio::join!(
        unnamed.write(kv("x", 1)),
        unnamed.write(kv("bad", -1)),
        unnamed.write(kv("y", 2)),
    );
    assert_eq!(x.unwrap(), Written::Created);
    assert_eq!(y.unwrap(), Written::Created);
    assert_eq!(refusal(bad).2, "23514");
    let (x, z, y) = tokio::join!(
        unnamed.write(kv("x", 5)),
        unnamed.write(kv("z", 3)),
        unnamed.write(kv("y", 6)),
    );
    assert_eq!(x.unwrap(), Written::Updated);
    assert_eq!(z.unwrap(), Written::Created);
    assert_eq!(y.unwrap(), Written::Updated);
    assert_eq!(unnamed.stats().batches, 2);
    assert_eq!(table(&pool).await, vec![kv("x", 5), kv("y", 6), kv("z", 3)]);
    assert_eq!(prepared_statements(&pool).await, 0);

    // The same writes, prepared, leave both statements: the check sees
    // them.
    let prepared = Writer::new(
        SqlxWriter::new(pool.clone(), ITEMS),
        batches_of_three::<Items>(),
    )
    .unwrap();
    let (x, bad, y) = tokio::join!(
        prepared.write(kv("x", 7)),
        prepared.write(kv("bad", -1)),
        prepared.write(kv("y", 8)),
    );
    assert_eq!(x.unwrap(), Written::Updated);
    assert_eq!(y.unwrap(), Written::Updated);
    assert_eq!(refusal(bad).2, "23514");
    assert!(prepared_statements(&pool).await >= 2);
}

/// Upserts into `kv(pk text PRIMARY KEY, payload text NOT NULL CHECK
/// (payload <> 'refused'))`.
struct Kv;

impl UpsertQuery for Kv {
    type Key = String;
    type Row = (String, String);

    fn key(&self, row: &(String, String)) -> String {
        row.0.clone()
    }
    fn batch_sql(&self) -> &str {
        "INSERT INTO kv (pk, payload) SELECT * FROM unnest($1::text[], $2::text[]) \
         ON CONFLICT (pk) DO UPDATE SET payload = EXCLUDED.payload \
         RETURNING pk, (xmax = 0)"
    }
    fn bind_batch<'q>(&self, query: PgQuery<'q>, rows: &'q [(String, String)]) -> PgQuery<'q> {
        let (keys, values): (Vec<String>, Vec<String>) = rows.iter().cloned().unzip();
        query.bind(keys).bind(values)
    }
    fn map_returned(&self, row: &PgRow) -> Result<(String, bool), sqlx::Error> {
        Ok((row.try_get(0)?, row.try_get(1)?))
    }
    fn single_sql(&self) -> &str {
        "INSERT INTO kv (pk, payload) VALUES ($1, $2) \
         ON CONFLICT (pk) DO UPDATE SET payload = EXCLUDED.payload \
         RETURNING pk, (xmax = 0)"
    }
    fn bind_single<'q>(&self, query: PgQuery<'q>, row: &'q (String, String)) -> PgQuery<'q> {
        query.bind(&row.0).bind(&row.1)
    }
}

fn pk(n: u32) -> String {
    format!("{n:020}")
}

/// What write `n` of [`write_concurrently`] writes: every 37th row is one
/// the table refuses.
fn payload(n: u32) -> String {
    if n % 37 == 0 {
        "refused".to_owned()
    } else {
        format!("v{n}")
    }
}

/// A cluster with an empty `kv` table, PgBouncer in transaction mode in
/// front of it with two server connections, and a sqlx pool of 8 through
/// it; and settings for a direct connection to the cluster.
async fn pooled() -> (embedded_pg::Cluster, PgBouncer, PgPool, PgConnectOptions) {
    let cluster = embedded_pg::testing::private_cluster()
        .await
        .expect("a private cluster");
    let direct = connect_options(&cluster.config("postgres"));
    let mut admin = PgConnection::connect_with(&direct).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE kv (pk text PRIMARY KEY, payload text NOT NULL \
         CHECK (payload <> 'refused'))",
    )
    .execute(&mut admin)
    .await
    .unwrap();
    admin.close().await.unwrap();
    let bouncer = PgBouncer::start(&cluster, PoolMode::Transaction, 2)
        .await
        .expect("PgBouncer (scripts/ensure-pgbouncer.sh installs it)");
    let pool = pool_options(8)
        .connect(&bouncer.url("postgres"))
        .await
        .unwrap();
    (cluster, bouncer, pool, direct)
}

/// 40 callers, 10 writes each (write `n` is `(pk(n), payload(n))`), through
/// a writer in `mode` flushing at 10 rows and running up to 8 batches at
/// once: each write's number with its answer, and the writer's batches.
async fn write_concurrently(
    pool: PgPool,
    mode: StatementMode,
) -> (Vec<(u32, Result<Written, Error>)>, u64) {
    let builder = Writer::builder()
        .max_batch_size(10)
        .max_concurrent_batches(8);
    let writer = Writer::new(SqlxWriter::with_statement_mode(pool, Kv, mode), builder).unwrap();
    let mut tasks = Vec::new();
    for c in 0..40 {
        let w = writer.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..10 {
                let n = c * 10 + i;
                out.push((n, w.write((pk(n), payload(n))).await));
            }
            out
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    (all, writer.stats().batches)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unnamed_statements_write_through_a_transaction_pooler() {
    let (cluster, _bouncer, pool, direct) = pooled().await;
    let (results, batches) = write_concurrently(pool, StatementMode::Unnamed).await;
    assert_eq!(results.len(), 400);
    assert!(batches >= 40, "{batches} batches of at most 10 rows");
    let mut refused = 0;
    for (n, r) in results {
        if payload(n) == "refused" {
            let (_, kind, code) = refusal(r);
            assert_eq!((kind, code.as_str()), (DbErrorKind::OtherRowFault, "23514"));
            refused += 1;
        } else {
            assert_eq!(r.unwrap(), Written::Created, "write {n}");
        }
    }
    assert_eq!(refused, 11, "0, 37, ..., 370");

    // Straight from the server, not through the pooler: every acknowledged
    // row with the payload its caller wrote, and no refused one.
    let mut conn = PgConnection::connect_with(&direct).await.unwrap();
    let stored: Vec<(String, String)> = sqlx::query_as("SELECT pk, payload FROM kv ORDER BY pk")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    let expected: Vec<(String, String)> = (0..400)
        .filter(|&n| payload(n) != "refused")
        .map(|n| (pk(n), payload(n)))
        .collect();
    assert_eq!(stored, expected);
    conn.close().await.unwrap();
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_through_a_transaction_pooler_fail_and_say_why() {
    let (cluster, _bouncer, pool, _) = pooled().await;
    let (results, _) = write_concurrently(pool, StatementMode::Prepared).await;
    let lost = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().err())
        .filter(|e| {
            e.load_error::<sqlx::Error>()
                .is_some_and(|e| classify(e) == DbErrorKind::SessionStateLost)
        })
        .count();
    assert!(lost > 0, "named statements broke, and the error says so");
    cluster.stop().await;
}

/// Terminates backend `pid` from a connection of its own and waits until
/// it is gone.
async fn terminate(options: &PgConnectOptions, pid: i32) {
    let mut admin = PgConnection::connect_with(options).await.unwrap();
    let signalled: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(signalled, "backend {pid} not found");
    for _ in 0..500 {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
            .bind(pid)
            .fetch_one(&mut admin)
            .await
            .unwrap();
        if left == 0 {
            admin.close().await.unwrap();
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("backend {pid} still there 5 s after pg_terminate_backend");
}

/// The pid of the pool's one connection, once that connection is idle in
/// the pool again: sqlx returns a connection (and pings it) in a task of
/// its own, so a connection terminated before that ping would be replaced
/// by a new one, and the writer would never meet the lost one.
async fn backend_pid(pool: &PgPool) -> i32 {
    let pid = sqlx::query_scalar("SELECT pg_backend_pid()")
        .persistent(false)
        .fetch_one(pool)
        .await
        .unwrap();
    for _ in 0..500 {
        if pool.num_idle() == 1 {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the connection was not back in the pool within 5 s");
}

#[tokio::test]
async fn a_lost_connection_is_written_again_only_for_an_idempotent_query() {
    let options = database().await;
    // One connection, handed out without a test first: a terminated one
    // reaches the writer, as one lost between the pool's test and the
    // batch would.
    let pool = pool_options(1)
        .test_before_acquire(false)
        .connect_with(options.clone())
        .await
        .unwrap();
    sqlx::raw_sql(CREATE).execute(&pool).await.unwrap();

    // Not idempotent (the default): the batch fails, and nothing of it is
    // written.
    let writer = Writer::new(SqlxWriter::new(pool.clone(), ITEMS), Writer::builder()).unwrap();
    assert_eq!(writer.write(kv("warm", 1)).await.unwrap(), Written::Created);
    terminate(&options, backend_pid(&pool).await).await;
    let err = writer.write(kv("a", 1)).await.unwrap_err();
    assert!(err.load_error::<RowError>().is_none(), "{err:?}");
    let lost = err.load_error::<sqlx::Error>().expect("sqlx's error");
    assert_eq!(classify(lost), DbErrorKind::Unavailable, "{lost:?}");
    assert!(err.is_retryable());
    assert_eq!(table(&pool).await, vec![kv("warm", 1)]);
    // The pool closed the lost connection: the next batch gets a new one.
    assert_eq!(writer.write(kv("a", 2)).await.unwrap(), Written::Created);

    // Idempotent: written again on another connection, and acknowledged.
    let idempotent = Writer::new(
        SqlxWriter::new(pool.clone(), Items { idempotent: true }),
        Writer::builder(),
    )
    .unwrap();
    let pid = backend_pid(&pool).await;
    terminate(&options, pid).await;
    assert_eq!(
        idempotent.write(kv("b", 3)).await.unwrap(),
        Written::Created
    );
    assert_ne!(backend_pid(&pool).await, pid, "a new connection");
    assert_eq!(
        table(&pool).await,
        vec![kv("a", 2), kv("b", 3), kv("warm", 1)]
    );
}
