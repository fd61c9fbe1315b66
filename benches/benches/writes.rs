//! Writes, measured in one run against a durable Postgres (fsync on, the
//! default `wal_level`), printed as Markdown tables with each target's
//! verdict:
//!
//! 1. Inserting N objects three ways, each in one transaction on one
//!    connection: one statement per row, multi-row statements (1,000 rows
//!    per `unnest` statement), and binary COPY. Seed 004 did the same with
//!    1M rows: 36.2 s, 23.7 s and 1.74 s.
//! 2. Concurrent single-object upserts: each its own autocommit statement
//!    (naive) versus the micro-batched `Writer`.
//!
//! `cargo bench -p benches --bench writes` (N = 1,000,000); `-- --test` is a
//! seconds-long smoke run. `-- --part upserts --callers 300
//! --write-concurrency 1,2,4` runs only the concurrent part, at the given
//! callers, with one writer per concurrency (statements at once).

use std::convert::Infallible;
use std::time::{Duration, Instant};

use benches::closed_loop;
use clap::Parser;
use embedded_pg::{Cluster, ClusterOptions};
use pgbatch::pg::copy::{self, RowSource, RowValues};
use pgbatch::pg::{self, Params, PgWriter, PoolOptions, UpsertQuery, Writer};
use server::db::queries::objects::{ObjectRow, ObjectUpsert, OBJECT_COLUMNS, OBJECT_TABLE};
use server::db::queries::repositories;
use server::settings::{BatchSettings, WriteSettings};
use tokio_postgres::types::ToSql;

fn row(i: u64) -> ObjectRow {
    ObjectRow {
        repository: "bench".to_owned(),
        path: format!("p/{i:09}"),
        physical_address: format!("s3://bench/{i:016x}"),
        size_bytes: i as i64,
        checksum: format!("{:032x}", u128::from(i) * 0x9E37_79B9_7F4A_7C15),
        content_type: "application/octet-stream".to_owned(),
        metadata: serde_json::json!({ "i": i.to_string() }),
        mtime: None,
    }
}

struct Rows(std::ops::Range<u64>);

impl RowSource for Rows {
    type Error = Infallible;

    async fn next_row(&mut self) -> Result<Option<RowValues>, Infallible> {
        Ok(self.0.next().map(|i| row(i).into_values()))
    }
}

async fn reset(client: &tokio_postgres::Client) {
    client
        .batch_execute("TRUNCATE objects; CHECKPOINT")
        .await
        .expect("reset");
}

