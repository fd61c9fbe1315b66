//! The seed benchmark's read paths with added network round-trip time
//! (after seed 004): Postgres is reached through a latency proxy that adds
//! 0, 0.5 and 5 ms per round trip (half each way; `benches::delay_proxy`,
//! in this process, nothing to install), and naive, pipelined and batched
//! reads are measured at each, beside a run without the proxy. The `lookup`
//! path times one caller's cache hit against one uncached lookup at each
//! round trip.
//!
//! ```text
//! cargo run --release -p benches --bin latency             # 10M rows, 300 initiators
//! cargo run --release -p benches --bin latency -- --paths lookup --rtt-ms 0.5,1
//! cargo run --release -p benches --bin latency -- --smoke  # seconds, for CI
//! ```

use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;
use benches::delay_proxy::DelayProxy;
use benches::reads::{self, TableArgs};
use benches::Align::{Left, Right};
use benches::RunReport;
use benches::{ms, print_markdown, LATENCY_COLUMNS};
use clap::Parser;
use pgbatch::pg::PoolOptions;
use pgbatch::FlushPolicy;
use server::cli::{ConcurrencyArg, PolicyArg};
use server::db::Database;
use server::settings::BatchSettings;

/// Measures the read paths against Postgres behind added round-trip time.
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
    /// Added round-trip times in milliseconds.
    #[arg(long, value_delimiter = ',', default_value = "0,0.5,5")]
    rtt_ms: Vec<f64>,
    /// Connections of the naive path, and statements the batcher runs at
    /// once: both paths get the same number of connections.
    #[arg(long, default_value_t = 10)]
    connections: usize,
    /// Shared connections of the pipelined path.
    #[arg(long, default_value_t = 4)]
    pipeline_connections: usize,
    /// Batched statements at once: `auto` (the default, found by
    /// measurement up to `--connections`), or a fixed number.
    #[arg(long, default_value = "auto")]
    batch_concurrency: ConcurrencyArg,
    /// The batcher's max batch size.
    #[arg(long, default_value_t = 64)]
    max_batch: usize,
    /// The batcher's flush policy.
    #[arg(long, value_enum, default_value_t = PolicyArg::Adaptive)]
    policy: PolicyArg,
    /// The paths to measure at each round trip.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "naive,pipelined,batched,lookup"
    )]
    paths: Vec<PathArg>,
    /// Sequential uncached lookups timed by the `lookup` path (hits: 100
    /// times as many).
    #[arg(long, default_value_t = 2_000)]
    lookups: u64,
    /// CSV file results are appended to.
    #[arg(long, default_value = "target/loadgen/latency.csv")]
    csv: PathBuf,
}

/// A path `--paths` can select.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum PathArg {
    /// One statement per read on a pooled connection.
    Naive,
    /// Single-key statements pipelined on shared connections.
    Pipelined,
    /// Reads through the batcher.
    Batched,
    /// One caller: a cache hit against an uncached lookup.
    Lookup,
}

/// A `lookup` result at one round trip.
struct LookupOutcome {
    added_rtt_ms: Option<f64>,
    measured_rtt: Duration,
    times: reads::HitVsUncached,
}

/// One row of results.
struct Outcome {
    /// `None`: straight to Postgres, no proxy.
    added_rtt_ms: Option<f64>,
    /// `SELECT 1` round trip, mean.
    measured_rtt: Duration,
    path: &'static str,
    report: RunReport,
    mean_batch: Option<f64>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    args.table.apply_smoke("latency");
    if args.table.smoke {
        args.seconds = 0.3;
        args.initiators = 32;
        args.lookups = args.lookups.min(50);
    }
    // A free loopback port for the cluster's TCP listener, which the
    // proxies forward to.
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    args.table
        .with_table(
            |options| options.port(port).listen_tcp(true),
            async |db| measure(&args, db).await,
        )
        .await
}

