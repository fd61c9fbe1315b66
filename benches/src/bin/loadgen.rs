//! The seed benchmark (lakeFS's micro-batching post), in process: N
//! initiators read uniformly random keys of `random_read_test` through each
//! read path, against the database's own bulk ceiling.
//!
//! Read paths: naive (one query per read through the pool), pipelined
//! (concurrent single-key queries on a few shared connections, which
//! tokio-postgres pipelines), batched (max batch 1..64 under the fixed-delay,
//! eager and adaptive policies), and cached (the cache in front of the
//! batcher).
//! The ceiling is back-to-back `= ANY($1)` queries of 10,000 keys.
//!
//! Prints a Markdown table with each path as a ratio of naive and as a
//! fraction of the ceiling, appends to a CSV like the seed's
//! `statistics.csv`, and draws throughput and p99 against batch size as SVG.
//!
//! ```text
//! cargo run --release -p benches --bin loadgen             # 10M rows, 300 initiators
//! cargo run --release -p benches --bin loadgen -- --smoke  # seconds, for CI
//! ```

use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use batcher::cache::Cache;
use batcher::pg::copy::{self, RowSource, RowValues};
use batcher::pg::{PgLoader, PoolOptions};
use batcher::{Batcher, FlushPolicy};
use benches::{closed_loop, KeyStream, RunReport};
use clap::Parser;
use server::config::DbArgs;
use server::db::Database;
use server::queries::KvQuery;
use server::seed::{kv_payload, kv_pk};
use tokio_postgres::types::Type;
use tokio_postgres::NoTls;

/// Reproduces the seed benchmark against this project's read paths.
#[derive(Debug, Parser)]
#[command(about)]
struct Args {
    /// Rows in `random_read_test` (added with COPY when fewer exist).
    #[arg(long, default_value_t = 10_000_000)]
    rows: u64,
    /// Concurrent initiators, each doing one read at a time.
    #[arg(long, default_value_t = 300)]
    initiators: usize,
    /// Seconds per run.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Max batch sizes for the batched runs.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,24,32,64")]
    batch_sizes: Vec<usize>,
    /// Connections for the naive path and the batchers' pool.
    #[arg(long, default_value_t = 16)]
    pool_size: usize,
    /// Batched statements at once (the seed's reader goroutines: 10).
    #[arg(long, default_value_t = 10)]
    batch_concurrency: usize,
    /// Shared connections of the pipelined path.
    #[arg(long, default_value_t = 4)]
    pipeline_connections: usize,
    /// Keys per query when measuring the bulk ceiling.
    #[arg(long, default_value_t = 10_000)]
    ceiling_keys: usize,
    /// A Postgres to use instead of the embedded one.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Directory of the embedded cluster (kept, so rows are loaded once).
    #[arg(long, default_value = ".data/bench-pg")]
    data_dir: PathBuf,
    /// CSV file results are appended to.
    #[arg(long, default_value = "target/loadgen/statistics.csv")]
    csv: PathBuf,
    /// SVG plot of throughput and p99 against batch size.
    #[arg(long, default_value = "target/loadgen/batching.svg")]
    svg: PathBuf,
    /// A seconds-long run on a small table (CI's proof that it works).
    #[arg(long)]
    smoke: bool,
}

/// One row of results.
struct Outcome {
    path: String,
    policy: &'static str,
    max_batch: Option<usize>,
    initiators: usize,
    report: RunReport,
    mean_batch: Option<f64>,
}

struct KvRows {
    next: u64,
    last: u64,
}

impl RowSource for KvRows {
    type Error = std::convert::Infallible;

    async fn next_row(&mut self) -> Result<Option<RowValues>, Self::Error> {
        if self.next > self.last {
            return Ok(None);
        }
        let n = self.next;
        self.next += 1;
        Ok(Some(vec![Box::new(kv_pk(n)), Box::new(kv_payload(n))]))
    }
}

