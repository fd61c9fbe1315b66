//! The loader, the writer and the import behind a real PgBouncer in
//! transaction mode (Debian's package, started here in front of a
//! throwaway cluster): with unnamed statements they work while server
//! connections change under them; with prepared ones the loader fails with
//! an error that names the cause; a statement timeout set per transaction
//! still fires.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use embedded_pg::pgbouncer::{PgBouncer, PoolMode};
use pgbatch::pg::copy::{self, ConflictPolicy, RowSource, RowValues, TableSpec};
use pgbatch::pg::{
    self, BatchQuery, DbErrorKind, Params, PgError, PgLoader, PgWriter, PoolOptions, StatementMode,
    Statements, UpsertQuery, Writer,
};
use pgbatch::{Batcher, Error, Loader};
use tokio_postgres::types::Type;
use tokio_postgres::Row;

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

struct Upsert;

impl UpsertQuery for Upsert {
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
    fn batch_params<'a>(&self, rows: &'a [(String, String)]) -> Params<'a> {
        let (keys, values): (Vec<String>, Vec<String>) = rows.iter().cloned().unzip();
        vec![Box::new(keys), Box::new(values)]
    }
    fn single_sql(&self) -> &str {
        "INSERT INTO kv (pk, payload) VALUES ($1, $2) \
         ON CONFLICT (pk) DO UPDATE SET payload = EXCLUDED.payload \
         RETURNING pk, (xmax = 0)"
    }
    fn single_params<'a>(&self, row: &'a (String, String)) -> Params<'a> {
        vec![Box::new(&row.0), Box::new(&row.1)]
    }
    fn map_returned(&self, row: &Row) -> Result<(String, bool), tokio_postgres::Error> {
        Ok((row.try_get(0)?, row.try_get(1)?))
    }
}

const ROWS: i64 = 2_000;

fn pk(n: i64) -> String {
    format!("{n:020}")
}

/// A cluster with the `kv` table, PgBouncer in transaction mode in front
/// of it with two server connections, and a pool of 8 through it.
async fn pooled() -> (embedded_pg::Cluster, PgBouncer, pg::Pool) {
    let cluster = embedded_pg::testing::private_cluster()
        .await
        .expect("a private cluster");
    let (client, conn) = cluster
        .config("postgres")
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(&format!(
            "CREATE TABLE kv (pk text PRIMARY KEY, payload text NOT NULL);
             INSERT INTO kv SELECT lpad(n::text, 20, '0'), n::text
               FROM generate_series(1, {ROWS}) AS n;"
        ))
        .await
        .unwrap();
    let bouncer = PgBouncer::start(&cluster, PoolMode::Transaction, 2)
        .await
        .expect("PgBouncer (scripts/ensure-pgbouncer.sh installs it)");
    let pool = pg::pool(bouncer.config("postgres"), &PoolOptions::with_max_size(8)).unwrap();
    (cluster, bouncer, pool)
}

fn unnamed() -> Statements {
    Statements::default().mode(StatementMode::Unnamed)
}