fn refs<'a>(p: &'a Params<'_>) -> Vec<&'a (dyn ToSql + Sync)> {
    p.iter()
        .map(|b| b.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

async fn one_by_one(client: &mut tokio_postgres::Client, n: u64) -> Duration {
    let start = Instant::now();
    let tx = client.transaction().await.expect("begin");
    let stmt = tx
        .prepare(ObjectUpsert.single_sql())
        .await
        .expect("prepare");
    for i in 0..n {
        let r = row(i);
        let p = ObjectUpsert.single_params(&r);
        tx.query_one(&stmt, &refs(&p)).await.expect("insert");
    }
    tx.commit().await.expect("commit");
    start.elapsed()
}

async fn multi_row(client: &mut tokio_postgres::Client, n: u64) -> Duration {
    let start = Instant::now();
    let tx = client.transaction().await.expect("begin");
    let stmt = tx.prepare(ObjectUpsert.batch_sql()).await.expect("prepare");
    let mut i = 0;
    while i < n {
        let rows: Vec<ObjectRow> = (i..n.min(i + 1000)).map(row).collect();
        let p = ObjectUpsert.batch_params(&rows);
        tx.query(&stmt, &refs(&p)).await.expect("insert");
        i += 1000;
    }
    tx.commit().await.expect("commit");
    start.elapsed()
}

async fn by_copy(client: &mut tokio_postgres::Client, n: u64) -> Duration {
    let start = Instant::now();
    let tx = client.transaction().await.expect("begin");
    copy::copy_rows(
        &tx,
        OBJECT_TABLE.table,
        &OBJECT_COLUMNS,
        Rows(0..n),
        false,
        |_| {},
    )
    .await
    .expect("copy");
    tx.commit().await.expect("commit");
    start.elapsed()
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    All,
    Inserts,
    Upserts,
}

#[derive(Parser)]
// `cargo bench -p benches -- <args>` gives every bench of the package the
// same arguments (criterion's filters and options too): ignore what is not
// ours.
#[command(ignore_errors = true)]
struct Args {
    #[command(flatten)]
    cargo: benches::CargoBenchFlags,
    /// Which part to run.
    #[arg(long, value_enum, default_value_t = Part::All)]
    part: Part,
    /// Callers of the concurrent upserts.
    #[arg(long, value_delimiter = ',', default_values_t = [64usize, 300, 1000])]
    callers: Vec<usize>,
    /// Statements at once of the micro-batched writer; one run per value
    /// (the server's default when not given).
    #[arg(long, value_delimiter = ',')]
    write_concurrency: Vec<usize>,
    /// Disables the objects table's invalidation triggers (NOTIFY), as
    /// before cross-instance invalidation existed: a transaction that
    /// notifies holds a global lock through its commit, so naive upserts
    /// lose group commit.
    #[arg(long)]
    without_notify: bool,
    /// Seconds per concurrent run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
}

/// Inserts `n` objects three ways, prints the table, and returns COPY's
/// ratio to one by one.
async fn inserts(client: &mut tokio_postgres::Client, n: u64) -> f64 {
    println!("\n### Inserting {n} objects, one transaction each way\n");
    println!("| method | seconds | rows/s | × one by one |");
    println!("|---|---:|---:|---:|");
    reset(client).await;
    let single = one_by_one(client, n).await;
    reset(client).await;
    let multi = multi_row(client, n).await;
    reset(client).await;
    let copied = by_copy(client, n).await;
    for (name, d) in [
        ("one statement per row", single),
        ("multi-row statements (1,000 rows each)", multi),
        ("binary COPY", copied),
    ] {
        println!(
            "| {name} | {:.2} | {:.0} | {:.1} |",
            d.as_secs_f64(),
            n as f64 / d.as_secs_f64(),
            single.as_secs_f64() / d.as_secs_f64()
        );
    }
    single.as_secs_f64() / copied.as_secs_f64()
}

enum Path {
    Naive(pg::Pool),
    Writer(Writer<ObjectRow>),
}

/// One closed-loop run of single-object upserts from an empty table, with
/// the mean batch when `path` is the writer.
async fn upsert_run(
    client: &tokio_postgres::Client,
    callers: usize,
    run_for: Duration,
    path: Path,
) -> (benches::RunReport, Option<f64>) {
    reset(client).await;
    match path {
        Path::Naive(pool) => {
            let report = closed_loop(callers, run_for, 1_000_000, move |k| {
                let pool = pool.clone();
                async move {
                    let client = pool.get().await.expect("connection");
                    let stmt = client
                        .prepare_cached(ObjectUpsert.single_sql())
                        .await
                        .expect("prepare");
                    let r = row(k);
                    let p = ObjectUpsert.single_params(&r);
                    client.query_one(&stmt, &refs(&p)).await.expect("upsert");
                }
            })
            .await;
            (report, None)
        }
        Path::Writer(writer) => {
            let before = writer.stats();
            let report = {
                let writer = writer.clone();
                closed_loop(callers, run_for, 1_000_000, move |k| {
                    let writer = writer.clone();
                    async move {
                        writer.write(row(k)).await.expect("write");
                    }
                })
                .await
            };
            let after = writer.stats();
            let mean_batch = (after.batch_size.sum - before.batch_size.sum) as f64
                / (after.batches - before.batches).max(1) as f64;
            (report, Some(mean_batch))
        }
    }
}

fn print_upserts(
    callers: usize,
    name: &str,
    (r, batch): &(benches::RunReport, Option<f64>),
    naive: f64,
) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "| {callers} | {name} | {:.0} | {:.1} | {:.2} | {:.2} | {:.2} | {:.1} |",
        r.per_sec(),
        r.per_sec() / naive,
        ms(r.quantile(0.5)),
        ms(r.quantile(0.99)),
        ms(r.max()),
        batch.unwrap_or(1.0)
    );
}

