//! The micro-batched writer and the COPY import against a real Postgres.

use std::sync::Arc;
use std::time::Duration;

use embedded_pg::{Cluster, ClusterOptions};
use pgbatch::pg::copy::{self, ConflictPolicy, ImportError, RowSource, RowValues, TableSpec};
use pgbatch::pg::{
    self, DbErrorKind, Params, PgWriter, PoolOptions, RowError, UpsertQuery, Writer, Written,
};
use pgbatch::{Error, FlushPolicy};
use tokio_postgres::types::Type;
use tokio_postgres::{NoTls, Row};

/// `items(k text PRIMARY KEY, v bigint NOT NULL CHECK (v >= 0))`.
struct Items;

const CREATE: &str = "CREATE TABLE items (k text PRIMARY KEY, v bigint NOT NULL CHECK (v >= 0))";

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
    fn batch_params<'a>(&self, rows: &'a [(String, i64)]) -> Params<'a> {
        let ks: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        let vs: Vec<i64> = rows.iter().map(|r| r.1).collect();
        vec![Box::new(ks), Box::new(vs)]
    }
    fn single_sql(&self) -> &str {
        "INSERT INTO items (k, v) VALUES ($1, $2) \
         ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v RETURNING k, (xmax = 0)"
    }
    fn single_params<'a>(&self, row: &'a (String, i64)) -> Params<'a> {
        vec![Box::new(row.0.as_str()), Box::new(row.1)]
    }
    fn map_returned(&self, row: &Row) -> Result<(String, bool), tokio_postgres::Error> {
        Ok((row.try_get(0)?, row.try_get(1)?))
    }
}

async fn items_pool(config: tokio_postgres::Config) -> pg::Pool {
    let pool = pg::pool(config, &PoolOptions::with_max_size(4)).unwrap();
    pool.get()
        .await
        .unwrap()
        .batch_execute(CREATE)
        .await
        .unwrap();
    pool
}

