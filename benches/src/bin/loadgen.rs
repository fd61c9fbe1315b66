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

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use benches::reads::{self, TableArgs};
use benches::Align::{Left, Right};
use benches::RunReport;
use benches::{ms, print_markdown, LATENCY_COLUMNS};
use clap::Parser;
use pgbatch::cache::Admission;
use pgbatch::pg::PoolOptions;
use pgbatch::FlushPolicy;
use server::cli::ConcurrencyArg;
use server::db::Database;
use server::settings::BatchSettings;

/// The allocator the server binary uses: these runs measure the server's
/// lookups (its statements, its loader), and with glibc's malloc a sixth
/// of this process's CPU went to allocating, on cores it shares with
/// Postgres (BENCHMARKS.md, "How close to the database's limit").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The batch cap of the cached runs, and of the batched run they are held
/// to: the crate's default.
const DEFAULT_BATCH: usize = pgbatch::defaults::MAX_BATCH_SIZE;

/// Reproduces the seed benchmark against this project's read paths.
#[derive(Debug, Parser)]
#[command(about)]
struct Args {
    #[command(flatten)]
    table: TableArgs,
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
    /// Batched statements at once: `auto` (the default, found by
    /// measurement up to `--pool-size`), or a fixed number (the seed's
    /// reader goroutines: 10).
    #[arg(long, default_value = "auto")]
    batch_concurrency: ConcurrencyArg,
    /// Connections of the bulk ceiling and of the statements comparison.
    #[arg(long, default_value_t = 10)]
    ceiling_connections: usize,
    /// Shared connections of the pipelined path.
    #[arg(long, default_value_t = 4)]
    pipeline_connections: usize,
    /// Keys per query when measuring the bulk ceiling.
    #[arg(long, default_value_t = 10_000)]
    ceiling_keys: usize,
    /// Rounds of the statements comparison; each round runs every form for
    /// `--seconds` with the largest of `--batch-sizes` keys per statement
    /// on `--ceiling-connections` connections.
    #[arg(long, default_value_t = 3)]
    statement_rounds: usize,
    /// Key spaces of the cached runs, comma-separated: each run reads
    /// uniformly random keys among the table's first N rows. By default
    /// the whole table, far more keys than the cache's 1,000,000; a
    /// smaller space, such as 100000, fits in it.
    #[arg(long, value_delimiter = ',')]
    cached_keys: Vec<u64>,
    /// CSV file results are appended to.
    #[arg(long, default_value = "target/loadgen/statistics.csv")]
    csv: PathBuf,
    /// SVG plot of throughput and p99 against batch size.
    #[arg(long, default_value = "target/loadgen/batching.svg")]
    svg: PathBuf,
    /// Runs to make, of: ceiling, naive, pipelined, fixed, eager, adaptive,
    /// cached, single (the 1-initiator runs), and statements (not by
    /// default: the batched statement's forms compared, see
    /// `--statement-rounds`). A partial run prints no verdict that needs a
    /// missing run (to profile one path, say).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "ceiling,naive,pipelined,fixed,eager,adaptive,cached,single"
    )]
    only: Vec<Run>,
}

/// The runs `--only` chooses from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Run {
    /// The bulk ceiling: big `= ANY` statements on several connections.
    Ceiling,
    /// The batched statement's forms compared.
    Statements,
    /// One statement per read.
    Naive,
    /// Every initiator's statement in flight on a few shared connections.
    Pipelined,
    /// Batched, fixed 0.5 ms delay.
    Fixed,
    /// Batched, eager.
    Eager,
    /// Batched, adaptive.
    Adaptive,
    /// Through the cache, both admissions.
    Cached,
    /// One initiator.
    Single,
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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    benches::log_from_env();
    let mut args = Args::parse();
    args.table.apply_smoke("loadgen");
    if args.table.smoke {
        args.seconds = 0.3;
        args.batch_sizes = vec![1, 16];
        args.ceiling_keys = 1_000;
        // CI's proof that the statements comparison runs too.
        if !args.only.contains(&Run::Statements) {
            args.only.push(Run::Statements);
        }
        args.statement_rounds = 1;
    }
    // Checked before any run, not after minutes of them.
    let rows = args.table.rows;
    if let Some(keys) = args.cached_keys.iter().find(|k| !(1..=rows).contains(*k)) {
        anyhow::bail!("--cached-keys {keys}: between 1 and the table's {rows} rows");
    }
    let run = Duration::from_secs_f64(args.seconds);
    args.table
        .with_table(|o| o, async |db| measure(&args, db, run).await)
        .await
}