/// 40 callers, 50 reads each, through a batcher over `loader`.
async fn read_concurrently(loader: PgLoader<Kv>) -> Vec<Result<Option<String>, Error>> {
    let batcher = Batcher::builder().build(loader).unwrap();
    let mut tasks = Vec::new();
    for c in 0..40 {
        let b = batcher.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..50 {
                out.push(b.load(pk(1 + (c * 50 + i) % ROWS)).await);
            }
            out
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unnamed_statements_read_through_a_transaction_pooler() {
    let (cluster, _bouncer, pool) = pooled().await;
    let results = read_concurrently(PgLoader::with_statements(pool.clone(), Kv, unnamed())).await;
    assert_eq!(results.len(), 2_000);
    for r in &results {
        assert!(matches!(r, Ok(Some(_))), "{r:?}");
    }
    let loader = PgLoader::with_statements(pool, Kv, unnamed());
    assert_eq!(loader.load_one(&pk(3)).await.unwrap().as_deref(), Some("3"));
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_through_a_transaction_pooler_fail_and_say_why() {
    let (cluster, _bouncer, pool) = pooled().await;
    let results = read_concurrently(PgLoader::new(pool, Kv)).await;
    let lost: Vec<_> = results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .filter(|e| {
            e.load_error::<PgError>()
                .is_some_and(|pg| pg.kind() == DbErrorKind::SessionStateLost)
        })
        .collect();
    assert!(
        !lost.is_empty(),
        "named statements broke, and the error says so"
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_and_the_import_work_through_a_transaction_pooler() {
    let (cluster, _bouncer, pool) = pooled().await;
    let writer = Writer::new(
        PgWriter::with_statements(pool.clone(), Upsert, unnamed()),
        Writer::builder(),
    )
    .unwrap();
    let writer = Arc::new(writer);
    let mut tasks = Vec::new();
    for i in 0..200 {
        let w = Arc::clone(&writer);
        tasks.push(tokio::spawn(async move {
            w.write((pk(ROWS + 1 + i), format!("new {i}"))).await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let loader = PgLoader::with_statements(pool.clone(), Kv, unnamed());
    assert_eq!(
        loader.load_one(&pk(ROWS + 7)).await.unwrap().as_deref(),
        Some("new 6")
    );

    struct Rows(std::vec::IntoIter<(String, String)>);
    impl RowSource for Rows {
        type Error = std::io::Error;
        async fn next_row(&mut self) -> Result<Option<RowValues>, std::io::Error> {
            Ok(self
                .0
                .next()
                .map(|(k, v)| vec![Box::new(k) as _, Box::new(v) as _]))
        }
    }
    let rows: Vec<(String, String)> = (0..500)
        .map(|i| (pk(10_000 + i), "imported".into()))
        .collect();
    let spec = TableSpec {
        table: "kv",
        columns: &[("pk", Type::TEXT), ("payload", Type::TEXT)],
        key: &["pk"],
    };
    let mut client = pool.get().await.unwrap();
    let counts = copy::import_with(
        &mut client,
        &spec,
        Rows(rows.into_iter()),
        ConflictPolicy::Fail,
        unnamed().statement_timeout(Duration::from_secs(10)),
    )
    .await
    .unwrap();
    assert_eq!(counts.inserted, 500);
    let found: HashMap<String, String> = loader
        .load(vec![pk(10_000), pk(10_499)])
        .await
        .unwrap()
        .into_values();
    assert_eq!(found.len(), 2);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_timeout_set_per_transaction_fires_through_the_pooler() {
    let (cluster, _bouncer, pool) = pooled().await;
    struct Slow;
    impl BatchQuery for Slow {
        type Key = String;
        type Value = String;
        fn batch_sql(&self) -> &str {
            "SELECT pk, payload FROM kv, pg_sleep(2) WHERE pk = ANY($1)"
        }
        fn batch_params<'a>(&self, keys: &'a [String]) -> Params<'a> {
            vec![Box::new(keys)]
        }
        fn single_sql(&self) -> &str {
            "SELECT pk, payload FROM kv, pg_sleep(2) WHERE pk = $1"
        }
        fn single_params<'a>(&self, key: &'a String) -> Params<'a> {
            vec![Box::new(key)]
        }
        fn map_row(&self, row: &Row) -> Result<(String, String), tokio_postgres::Error> {
            Ok((row.try_get(0)?, row.try_get(1)?))
        }
    }
    let statements = unnamed().statement_timeout(Duration::from_millis(100));
    let loader = PgLoader::with_statements(pool.clone(), Slow, statements);
    let start = std::time::Instant::now();
    let err = loader.load_one(&pk(1)).await.unwrap_err();
    assert!(err.is_statement_timeout(), "{err:?}");
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    // The transaction ended with it: the connection serves the next read.
    let fast = PgLoader::with_statements(pool, Kv, unnamed());
    assert_eq!(fast.load_one(&pk(2)).await.unwrap().as_deref(), Some("2"));
    cluster.stop().await;
}