fn main() {
    let args = Args::parse();
    let smoke = args.cargo.test;
    let n: u64 = if smoke { 2_000 } else { 1_000_000 };
    let run_for = if smoke {
        Duration::from_millis(300)
    } else {
        Duration::from_secs_f64(args.seconds)
    };
    let rt = benches::runtime();
    rt.block_on(async {
        let dir = tempfile::Builder::new()
            .prefix("pgbatch-writes-")
            .tempdir_in("/tmp")
            .expect("temp dir");
        // Durable, default WAL: the cost of commits is real.
        let cluster = Cluster::start(ClusterOptions::new(dir.path().join("pg")).port(5497))
            .await
            .expect("postgres");
        let config = cluster.config("postgres");
        server::db::migrate(&config).await.expect("migrations");
        let (mut client, conn) = config.connect(tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(conn);
        repositories::insert(&client, "bench", "s3://bench/")
            .await
            .expect("repository");
        if args.without_notify {
            client
                .batch_execute(
                    "ALTER TABLE objects DISABLE TRIGGER objects_notify_insert, \
                     DISABLE TRIGGER objects_notify_update, DISABLE TRIGGER objects_notify_delete, \
                     DISABLE TRIGGER objects_notify_truncate",
                )
                .await
                .expect("disable notify triggers");
        }
        println!(
            "PostgreSQL {}, invalidation triggers {}",
            benches::reads::server_version(&config).await.expect("server version"),
            if args.without_notify { "off" } else { "on" }
        );

        let mut verdicts = Vec::new();
        if args.part != Part::Upserts {
            let copy_ratio = inserts(&mut client, n).await;
            verdicts.push(format!(
                "target: COPY at least 25x one by one: {} ({copy_ratio:.1}x)",
                verdict(copy_ratio >= 25.0)
            ));
        }
        if args.part != Part::Inserts {
            let pool = pg::pool(config.clone(), &PoolOptions::with_max_size(16)).expect("pool");
            // The server's writer settings (256 rows per statement, 4
            // statements at once unless --write-concurrency says otherwise).
            let settings = WriteSettings::default();
            let concurrency = if args.write_concurrency.is_empty() {
                vec![settings.batch.concurrency.max()]
            } else {
                args.write_concurrency.clone()
            };
            let writers: Vec<(usize, Writer<ObjectRow>)> = concurrency
                .iter()
                .map(|&c| {
                    let batch = BatchSettings { concurrency: pgbatch::Concurrency::Fixed(c), ..settings.batch };
                    let writer = Writer::new(PgWriter::new(pool.clone(), ObjectUpsert), batch.builder("object_write", settings.timeout))
                        .expect("writer");
                    (c, writer)
                })
                .collect();
            println!("\n### Concurrent single-object upserts, {run_for:?} per run\n");
            println!("| callers | path | upserts/s | × naive | p50 ms | p99 ms | max ms | mean batch |");
            println!("|---:|---|---:|---:|---:|---:|---:|---:|");
            for &callers in &args.callers {
                let naive = upsert_run(&client, callers, run_for, Path::Naive(pool.clone())).await;
                print_upserts(callers, "naive (autocommit per upsert)", &naive, naive.0.per_sec());
                for (c, writer) in &writers {
                    let batched = upsert_run(&client, callers, run_for, Path::Writer(writer.clone())).await;
                    let name = format!("micro-batched Writer, {c} statements at once");
                    print_upserts(callers, &name, &batched, naive.0.per_sec());
                    let ratio = batched.0.per_sec() / naive.0.per_sec();
                    verdicts.push(format!(
                        "target: micro-batched concurrent upserts at least 5x naive, {callers} callers, {c} at once: {} ({ratio:.1}x)",
                        verdict(ratio >= 5.0)
                    ));
                }
            }
            for (_, writer) in writers {
                writer.shutdown().await;
            }
        }
        println!();
        for v in verdicts {
            println!("{v}");
        }
        cluster.stop().await;
    });
}