/// Tops `random_read_test` up to `rows` rows (numbered from 1).
async fn ensure_rows(config: &tokio_postgres::Config, rows: u64) -> anyhow::Result<()> {
    let (mut client, conn) = config.connect(NoTls).await?;
    tokio::spawn(conn);
    let have: i64 = client
        .query_one("SELECT count(*) FROM random_read_test", &[])
        .await?
        .get(0);
    let have = have as u64;
    if have >= rows {
        return Ok(());
    }
    eprintln!("loading rows {}..={rows} into random_read_test", have + 1);
    let start = Instant::now();
    let tx = client.transaction().await?;
    let columns = [("pk", Type::TEXT), ("payload", Type::TEXT)];
    let source = KvRows {
        next: have + 1,
        last: rows,
    };
    copy::copy_rows(&tx, "random_read_test", &columns, source, false, |_| {})
        .await
        .context("COPY")?;
    tx.commit().await?;
    eprintln!(
        "loaded {} rows in {:.1} s; vacuuming",
        rows - have,
        start.elapsed().as_secs_f64()
    );
    // Frozen, analysed and with a visibility map, reads do not write.
    client
        .batch_execute("VACUUM (FREEZE, ANALYZE) random_read_test")
        .await?;
    Ok(())
}

/// Keys per second of back-to-back `= ANY($1)` queries of `keys` keys on
/// `connections` connections.
async fn ceiling(
    pool: &batcher::pg::Pool,
    connections: usize,
    keys: usize,
    rows: u64,
    run: Duration,
) -> f64 {
    let stop = Instant::now() + run;
    let start = Instant::now();
    let tasks: Vec<_> = (0..connections)
        .map(|c| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let client = pool.get().await.expect("connection");
                let stmt = client
                    .prepare_cached("SELECT pk, payload FROM random_read_test WHERE pk = ANY($1)")
                    .await
                    .expect("prepare");
                let mut stream = KeyStream::new(1_000 + c as u64);
                let mut done = 0u64;
                while Instant::now() < stop {
                    let batch: Vec<String> = (0..keys)
                        .map(|_| kv_pk(1 + stream.next_below(rows)))
                        .collect();
                    let found = client.query(&stmt, &[&batch]).await.expect("ceiling query");
                    done += found.len() as u64;
                }
                done
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("ceiling task");
    }
    total as f64 / start.elapsed().as_secs_f64()
}

fn key(k: u64) -> String {
    kv_pk(k + 1)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.rows = 20_000;
        args.seconds = 0.3;
        args.batch_sizes = vec![1, 16];
        args.ceiling_keys = 1_000;
        if args.data_dir == Path::new(".data/bench-pg") {
            args.data_dir =
                std::env::temp_dir().join(format!("pgbatch-loadgen-{}", std::process::id()));
        }
    }
    let run = Duration::from_secs_f64(args.seconds);
    let db = Database::open(&DbArgs {
        database_url: args.database_url.clone(),
        data_dir: args.data_dir.clone(),
        pool_size: args.pool_size,
        admin_token_file: PathBuf::new(),
    })
    .await?;
    let result = measure(&args, &db, run).await;
    db.close().await;
    if args.smoke {
        let _ = std::fs::remove_dir_all(&args.data_dir); // a throwaway cluster
    }
    result
}