async fn measure(args: &Args, db: &Database) -> anyhow::Result<()> {
    let (upstream, direct) = reads::tcp_target(db).await?;
    let run = Duration::from_secs_f64(args.seconds);
    let rows = args.table.rows;
    let n = args.initiators;
    let settings = BatchSettings {
        max_batch_size: args.max_batch,
        policy: FlushPolicy::from(args.policy),
        concurrency: args.batch_concurrency.0,
        ..BatchSettings::default()
    };

    let mut targets: Vec<(Option<f64>, tokio_postgres::Config)> = vec![(None, direct.clone())];
    let mut proxies = Vec::new();
    for &ms in &args.rtt_ms {
        if !(0.0..=10_000.0).contains(&ms) {
            bail!("--rtt-ms {ms}: an added round trip is 0 to 10,000 ms");
        }
        let proxy = DelayProxy::start(upstream, Duration::from_secs_f64(ms / 1e3))?;
        targets.push((Some(ms), reads::via(&direct, proxy.addr())));
        proxies.push(proxy);
    }

    let mut results = Vec::new();
    let mut lookups = Vec::new();
    for (i, (added, config)) in targets.iter().enumerate() {
        let label = added.map_or("no proxy".to_owned(), |ms| format!("+{ms} ms"));
        let measured_rtt = reads::round_trip(config, 200).await?;
        eprintln!(
            "{label}: SELECT 1 round trip {:.3} ms",
            measured_rtt.as_secs_f64() * 1e3
        );
        let pool = pgbatch::pg::pool(
            config.clone(),
            &PoolOptions::with_max_size(args.connections),
        )?;
        if args.paths.contains(&PathArg::Lookup) {
            eprintln!("{label}: one caller, cache hit vs uncached lookup");
            let hits = if args.table.smoke {
                1_000
            } else {
                100 * args.lookups
            };
            let times = reads::hit_vs_uncached(&pool, rows, hits, args.lookups).await?;
            lookups.push(LookupOutcome {
                added_rtt_ms: *added,
                measured_rtt,
                times,
            });
        }
        if !args.paths.iter().any(|p| *p != PathArg::Lookup) {
            continue;
        }
        if i == 0 {
            eprintln!("warming up");
            let warm = run.min(Duration::from_secs(5));
            reads::batched_run(&pool, settings, n, warm, rows).await?;
        }
        let mut push = |path, report, mean_batch| {
            results.push(Outcome {
                added_rtt_ms: *added,
                measured_rtt,
                path,
                report,
                mean_batch,
            });
        };
        if args.paths.contains(&PathArg::Naive) {
            eprintln!("{label}: naive on {} connections", args.connections);
            push("naive", reads::naive_run(&pool, n, run, rows).await, None);
        }
        if args.paths.contains(&PathArg::Pipelined) {
            eprintln!(
                "{label}: pipelined on {} connections",
                args.pipeline_connections
            );
            let pipelined =
                reads::pipelined_run(config, args.pipeline_connections, n, run, rows).await?;
            push("pipelined", pipelined, None);
        }
        if args.paths.contains(&PathArg::Batched) {
            eprintln!(
                "{label}: batched, {:?}, max batch {}, {} at once",
                args.policy, args.max_batch, args.connections
            );
            let (report, mean) = reads::batched_run(&pool, settings, n, run, rows).await?;
            push("batched", report, Some(mean));
        }
    }

    if !results.is_empty() {
        print_table(&results, args);
        append_csv(&args.csv, &results, args)?;
        eprintln!("appended to {}", args.csv.display());
    }
    if !lookups.is_empty() {
        print_lookups(&lookups);
    }
    Ok(())
}