async fn measure(args: &Args, db: &Database, run: Duration) -> anyhow::Result<()> {
    let pool = pgbatch::pg::pool(
        db.config.clone(),
        &PoolOptions::with_max_size(args.pool_size),
    )?;
    let rows = args.table.rows;
    let n = args.initiators;
    let settings = |max_batch_size, policy| BatchSettings {
        max_batch_size,
        policy,
        concurrency: args.batch_concurrency.0,
        ..BatchSettings::default()
    };
    let mut results: Vec<Outcome> = Vec::new();
    let mut push = |path: &str, policy, max_batch, initiators, report, mean_batch| {
        results.push(Outcome {
            path: path.to_owned(),
            policy,
            max_batch,
            initiators,
            report,
            mean_batch,
        });
    };

    let want = |run: Run| args.only.contains(&run);

    eprintln!("warming up");
    let warm_up = run.min(Duration::from_secs(5));
    reads::batched_run(&pool, settings(64, FlushPolicy::Eager), n, warm_up, rows).await?;

    let ceiling = if want(Run::Ceiling) {
        eprintln!(
            "ceiling: {} keys per query on {} connections",
            args.ceiling_keys, args.ceiling_connections
        );
        reads::ceiling(
            &db.config,
            args.ceiling_connections,
            args.ceiling_keys,
            rows,
            run,
        )
        .await?
    } else {
        f64::NAN
    };
    if want(Run::Statements) {
        compare_statements(args, &db.config, run).await?;
    }

    if want(Run::Naive) {
        eprintln!("naive");
        let naive = reads::naive_run(&pool, n, run, rows).await;
        push("naive", "-", None, n, naive, None);
    }

    if want(Run::Pipelined) {
        eprintln!("pipelined on {} connections", args.pipeline_connections);
        let pipelined =
            reads::pipelined_run(&db.config, args.pipeline_connections, n, run, rows).await?;
        push("pipelined", "-", None, n, pipelined, None);
    }

    for (policy, run_name, name) in [
        (FlushPolicy::FixedDelay, Run::Fixed, "fixed 0.5 ms"),
        (FlushPolicy::Eager, Run::Eager, "eager"),
        (FlushPolicy::Adaptive, Run::Adaptive, "adaptive"),
    ] {
        if !want(run_name) {
            continue;
        }
        for &size in &args.batch_sizes {
            eprintln!("batched, {name}, max batch {size}");
            let (report, mean) =
                reads::batched_run(&pool, settings(size, policy), n, run, rows).await?;
            push("batched", name, Some(size), n, report, Some(mean));
        }
    }

    // Both admission rules: with uniform keys over the table, nearly every
    // key is read once, which is what `second-miss` is for; over a key
    // space that fits in the cache, every key is read again and again.
    if want(Run::Cached) {
        let spaces = if args.cached_keys.is_empty() {
            vec![rows]
        } else {
            args.cached_keys.clone()
        };
        for keys in spaces {
            let space = if keys == rows {
                String::new()
            } else {
                format!(", {keys} keys")
            };
            for (admission, label) in [
                (Admission::Always, ""),
                (Admission::SecondMiss, ", second miss"),
            ] {
                eprintln!(
                    "cached{label}{space} (cache in front of the eager batcher, max batch {DEFAULT_BATCH})"
                );
                let batch = settings(DEFAULT_BATCH, FlushPolicy::Eager);
                let cached = reads::cached_run(&pool, batch, admission, n, run, keys).await?;
                push(
                    &format!(
                        "cached{label}{space} ({:.0}% hits)",
                        cached.hit_rate * 100.0
                    ),
                    "eager",
                    Some(DEFAULT_BATCH),
                    n,
                    cached.report,
                    Some(cached.mean_batch),
                );
            }
        }
    }

    if want(Run::Single) {
        eprintln!("1 initiator: naive and batched (the batching tax at low load)");
        let one_naive = reads::naive_run(&pool, 1, run, rows).await;
        push("naive", "-", None, 1, one_naive, None);
        for (policy, name) in [
            (FlushPolicy::Eager, "eager"),
            (FlushPolicy::Adaptive, "adaptive"),
        ] {
            let (report, mean) =
                reads::batched_run(&pool, settings(64, policy), 1, run, rows).await?;
            push("batched", name, Some(64), 1, report, Some(mean));
        }
    }

    if results.is_empty() && !ceiling.is_finite() {
        return Ok(());
    }
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

/// Runs every form of `reads::STATEMENTS` in turn, `--statement-rounds`
/// times, and prints each form's median keys/s, its range, and its ratio
/// to `= ANY($1)` with the server's default plan choice.
async fn compare_statements(
    args: &Args,
    config: &tokio_postgres::Config,
    run: Duration,
) -> anyhow::Result<()> {
    let keys = args.batch_sizes.iter().copied().max().unwrap_or(64);
    let connections = args.ceiling_connections;
    let mut rates = vec![Vec::new(); reads::STATEMENTS.len()];
    for round in 0..args.statement_rounds.max(1) {
        for (i, (name, setup, sql)) in reads::STATEMENTS.iter().enumerate() {
            eprintln!("statements, round {}: {name}", round + 1);
            rates[i].push(
                reads::statement_rate(config, setup, sql, connections, keys, args.table.rows, run)
                    .await?,
            );
        }
    }
    let median = benches::rounds::median;
    let base = median(&rates[0]);
    println!(
        "\nThe batched statement's forms: {keys} random keys per statement, {connections} connections, {} rounds of {:.1} s, interleaved\n",
        rates[0].len(),
        args.seconds
    );
    print_markdown(
        &[
            ("statement", Left),
            ("keys/s (median)", Right),
            ("range", Right),
            ("× `= ANY($1)`", Right),
        ],
        reads::STATEMENTS
            .iter()
            .zip(&rates)
            .map(|((name, _, _), rates)| {
                let m = median(rates);
                let (lo, hi) = benches::rounds::range_by(rates, |x| *x);
                vec![
                    (*name).to_owned(),
                    format!("{m:.0}"),
                    format!("{lo:.0}-{hi:.0}"),
                    format!("{:.2}", m / base),
                ]
            }),
    );
    Ok(())
}

fn print_table(results: &[Outcome], ceiling: f64, args: &Args) {
    let naive = results
        .iter()
        .find(|o| o.path == "naive" && o.initiators == args.initiators)
        .map(|o| o.report.per_sec());
    // A ratio against a run that was not made (see `--only`) prints as "-".
    let ratio = |x: f64, of: Option<f64>, fmt: fn(f64) -> String| {
        of.filter(|v| v.is_finite() && *v > 0.0)
            .map_or("-".to_owned(), |v| fmt(x / v))
    };
    let ceiling = Some(ceiling).filter(|c| c.is_finite());
    println!(
        "\n{} rows, {} initiators, {:.1} s per run; ceiling ({} keys per `= ANY($1)`, {} connections): {} keys/s\n",
        args.table.rows,
        args.initiators,
        args.seconds,
        args.ceiling_keys,
        args.ceiling_connections,
        ceiling.map_or("-".to_owned(), |c| format!("{c:.0}"))
    );
    let columns = [
        ("initiators", Right),
        ("path", Left),
        ("policy", Left),
        ("max batch", Right),
        ("reads/s", Right),
        ("× naive", Right),
        ("of ceiling", Right),
    ]
    .into_iter()
    .chain(LATENCY_COLUMNS)
    .chain([("mean batch", Right)])
    .collect::<Vec<_>>();
    print_markdown(
        &columns,
        results.iter().map(|o| {
            let r = &o.report;
            vec![
                o.initiators.to_string(),
                o.path.to_string(),
                o.policy.to_owned(),
                o.max_batch.map_or("-".to_owned(), |b| b.to_string()),
                format!("{:.0}", r.per_sec()),
                ratio(r.per_sec(), naive, |x| format!("{x:.2}")),
                ratio(r.per_sec(), ceiling, |x| format!("{:.0}%", x * 100.0)),
            ]
            .into_iter()
            .chain(r.latency_cells())
            .chain([o.mean_batch.map_or("-".to_owned(), |m| format!("{m:.1}"))])
            .collect()
        }),
    );
    let at = |path: &'static str, n: usize| runs(results, path, n);
    let best = |path: &'static str| {
        at(path, args.initiators)
            .map(|o| o.report.per_sec())
            .reduce(f64::max)
    };
    println!();
    if let Some(batched) = best("batched") {
        print_batched_verdicts(batched, ceiling, naive, best("pipelined"));
    }
    // The target: a miss about as cheap as the batched load it wraps, against
    // the eager batcher at the cached runs' max batch (the default).
    let eager_default = at("batched", args.initiators)
        .find(|o| o.policy == "eager" && o.max_batch == Some(DEFAULT_BATCH))
        .map(|o| o.report.per_sec());
    let second_miss = results
        .iter()
        .find(|o| o.path.starts_with("cached, second miss (") && o.initiators == args.initiators)
        .map(|o| o.report.per_sec());
    if let (Some(eager), Some(cached)) = (eager_default, second_miss) {
        println!(
            "target: cached (second miss, uniform keys) at least 0.95x batched (eager, max batch {DEFAULT_BATCH}): {} ({:.2}x)",
            verdict(cached >= 0.95 * eager),
            cached / eager
        );
    }
    let p50 = |path: &'static str| at(path, 1).next().map(|o| o.report.quantile(0.5));
    if let (Some(n1), Some(b1)) = (p50("naive"), p50("batched")) {
        println!(
            "target: eager with 1 initiator, p50 at most 1.05x naive: {} ({:.3} ms vs {:.3} ms)",
            verdict(b1.as_secs_f64() <= 1.05 * n1.as_secs_f64()),
            ms(b1),
            ms(n1)
        );
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

/// The verdicts on the best batched reads/s, for the runs that were made.
fn print_batched_verdicts(
    batched: f64,
    ceiling: Option<f64>,
    naive: Option<f64>,
    pipelined: Option<f64>,
) {
    if let Some(c) = ceiling {
        println!(
            "target: batched at least 75% of the bulk ceiling: {} ({:.0}%)",
            verdict(batched >= 0.75 * c),
            100.0 * batched / c
        );
    }
    if let Some(naive) = naive {
        println!(
            "target: batched at least 6x naive: {} ({:.1}x)",
            verdict(batched >= 6.0 * naive),
            batched / naive
        );
    }
    if let Some(pipelined) = pipelined {
        println!(
            "target: batched at least 2.5x pipelined: {} ({:.1}x)",
            verdict(batched >= 2.5 * pipelined),
            batched / pipelined
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
    let (mut f, now) = benches::append_csv(
        path,
        "unix_time,rows,initiators,seconds,path,policy,max_batch,reads_per_sec,avg_ms,p50_ms,p99_ms,max_ms,mean_batch,ceiling_keys_per_sec",
    )?;
    for o in results {
        let r = &o.report;
        writeln!(
            f,
            "{now},{},{},{},{},{},{},{:.0},{:.3},{:.3},{:.3},{:.3},{},{:.0}",
            args.table.rows,
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