async fn measure(args: &Args, db: &Database, run: Duration) -> anyhow::Result<()> {
    server::db::migrate(&db.config).await?;
    ensure_rows(&db.config, args.rows).await?;
    let pool = batcher::pg::pool(
        db.config.clone(),
        &PoolOptions::with_max_size(args.pool_size),
    )?;
    let loader = PgLoader::new(pool.clone(), KvQuery);
    let rows = args.rows;
    let n = args.initiators;
    let mut results: Vec<Outcome> = Vec::new();

    eprintln!("warming up");
    batched_run(
        &loader,
        64,
        FlushPolicy::Eager,
        args,
        n,
        run.min(Duration::from_secs(5)),
        rows,
    )
    .await?;

    eprintln!(
        "ceiling: {} keys per query on {} connections",
        args.ceiling_keys, args.batch_concurrency
    );
    let ceiling = ceiling(&pool, args.batch_concurrency, args.ceiling_keys, rows, run).await;

    eprintln!("naive");
    let naive = {
        let loader = loader.clone();
        closed_loop(n, run, rows, move |k| {
            let loader = loader.clone();
            async move {
                loader.load_one(&key(k)).await.expect("naive read");
            }
        })
        .await
    };
    results.push(Outcome {
        path: "naive".into(),
        policy: "-",
        max_batch: None,
        initiators: n,
        report: naive,
        mean_batch: None,
    });

    eprintln!("pipelined on {} connections", args.pipeline_connections);
    let pipelined = pipelined_run(&db.config, args.pipeline_connections, n, run, rows).await?;
    results.push(Outcome {
        path: "pipelined".into(),
        policy: "-",
        max_batch: None,
        initiators: n,
        report: pipelined,
        mean_batch: None,
    });

    for (policy, name) in [
        (FlushPolicy::FixedDelay, "fixed 0.5 ms"),
        (FlushPolicy::Eager, "eager"),
        (FlushPolicy::Adaptive, "adaptive"),
    ] {
        for &size in &args.batch_sizes {
            eprintln!("batched, {name}, max batch {size}");
            let (report, mean) = batched_run(&loader, size, policy, args, n, run, rows).await?;
            results.push(Outcome {
                path: "batched".into(),
                policy: name,
                max_batch: Some(size),
                initiators: n,
                report,
                mean_batch: Some(mean),
            });
        }
    }

    eprintln!("cached (cache in front of the eager batcher, max batch 64)");
    let (cached, mean, hit_rate) = cached_run(&loader, args, n, run, rows).await?;
    results.push(Outcome {
        path: format!("cached ({:.0}% hits)", hit_rate * 100.0),
        policy: "eager",
        max_batch: Some(64),
        initiators: n,
        report: cached,
        mean_batch: Some(mean),
    });

    eprintln!("1 initiator: naive and eager batched (the batching tax at low load)");
    let one_naive = {
        let loader = loader.clone();
        closed_loop(1, run, rows, move |k| {
            let loader = loader.clone();
            async move {
                loader.load_one(&key(k)).await.expect("naive read");
            }
        })
        .await
    };
    let (one_eager, one_mean) =
        batched_run(&loader, 64, FlushPolicy::Eager, args, 1, run, rows).await?;
    let (one_adaptive, one_adaptive_mean) =
        batched_run(&loader, 64, FlushPolicy::Adaptive, args, 1, run, rows).await?;
    results.push(Outcome {
        path: "naive".into(),
        policy: "-",
        max_batch: None,
        initiators: 1,
        report: one_naive,
        mean_batch: None,
    });
    results.push(Outcome {
        path: "batched".into(),
        policy: "eager",
        max_batch: Some(64),
        initiators: 1,
        report: one_eager,
        mean_batch: Some(one_mean),
    });
    results.push(Outcome {
        path: "batched".into(),
        policy: "adaptive",
        max_batch: Some(64),
        initiators: 1,
        report: one_adaptive,
        mean_batch: Some(one_adaptive_mean),
    });

    print_table(&results, ceiling, args);
    append_csv(&args.csv, &results, ceiling, args)?;
    plot(&args.svg, &results, args.initiators)?;
    eprintln!(
        "appended to {} and drew {}",
        args.csv.display(),
        args.svg.display()
    );
    Ok(())
}

async fn batched_run(
    loader: &PgLoader<KvQuery>,
    size: usize,
    policy: FlushPolicy,
    args: &Args,
    n: usize,
    run: Duration,
    rows: u64,
) -> anyhow::Result<(RunReport, f64)> {
    let b: Batcher<String, String> = Batcher::builder()
        .max_batch_size(size)
        .policy(policy)
        .max_delay(Duration::from_micros(500))
        .max_concurrent_batches(args.batch_concurrency)
        .timeout(Duration::from_secs(30))
        .build(loader.clone())?;
    let report = {
        let b = b.clone();
        closed_loop(n, run, rows, move |k| {
            let b = b.clone();
            async move {
                b.load(key(k)).await.expect("batched read");
            }
        })
        .await
    };
    let mean = b.stats().batch_size.mean().unwrap_or(0.0);
    b.shutdown().await;
    Ok((report, mean))
}