/// The `lookup` path's table and the cache's target (a hit at
/// least 1,000x faster than an uncached lookup), judged at the round trips
/// of a real network (0.5 ms or more added).
fn print_lookups(lookups: &[LookupOutcome]) {
    println!("\nOne caller, sequential: a cache hit (server's cached read path, key cached) vs an uncached single-row lookup\n");
    print_markdown(
        &[
            ("added RTT", Left),
            ("SELECT 1 mean ms", Right),
            ("cache hit ns", Right),
            ("uncached lookup µs", Right),
            ("uncached / hit", Right),
        ],
        lookups.iter().map(|o| {
            let t = o.times;
            vec![
                label(o.added_rtt_ms),
                format!("{:.3}", ms(o.measured_rtt)),
                t.hit.as_nanos().to_string(),
                format!("{:.1}", t.uncached.as_secs_f64() * 1e6),
                format!("{:.0}x", t.uncached.as_secs_f64() / t.hit.as_secs_f64()),
            ]
        }),
    );
    println!();
    for o in lookups.iter().filter(|o| o.added_rtt_ms >= Some(0.5)) {
        let ratio = o.times.uncached.as_secs_f64() / o.times.hit.as_secs_f64();
        println!(
            "target: a cache hit at least 1,000x faster than an uncached lookup at {}: {} ({ratio:.0}x)",
            label(o.added_rtt_ms),
            if ratio >= 1000.0 { "met" } else { "MISSED" }
        );
    }
}

fn label(added: Option<f64>) -> String {
    added.map_or("none (no proxy)".to_owned(), |ms| format!("{ms} ms"))
}

fn print_table(results: &[Outcome], args: &Args) {
    println!(
        "\n{} rows, {} initiators, {:.1} s per run; naive and batched on {} connections, pipelined on {}; batched: {:?}, max batch {}\n",
        args.table.rows,
        args.initiators,
        args.seconds,
        args.connections,
        args.pipeline_connections,
        args.policy,
        args.max_batch
    );
    let naive_at = |added: Option<f64>| {
        results
            .iter()
            .find(|o| o.added_rtt_ms == added && o.path == "naive")
            .map_or(1.0, |o| o.report.per_sec())
    };
    let columns = [
        ("added RTT", Left),
        ("SELECT 1 mean ms", Right),
        ("path", Left),
        ("reads/s", Right),
        ("× naive", Right),
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
                label(o.added_rtt_ms),
                format!("{:.3}", ms(o.measured_rtt)),
                o.path.to_owned(),
                format!("{:.0}", r.per_sec()),
                format!("{:.1}", r.per_sec() / naive_at(o.added_rtt_ms)),
            ]
            .into_iter()
            .chain(r.latency_cells())
            .chain([o.mean_batch.map_or("-".to_owned(), |m| format!("{m:.1}"))])
            .collect()
        }),
    );
    println!();
    // With c connections each doing one statement per round trip, naive
    // reads at most c per RTT, and the batched path at most n (every
    // initiator in flight) per RTT: n / c bounds the ratio.
    println!(
        "bound: batched / naive ≤ initiators / connections = {:.0} once the RTT dominates",
        args.initiators as f64 / args.connections as f64
    );
    if let Some(b) = results
        .iter()
        .find(|o| o.added_rtt_ms == Some(5.0) && o.path == "batched")
    {
        let ratio = b.report.per_sec() / naive_at(Some(5.0));
        println!(
            "target: at 5 ms added RTT, batched at least 30x naive: {} ({ratio:.1}x)",
            if ratio >= 30.0 { "met" } else { "MISSED" }
        );
    }
}

fn append_csv(path: &Path, results: &[Outcome], args: &Args) -> anyhow::Result<()> {
    let (mut f, now) = benches::append_csv(
        path,
        "unix_time,rows,initiators,connections,seconds,added_rtt_ms,select1_mean_ms,path,reads_per_sec,avg_ms,p50_ms,p99_ms,max_ms,mean_batch",
    )?;
    for o in results {
        let r = &o.report;
        writeln!(
            f,
            "{now},{},{},{},{},{},{:.3},{},{:.0},{:.3},{:.3},{:.3},{:.3},{}",
            args.table.rows,
            args.initiators,
            args.connections,
            args.seconds,
            o.added_rtt_ms
                .map_or("direct".to_owned(), |m| m.to_string()),
            ms(o.measured_rtt),
            o.path,
            r.per_sec(),
            ms(r.mean()),
            ms(r.quantile(0.5)),
            ms(r.quantile(0.99)),
            ms(r.max()),
            o.mean_batch.map_or(String::new(), |m| format!("{m:.1}")),
        )?;
    }
    Ok(())
}