async fn table(pool: &pg::Pool) -> Vec<(String, i64)> {
    let client = pool.get().await.unwrap();
    let rows = client
        .query("SELECT k, v FROM items ORDER BY k", &[])
        .await
        .unwrap();
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

fn kv(k: &str, v: i64) -> (String, i64) {
    (k.to_owned(), v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_share_batches_and_are_visible_once_acknowledged() {
    let db = embedded_pg::testing::database().await.unwrap();
    let pool = items_pool(db.config).await;
    let writer = Writer::new(PgWriter::new(pool.clone(), Items), Writer::builder()).unwrap();

    let tasks: Vec<_> = (0..300)
        .map(|i| {
            let w = writer.clone();
            tokio::spawn(async move { w.write(kv(&format!("k{i:03}"), i)).await })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), Written::Created);
    }
    // Acknowledged means committed: another connection sees every row.
    assert_eq!(table(&pool).await.len(), 300);
    assert!(
        writer.stats().batches < 300,
        "{} statements",
        writer.stats().batches
    );
    assert_eq!(writer.write(kv("k000", 7)).await.unwrap(), Written::Updated);
}

/// A writer that flushes exactly when three writes have arrived.
async fn batches_of_three() -> (pg::Pool, Writer<(String, i64)>) {
    let db = embedded_pg::testing::database().await.unwrap();
    let pool = items_pool(db.config).await;
    let builder = Writer::builder()
        .policy(FlushPolicy::FixedDelay)
        .max_batch_size(3)
        .max_delay(Duration::from_secs(60));
    let writer = Writer::new(PgWriter::new(pool.clone(), Items), builder).unwrap();
    (pool, writer)
}

#[tokio::test]
async fn within_a_batch_the_later_write_of_a_key_wins() {
    let (pool, writer) = batches_of_three().await;

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
async fn two_batches_with_the_same_keys_in_opposite_orders_do_not_deadlock() {
    let db = embedded_pg::testing::database().await.unwrap();
    let pool = items_pool(db.config).await;
    // Each row takes 0.3 s before it is inserted, so the two batches run
    // side by side: written in arrival order, each would hold its first key
    // while waiting for the other's, and Postgres would abort one of them
    // (40P01) after deadlock_timeout.
    pool.get()
        .await
        .unwrap()
        .batch_execute(
            "CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM pg_sleep(0.3); RETURN NEW; END $$; \
             CREATE TRIGGER slow_row BEFORE INSERT ON items \
             FOR EACH ROW EXECUTE FUNCTION slow_row()",
        )
        .await
        .unwrap();
    let builder = Writer::builder()
        .policy(FlushPolicy::FixedDelay)
        .max_batch_size(2)
        .max_concurrent_batches(2)
        .max_delay(Duration::from_secs(60));
    let writer = Writer::new(PgWriter::new(pool.clone(), Items), builder).unwrap();

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
    let (pool, writer) = batches_of_three().await;

    let (x, bad, y) = tokio::join!(
        writer.write(kv("x", 1)),
        writer.write(kv("bad", -1)),
        writer.write(kv("y", 2)),
    );
    assert_eq!(x.unwrap(), Written::Created);
    assert_eq!(y.unwrap(), Written::Created);
    let err = bad.unwrap_err();
    let row_err = err
        .load_error::<RowError>()
        .expect("a row refusal, not a batch failure");
    assert_eq!(
        row_err.as_db_error().unwrap().code().code(),
        "23514",
        "check_violation"
    );
    assert_eq!(row_err.kind(), DbErrorKind::OtherRowFault);
    assert_eq!(table(&pool).await, vec![kv("x", 1), kv("y", 2)]);
}

#[tokio::test]
async fn a_database_failure_fails_the_batch_and_commits_nothing() {
    let db = embedded_pg::testing::database().await.unwrap();
    // No items table: the statement fails, but not because of a row.
    let pool = pg::pool(db.config, &PoolOptions::with_max_size(2)).unwrap();
    let writer = Writer::new(PgWriter::new(pool, Items), Writer::builder()).unwrap();
    let err = writer.write(kv("a", 1)).await.unwrap_err();
    assert!(matches!(err, Error::Load(_)), "{err:?}");
    assert!(err.load_error::<RowError>().is_none());
    assert!(err.load_error::<pg::PgError>().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_a_postgres_crash() {
    let dir = tempfile::Builder::new()
        .prefix("pgbatch-crash-")
        .tempdir_in("/tmp")
        .unwrap();
    let options = || ClusterOptions::new(dir.path().join("pg")).port(5498);
    let cluster = Cluster::start(options()).await.unwrap();
    let pool = items_pool(cluster.config("postgres")).await;
    let writer = Writer::new(PgWriter::new(pool.clone(), Items), Writer::builder()).unwrap();

    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let w = writer.clone();
            tokio::spawn(async move { w.write(kv(&format!("k{i:03}"), i)).await.is_ok() })
        })
        .collect();
    let mut acked = 0;
    for t in tasks {
        acked += usize::from(t.await.unwrap());
    }
    assert_eq!(acked, 200);

    // No checkpoint, no clean shutdown: only the WAL flushed at each commit.
    cluster.crash().await.unwrap();
    drop(pool);
    let cluster = Cluster::start(options()).await.unwrap();
    let (client, conn) = cluster.config("postgres").connect(NoTls).await.unwrap();
    tokio::spawn(conn);
    let n: i64 = client
        .query_one("SELECT count(*) FROM items", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 200, "every acknowledged write is still there");
    let log = std::fs::read_to_string(cluster.log_path()).unwrap();
    assert!(
        log.contains("not properly shut down"),
        "crash recovery must have run"
    );
    cluster.stop().await;
}

/// Rows from a vector; fails at `fail_at` (a 1-based row number) if set.
struct VecSource {
    rows: std::vec::IntoIter<(String, i64)>,
    n: u64,
    fail_at: Option<u64>,
}

fn source(rows: &[(&str, i64)], fail_at: Option<u64>) -> VecSource {
    let rows: Vec<_> = rows.iter().map(|(k, v)| kv(k, *v)).collect();
    VecSource {
        rows: rows.into_iter(),
        n: 0,
        fail_at,
    }
}

#[derive(Debug, thiserror::Error)]
#[error("bad input")]
struct BadInput;

impl RowSource for VecSource {
    type Error = BadInput;

    async fn next_row(&mut self) -> Result<Option<RowValues>, BadInput> {
        self.n += 1;
        if self.fail_at == Some(self.n) {
            return Err(BadInput);
        }
        Ok(self
            .rows
            .next()
            .map(|(k, v)| -> RowValues { vec![Box::new(k), Box::new(v)] }))
    }
}

const SPEC: TableSpec<'static> = TableSpec {
    table: "items",
    columns: &[("k", Type::TEXT), ("v", Type::INT8)],
    key: &["k"],
};

async fn import(
    pool: &pg::Pool,
    rows: &[(&str, i64)],
    policy: ConflictPolicy,
) -> Result<copy::ImportCounts, ImportError<BadInput>> {
    let mut client = pool.get().await.unwrap();
    copy::import(&mut client, &SPEC, source(rows, None), policy).await
}

#[tokio::test]
async fn each_conflict_policy_does_what_it_says_and_counts_it() {
    let db = embedded_pg::testing::database().await.unwrap();
    let pool = items_pool(db.config).await;
    let input = [("a", 5), ("c", 5), ("c", 6)];
    let reset = || async {
        let c = pool.get().await.unwrap();
        c.batch_execute("TRUNCATE items; INSERT INTO items VALUES ('a', 1), ('b', 1)")
            .await
            .unwrap();
    };

    reset().await;
    let counts = import(&pool, &input, ConflictPolicy::Skip).await.unwrap();
    assert_eq!(
        (
            counts.rows,
            counts.inserted,
            counts.updated,
            counts.skipped,
            counts.superseded
        ),
        (3, 1, 0, 1, 1)
    );
    assert_eq!(table(&pool).await, vec![kv("a", 1), kv("b", 1), kv("c", 6)]);

    reset().await;
    let counts = import(&pool, &input, ConflictPolicy::Overwrite)
        .await
        .unwrap();
    assert_eq!(
        (
            counts.inserted,
            counts.updated,
            counts.skipped,
            counts.superseded
        ),
        (1, 1, 0, 1)
    );
    assert_eq!(table(&pool).await, vec![kv("a", 5), kv("b", 1), kv("c", 6)]);

    reset().await;
    let err = import(&pool, &input, ConflictPolicy::Fail)
        .await
        .unwrap_err();
    assert!(matches!(err, ImportError::Conflict(_)), "{err:?}");
    assert_eq!(err.kind(), DbErrorKind::UniqueViolation);
    assert!(
        err.as_db_error().unwrap().detail().unwrap().contains("(a)"),
        "{err:?}"
    );
    assert_eq!(
        table(&pool).await,
        vec![kv("a", 1), kv("b", 1)],
        "nothing committed"
    );
}

#[tokio::test]
async fn a_bad_input_row_or_a_refused_row_commits_nothing() {
    let db = embedded_pg::testing::database().await.unwrap();
    let pool = items_pool(db.config).await;
    let mut client = pool.get().await.unwrap();
    let err = copy::import(
        &mut client,
        &SPEC,
        source(&[("a", 1), ("b", 2), ("c", 3)], Some(3)),
        ConflictPolicy::Skip,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ImportError::Source { row: 3, .. }), "{err:?}");
    let err = import(&pool, &[("a", 1), ("neg", -5)], ConflictPolicy::Skip)
        .await
        .unwrap_err();
    assert!(matches!(err, ImportError::Rejected(_)), "{err:?}");
    assert_eq!(err.kind(), DbErrorKind::OtherRowFault);
    assert!(table(&pool).await.is_empty());
    // The connection is clean for its next user (no leftover transaction or table).
    let counts = import(&pool, &[("z", 1)], ConflictPolicy::Skip)
        .await
        .unwrap();
    assert_eq!(counts.inserted, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_imports_do_not_clash_and_leave_no_tables_behind() {
    let db = embedded_pg::testing::database().await.unwrap();
    let pool = items_pool(db.config).await;
    let pool = Arc::new(pool);
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let pool = Arc::clone(&pool);
            tokio::spawn(async move {
                // Keys overlap between imports: each key 0..1500 by step 1.
                let rows: Vec<(String, i64)> = (0..1000)
                    .map(|i| (format!("k{:04}", t * 100 + i), i))
                    .collect();
                let refs: Vec<(&str, i64)> = rows.iter().map(|(k, v)| (k.as_str(), *v)).collect();
                import(&pool, &refs, ConflictPolicy::Skip).await.unwrap()
            })
        })
        .collect();
    let mut inserted = 0;
    for t in tasks {
        let c = t.await.unwrap();
        assert_eq!(c.rows, 1000);
        assert_eq!(c.inserted + c.skipped, 1000);
        inserted += c.inserted;
    }
    assert_eq!(
        inserted, 1700,
        "keys k0000..k1699 inserted exactly once across imports"
    );
    assert_eq!(table(&pool).await.len(), 1700);
    let client = pool.get().await.unwrap();
    let left: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_class WHERE relname = 'import_rows'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
}

#[tokio::test]
async fn overwriting_a_table_whose_every_column_is_its_key_counts_existing_rows_updated() {
    // No column to overwrite: the conflict clause must still be valid SQL.
    let db = embedded_pg::testing::database().await.unwrap();
    let pool = items_pool(db.config).await;
    let mut client = pool.get().await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE pairs (k text, v bigint, PRIMARY KEY (k, v));
             INSERT INTO pairs VALUES ('a', 1)",
        )
        .await
        .unwrap();
    let spec = TableSpec {
        table: "pairs",
        columns: &[("k", Type::TEXT), ("v", Type::INT8)],
        key: &["k", "v"],
    };
    let counts = copy::import(
        &mut client,
        &spec,
        source(&[("a", 1), ("b", 2)], None),
        ConflictPolicy::Overwrite,
    )
    .await
    .unwrap();
    assert_eq!((counts.inserted, counts.updated), (1, 1));
    let rows: Vec<(String, i64)> = client
        .query("SELECT k, v FROM pairs ORDER BY k", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(rows, vec![kv("a", 1), kv("b", 2)]);
}