async fn cached_run(
    loader: &PgLoader<KvQuery>,
    args: &Args,
    n: usize,
    run: Duration,
    rows: u64,
) -> anyhow::Result<(RunReport, f64, f64)> {
    let b: Batcher<String, String> = Batcher::builder()
        .max_concurrent_batches(args.batch_concurrency)
        .timeout(Duration::from_secs(30))
        .build(loader.clone())?;
    let cache = Cache::builder()
        .max_capacity(1_000_000)
        .build_with_batcher(b.clone())?;
    let report = {
        let cache = cache.clone();
        closed_loop(n, run, rows, move |k| {
            let cache = cache.clone();
            async move {
                cache.get(key(k)).await.expect("cached read");
            }
        })
        .await
    };
    let s = cache.stats();
    let lookups = (s.hits + s.misses + s.coalesced).max(1);
    let mean = b.stats().batch_size.mean().unwrap_or(0.0);
    b.shutdown().await;
    Ok((report, mean, s.hits as f64 / lookups as f64))
}

async fn pipelined_run(
    config: &tokio_postgres::Config,
    connections: usize,
    n: usize,
    run: Duration,
    rows: u64,
) -> anyhow::Result<RunReport> {
    let mut clients = Vec::with_capacity(connections);
    for _ in 0..connections {
        let (client, conn) = config.connect(NoTls).await?;
        tokio::spawn(conn);
        let stmt = client
            .prepare("SELECT pk, payload FROM random_read_test WHERE pk = $1")
            .await?;
        clients.push((client, stmt));
    }
    let clients = Arc::new(clients);
    let next = Arc::new(AtomicUsize::new(0));
    Ok(closed_loop(n, run, rows, move |k| {
        let clients = Arc::clone(&clients);
        let i = next.fetch_add(1, Relaxed) % clients.len();
        async move {
            let (client, stmt) = &clients[i];
            client
                .query_opt(stmt, &[&key(k)])
                .await
                .expect("pipelined read");
        }
    })
    .await)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn print_table(results: &[Outcome], ceiling: f64, args: &Args) {
    let naive = results
        .iter()
        .find(|o| o.path == "naive" && o.initiators == args.initiators)
        .map_or(1.0, |o| o.report.per_sec());
    println!(
        "\n{} rows, {} initiators, {:.1} s per run; ceiling ({} keys per `= ANY($1)`, {} connections): {:.0} keys/s\n",
        args.rows, args.initiators, args.seconds, args.ceiling_keys, args.batch_concurrency, ceiling
    );
    println!("| initiators | path | policy | max batch | reads/s | × naive | of ceiling | avg ms | p50 ms | p99 ms | max ms | mean batch |");
    println!("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for o in results {
        let r = &o.report;
        println!(
            "| {} | {} | {} | {} | {:.0} | {:.2} | {:.0}% | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
            o.initiators,
            o.path,
            o.policy,
            o.max_batch.map_or("-".to_owned(), |b| b.to_string()),
            r.per_sec(),
            r.per_sec() / naive,
            100.0 * r.per_sec() / ceiling,
            ms(r.mean()),
            ms(r.quantile(0.5)),
            ms(r.quantile(0.99)),
            ms(r.max()),
            o.mean_batch.map_or("-".to_owned(), |m| format!("{m:.1}")),
        );
    }
    let at = |path: &'static str, n: usize| runs(results, path, n);
    let best_batched = at("batched", args.initiators)
        .map(|o| o.report.per_sec())
        .fold(0.0, f64::max);
    let pipelined = at("pipelined", args.initiators)
        .map(|o| o.report.per_sec())
        .fold(0.0, f64::max);
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    println!();
    println!(
        "target: batched at least 80% of the bulk ceiling: {} ({:.0}%)",
        verdict(best_batched >= 0.8 * ceiling),
        100.0 * best_batched / ceiling
    );
    println!(
        "target: batched at least 6x naive: {} ({:.1}x)",
        verdict(best_batched >= 6.0 * naive),
        best_batched / naive
    );
    println!(
        "target: batched at least 2.5x pipelined: {} ({:.1}x)",
        verdict(best_batched >= 2.5 * pipelined),
        best_batched / pipelined.max(1.0)
    );
    let p50 = |path: &'static str| at(path, 1).next().map(|o| o.report.quantile(0.5));
    if let (Some(n1), Some(b1)) = (p50("naive"), p50("batched")) {
        println!(
            "target: eager with 1 initiator, p50 within 10% of naive: {} ({:.3} ms vs {:.3} ms)",
            verdict(b1.as_secs_f64() <= 1.1 * n1.as_secs_f64()),
            ms(b1),
            ms(n1)
        );
    }
}

/// The results of `path` with `n` initiators.
fn runs<'a>(
    results: &'a [Outcome],
    path: &'a str,
    n: usize,
) -> impl Iterator<Item = &'a Outcome> + 'a {
    results
        .iter()
        .filter(move |o| o.path == path && o.initiators == n)
}

fn append_csv(path: &Path, results: &[Outcome], ceiling: f64, args: &Args) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let new = !path.exists();
    let mut f = OpenOptions::new().create(true).append(true).open(path)?;
    if new {
        writeln!(f, "unix_time,rows,initiators,seconds,path,policy,max_batch,reads_per_sec,avg_ms,p50_ms,p99_ms,max_ms,mean_batch,ceiling_keys_per_sec")?;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for o in results {
        let r = &o.report;
        writeln!(
            f,
            "{now},{},{},{},{},{},{},{:.0},{:.3},{:.3},{:.3},{:.3},{},{:.0}",
            args.rows,
            o.initiators,
            args.seconds,
            o.path,
            o.policy,
            o.max_batch.map_or(String::new(), |b| b.to_string()),
            r.per_sec(),
            ms(r.mean()),
            ms(r.quantile(0.5)),
            ms(r.quantile(0.99)),
            ms(r.max()),
            o.mean_batch.map_or(String::new(), |m| format!("{m:.1}")),
            ceiling
        )?;
    }
    Ok(())
}

/// One half of the SVG.
type Panel<'a> =
    plotters::drawing::DrawingArea<plotters::backend::SVGBackend<'a>, plotters::coord::Shift>;
/// What a panel plots of a run.
type Metric = fn(&RunReport) -> f64;

fn plot(path: &Path, results: &[Outcome], initiators: usize) -> anyhow::Result<()> {
    use plotters::prelude::*;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let series = |policy: &str, value: Metric| -> Vec<(f64, f64)> {
        results
            .iter()
            .filter(|o| o.path == "batched" && o.policy == policy && o.initiators == initiators)
            .filter_map(|o| Some((o.max_batch? as f64, value(&o.report))))
            .collect()
    };
    let root = SVGBackend::new(path, (900, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (top, bottom) = root.split_vertically(450);
    let max_batch = results
        .iter()
        .filter_map(|o| o.max_batch)
        .max()
        .unwrap_or(64) as f64;
    let panels: [(&Panel<'_>, &str, &str, Metric); 2] = [
        (
            &top,
            "Reads per second against max batch size",
            "reads/s",
            |r| r.per_sec(),
        ),
        (
            &bottom,
            "p99 latency against max batch size",
            "p99 ms",
            |r| ms(r.quantile(0.99)),
        ),
    ];
    for (area, title, y_desc, value) in panels {
        let fixed = series("fixed 0.5 ms", value);
        let eager = series("eager", value);
        let adaptive = series("adaptive", value);
        let y_max = fixed
            .iter()
            .chain(&eager)
            .chain(&adaptive)
            .map(|p| p.1)
            .fold(0.0, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..max_batch, 0f64..y_max.max(1.0))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_desc("max batch size")
            .y_desc(y_desc)
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        for (points, label, color) in [
            (fixed, "fixed 0.5 ms", RED),
            (eager, "eager", BLUE),
            (adaptive, "adaptive", GREEN),
        ] {
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE)
            .border_style(BLACK)
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}
