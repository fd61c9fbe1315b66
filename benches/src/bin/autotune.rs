//! The automatic concurrency limit (`--batch-concurrency auto`, the
//! default) against every fixed one, and under a world that changes.
//!
//! - `sweep`: at each added round trip (`--rtt-ms`: 0 is the database
//!   direct, others through the latency proxy) and number of initiators
//!   (`--initiators`), the batcher at its defaults beside each fixed
//!   concurrency of `--fixed`, in `--rounds` interleaved rounds, each run
//!   measured after a warm-up. Prints, per point, the median and range of
//!   each, the best fixed one, and auto over it; one initiator's median
//!   latency against naive reads; and at 300 initiators without added
//!   round trip, auto as a fraction of the bulk ceiling measured in the
//!   same rounds. Writes a CSV and an SVG of reads/s against the fixed
//!   concurrency, with auto drawn across.
//! - `timeline`: 300 initiators through the defaults while the world
//!   changes every `--phase-seconds`: the proxy's added round trip goes
//!   from 0 to 5 ms and back, then a competing bulk load starts and stops.
//!   Prints and plots throughput, p99 and the chosen limit every 100 ms,
//!   and how long throughput took after each change to reach 90% of what
//!   the new phase settles at.
//! - `baseline` (only when named, and in `--smoke`): the strongest fair
//!   baseline of issue 43, the eager batcher an engineer writes by hand
//!   (`benches::minimal`: fixed connections, a batch cap). Each setting of
//!   `--baseline-connections` by `--baseline-caps` runs once, at
//!   `--baseline-initiators` against the database direct; the best by
//!   reads/s then meets the batcher at its defaults in `--rounds`
//!   interleaved rounds. Prints both, and defaults over that best per
//!   round for reads/s (target: at least 1.0) and p99 (target: below 1.0).
//!   Nothing is written: its figures only mean something beside each
//!   other.
//!
//! ```text
//! cargo run --release -p benches --bin autotune                  # both, tens of minutes
//! cargo run --release -p benches --bin autotune -- --only timeline
//! cargo run --release -p benches --bin autotune -- --only baseline
//! cargo run --release -p benches --bin autotune -- --smoke       # seconds, for CI
//! ```

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use benches::delay_proxy::DelayProxy;
use benches::reads::{self, TableArgs};
use benches::rounds::{median, median_by, range_by, spread};
use benches::{closed_loop_timeline, ms, print_markdown, Align, KeyStream, RunReport, Timeline};
use clap::Parser;
use pgbatch::pg::{BatchQuery as _, Pool, PoolOptions};
use pgbatch::Concurrency;
use server::db::queries::kv::KvQuery;
use server::db::Database;
use server::domain::lookup::Lookup;
use server::settings::{BatchSettings, ReadPath};
use tokio_postgres::NoTls;

/// The allocator the server binary uses: these runs measure the server's
/// lookups (its statements, its loader), and with glibc's malloc a sixth
/// of this process's CPU went to allocating, on cores it shares with
/// Postgres (BENCHMARKS.md §2).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Measures the automatic concurrency limit against fixed ones.
#[derive(Debug, Parser)]
#[command(about)]
struct Args {
    #[command(flatten)]
    table: TableArgs,
    /// What to run: `sweep`, `timeline`, `baseline` (not by default;
    /// `--smoke` adds it).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "sweep,timeline"
    )]
    only: Vec<Part>,
    /// Interleaved rounds of the sweep, and of the baseline's comparison.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds measured per run.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Seconds of the same load before each run is measured.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Initiators of the sweep.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,300,1000")]
    initiators: Vec<usize>,
    /// Added round trips of the sweep, in milliseconds (0: no proxy).
    #[arg(long, value_delimiter = ',', default_value = "0,0.5,5")]
    rtt_ms: Vec<f64>,
    /// Fixed concurrencies the sweep compares auto with.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5,6,8,10,12,16")]
    fixed: Vec<usize>,
    /// Connections of the pool (auto's bound).
    #[arg(long, default_value_t = 16)]
    pool_size: usize,
    /// Connections the baseline's minimal batcher is swept over (one
    /// worker, and so one batch in flight, per connection).
    #[arg(long, value_delimiter = ',', default_value = "2,3,4,6,8,10")]
    baseline_connections: Vec<usize>,
    /// Batch caps the baseline's minimal batcher is swept over, with each
    /// of `--baseline-connections`.
    #[arg(long, value_delimiter = ',', default_value = "64,128,256")]
    baseline_caps: Vec<usize>,
    /// Initiators of the baseline: 300, the load of the sweep's targets
    /// for the bulk ceiling and p99.
    #[arg(long, default_value_t = 300)]
    baseline_initiators: usize,
    /// Seconds of each phase of the timeline.
    #[arg(long, default_value_t = 8.0)]
    phase_seconds: f64,
    /// CSV file the sweep's runs are appended to.
    #[arg(long, default_value = "target/loadgen/autotune.csv")]
    csv: PathBuf,
    /// SVG of the sweep.
    #[arg(long, default_value = "target/loadgen/autotune.svg")]
    svg: PathBuf,
    /// SVG of the timeline.
    #[arg(long, default_value = "target/loadgen/autotune-timeline.svg")]
    timeline_svg: PathBuf,
}

/// A part `--only` can select.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    /// Auto beside fixed concurrencies at each round trip and load.
    Sweep,
    /// Auto while the round trip and the competing load change.
    Timeline,
    /// The defaults against the best setting of a hand-written batcher.
    Baseline,
}

/// The batcher's concurrency in one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Setting {
    Auto,
    Fixed(usize),
    /// One statement per read, for one initiator's latency.
    Naive,
}

impl Setting {
    fn label(self) -> String {
        match self {
            Setting::Auto => "auto".to_owned(),
            Setting::Fixed(n) => n.to_string(),
            Setting::Naive => "naive".to_owned(),
        }
    }
}

/// One run's figures.
#[derive(Debug, Clone, Copy)]
struct Sample {
    per_sec: f64,
    p50: Duration,
    p99: Duration,
    mean_batch: f64,
    limit: u64,
}

impl Sample {
    fn of(report: &RunReport, mean_batch: f64, limit: u64) -> Self {
        Self {
            per_sec: report.per_sec(),
            p50: report.quantile(0.5),
            p99: report.quantile(0.99),
            mean_batch,
            limit,
        }
    }
}

/// Runs by (round trip index, initiators, setting).
type Samples = BTreeMap<(usize, usize, Setting), Vec<Sample>>;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    benches::log_from_env();
    let mut args = Args::parse();
    args.table.apply_smoke("autotune");
    if args.table.smoke {
        args.rounds = 1;
        args.seconds = 0.3;
        args.warmup = 0.1;
        args.initiators = vec![1, 32];
        args.rtt_ms = vec![0.0, 1.0];
        args.fixed = vec![2, 4];
        args.phase_seconds = 0.5;
        args.baseline_connections = vec![2, 4];
        args.baseline_caps = vec![64];
        args.baseline_initiators = 32;
        // CI's proof that the baseline runs, though no default run has it.
        if !args.only.contains(&Part::Baseline) {
            args.only.push(Part::Baseline);
        }
    }
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    args.table
        .with_table(
            |options| options.port(port).listen_tcp(true),
            async |db| measure(&args, db).await,
        )
        .await
}

async fn measure(args: &Args, db: &Database) -> anyhow::Result<()> {
    if args.only.contains(&Part::Sweep) {
        sweep(args, db).await?;
    }
    if args.only.contains(&Part::Timeline) {
        timeline(args, db).await?;
    }
    if args.only.contains(&Part::Baseline) {
        baseline(args, db).await?;
    }
    Ok(())
}

/// The batch settings of a run: the server's defaults, but `concurrency`.
fn settings(setting: Setting) -> BatchSettings {
    BatchSettings {
        concurrency: match setting {
            Setting::Fixed(n) => Concurrency::Fixed(n),
            _ => BatchSettings::default().concurrency,
        },
        ..BatchSettings::default()
    }
}

async fn sweep(args: &Args, db: &Database) -> anyhow::Result<()> {
    let (upstream, direct_tcp) = reads::tcp_target(db).await?;
    let rows = args.table.rows;
    let run = Duration::from_secs_f64(args.seconds);
    let warmup = Duration::from_secs_f64(args.warmup);
    // One pool per round trip, kept across rounds (and its proxy alive).
    let mut targets = Vec::new();
    for &ms in &args.rtt_ms {
        anyhow::ensure!(
            (0.0..=1_000.0).contains(&ms),
            "--rtt-ms {ms}: 0 to 1,000 ms"
        );
        let (config, proxy) = if ms == 0.0 {
            (db.config.clone(), None)
        } else {
            let proxy = DelayProxy::start(upstream, Duration::from_secs_f64(ms / 1e3))?;
            (reads::via(&direct_tcp, proxy.addr()), Some(proxy))
        };
        let pool = pgbatch::pg::pool(config, &PoolOptions::with_max_size(args.pool_size))?;
        targets.push((ms, pool, proxy));
    }
    let mut settings_list = vec![Setting::Auto];
    settings_list.extend(args.fixed.iter().map(|&n| Setting::Fixed(n)));

    eprintln!("warming up");
    reads::batched_run_warm(
        &targets[0].1,
        settings(Setting::Auto),
        300,
        warmup,
        run,
        rows,
    )
    .await?;

    let mut samples = Samples::new();
    let mut ceilings = Vec::new();
    for round in 0..args.rounds {
        eprintln!("round {} of {}: ceiling", round + 1, args.rounds);
        ceilings.push(reads::ceiling(&db.config, 10, 10_000, rows, run).await?);
        for (t, (ms, pool, _)) in targets.iter().enumerate() {
            for &n in &args.initiators {
                let mut these = settings_list.clone();
                if n == 1 {
                    these.push(Setting::Naive);
                }
                // Rotated each round, so no setting always runs first.
                let turn = round % these.len();
                these.rotate_left(turn);
                for setting in these {
                    eprintln!(
                        "round {}: +{ms} ms, {n} initiators, {}",
                        round + 1,
                        setting.label()
                    );
                    let sample = if setting == Setting::Naive {
                        let r = reads::naive_run(pool, n, run, rows).await;
                        Sample {
                            per_sec: r.per_sec(),
                            p50: r.quantile(0.5),
                            p99: r.quantile(0.99),
                            mean_batch: 1.0,
                            limit: 0,
                        }
                    } else {
                        let r =
                            reads::batched_run_warm(pool, settings(setting), n, warmup, run, rows)
                                .await?;
                        Sample {
                            per_sec: r.report.per_sec(),
                            p50: r.report.quantile(0.5),
                            p99: r.report.quantile(0.99),
                            mean_batch: r.mean_batch,
                            limit: r.limit,
                        }
                    };
                    samples.entry((t, n, setting)).or_default().push(sample);
                }
            }
        }
    }
    let ceiling = median(&ceilings);
    print_sweep(args, &samples, &ceilings);
    append_csv(&args.csv, args, &samples, ceiling)?;
    plot_sweep(&args.svg, args, &samples)?;
    eprintln!(
        "appended to {} and drew {}",
        args.csv.display(),
        args.svg.display()
    );
    Ok(())
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

fn print_sweep(args: &Args, samples: &Samples, ceilings: &[f64]) {
    let rate = |s: &Sample| s.per_sec;
    println!(
        "\n{} rows, pool of {}, server defaults but the concurrency; {} interleaved rounds of {:.1} s after {:.1} s of warm-up; medians (range)\n",
        args.table.rows, args.pool_size, args.rounds, args.seconds, args.warmup
    );
    println!("| added RTT | initiators | auto reads/s | auto p99 ms | auto limit (end) | best fixed | its reads/s | auto / best | within 5% |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let mut verdicts = Vec::new();
    for (t, &rtt) in args.rtt_ms.iter().enumerate() {
        for &n in &args.initiators {
            let Some(auto) = samples.get(&(t, n, Setting::Auto)) else {
                continue;
            };
            let best = args
                .fixed
                .iter()
                .filter_map(|&c| {
                    samples
                        .get(&(t, n, Setting::Fixed(c)))
                        .map(|v| (c, median_by(v, rate), v))
                })
                .max_by(|a, b| a.1.total_cmp(&b.1));
            let a = median_by(auto, rate);
            let (lo, hi) = range_by(auto, rate);
            let limits: Vec<String> = auto.iter().map(|s| s.limit.to_string()).collect();
            let (best_label, best_rate, ratio) = match best {
                Some((c, r, v)) => {
                    let (blo, bhi) = range_by(v, rate);
                    (c.to_string(), format!("{r:.0} ({blo:.0}-{bhi:.0})"), a / r)
                }
                None => ("-".to_owned(), "-".to_owned(), f64::NAN),
            };
            println!(
                "| {rtt} ms | {n} | {a:.0} ({lo:.0}-{hi:.0}) | {:.2} | {} | {best_label} | {best_rate} | {ratio:.3} | {} |",
                median_by(auto, |s| ms(s.p99)),
                limits.join(", "),
                verdict(ratio >= 0.95)
            );
            if ratio.is_finite() {
                verdicts.push(ratio >= 0.95);
            }
        }
    }
    println!(
        "\ntarget: auto within 5% of the best fixed concurrency at every point: {} ({} of {})",
        verdict(verdicts.iter().all(|&ok| ok)),
        verdicts.iter().filter(|&&ok| ok).count(),
        verdicts.len()
    );
    for (t, &rtt) in args.rtt_ms.iter().enumerate() {
        let (Some(naive), Some(auto)) = (
            samples.get(&(t, 1, Setting::Naive)),
            samples.get(&(t, 1, Setting::Auto)),
        ) else {
            continue;
        };
        let (n50, a50) = (
            median_by(naive, |s| ms(s.p50)),
            median_by(auto, |s| ms(s.p50)),
        );
        println!(
            "target: +{rtt} ms, 1 initiator, p50 at most 1.05x naive: {} ({a50:.3} ms vs {n50:.3} ms, {:.3}x)",
            verdict(a50 <= 1.05 * n50),
            a50 / n50
        );
    }
    let direct = args.rtt_ms.iter().position(|&ms| ms == 0.0);
    if let Some(auto) = direct.and_then(|t| samples.get(&(t, 300, Setting::Auto))) {
        let ceiling = median(ceilings);
        let a = median_by(auto, rate);
        let p99 = median_by(auto, |s| ms(s.p99));
        println!(
            "target: 300 initiators, defaults, at least 0.75 of the bulk ceiling: {} ({a:.0} of {ceiling:.0} keys/s, {:.2}; ceiling rounds {})",
            verdict(a >= 0.75 * ceiling),
            a / ceiling,
            ceilings.iter().map(|c| format!("{c:.0}")).collect::<Vec<_>>().join(", ")
        );
        println!(
            "target: 300 initiators, defaults, p99 at most 3 ms: {} ({p99:.2} ms)",
            verdict(p99 <= 3.0)
        );
    }
}

fn append_csv(path: &Path, args: &Args, samples: &Samples, ceiling: f64) -> anyhow::Result<()> {
    let (mut f, now) = benches::append_csv(
        path,
        "unix_time,rows,added_rtt_ms,initiators,concurrency,round,reads_per_sec,p50_ms,p99_ms,mean_batch,limit_at_end,ceiling_keys_per_sec",
    )?;
    for ((t, n, setting), runs) in samples {
        for (round, s) in runs.iter().enumerate() {
            writeln!(
                f,
                "{now},{},{},{n},{},{},{:.0},{:.3},{:.3},{:.1},{},{ceiling:.0}",
                args.table.rows,
                args.rtt_ms[*t],
                setting.label(),
                round + 1,
                s.per_sec,
                ms(s.p50),
                ms(s.p99),
                s.mean_batch,
                s.limit
            )?;
        }
    }
    Ok(())
}

/// Maps a plotters error, which borrows its backend, to `anyhow`.
fn plot_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

fn plot_sweep(path: &Path, args: &Args, samples: &Samples) -> anyhow::Result<()> {
    use plotters::prelude::*;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let (rows, cols) = (args.rtt_ms.len(), args.initiators.len());
    let root = SVGBackend::new(path, (280 * cols as u32, 240 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let panels = root.split_evenly((rows, cols));
    let max_c = args.fixed.iter().copied().max().unwrap_or(16) as f64;
    for (t, &rtt) in args.rtt_ms.iter().enumerate() {
        for (i, &n) in args.initiators.iter().enumerate() {
            let area = &panels[t * cols + i];
            let fixed: Vec<(f64, f64)> = args
                .fixed
                .iter()
                .filter_map(|&c| {
                    samples
                        .get(&(t, n, Setting::Fixed(c)))
                        .map(|v| (c as f64, median_by(v, |s| s.per_sec)))
                })
                .collect();
            let auto = samples
                .get(&(t, n, Setting::Auto))
                .map(|v| median_by(v, |s| s.per_sec));
            let y_max = fixed.iter().map(|p| p.1).chain(auto).fold(1.0, f64::max) * 1.15;
            let mut chart = ChartBuilder::on(area)
                .caption(format!("+{rtt} ms, {n} initiators"), ("sans-serif", 14))
                .margin(8)
                .x_label_area_size(28)
                .y_label_area_size(48)
                .build_cartesian_2d(0.5f64..max_c + 0.5, 0f64..y_max)
                .map_err(plot_err)?;
            chart
                .configure_mesh()
                .x_desc("fixed concurrency")
                .y_desc("reads/s")
                .x_label_formatter(&|v| format!("{v:.0}"))
                .y_label_formatter(&reads_label)
                .draw()
                .map_err(plot_err)?;
            chart
                .draw_series(LineSeries::new(fixed.clone(), BLUE.stroke_width(2)))
                .map_err(plot_err)?
                .label("fixed")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLUE));
            chart
                .draw_series(fixed.iter().map(|&p| Circle::new(p, 3, BLUE.filled())))
                .map_err(plot_err)?;
            if let Some(a) = auto {
                chart
                    .draw_series(LineSeries::new(
                        vec![(0.5, a), (max_c + 0.5, a)],
                        RED.stroke_width(2),
                    ))
                    .map_err(plot_err)?
                    .label("auto")
                    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], RED));
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE)
                .border_style(BLACK)
                .draw()
                .map_err(plot_err)?;
        }
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

/// A batcher the baseline part runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Contender {
    /// pgbatch as the server sets it up by default.
    Defaults,
    /// pgbatch at the server's defaults but a fixed limit of as many loads
    /// as the minimal batcher's best setting has connections: what the
    /// engine costs, apart from the limit it chooses.
    Fixed(usize),
    /// The hand-written eager batcher (`benches::minimal`).
    Minimal {
        connections: usize,
        max_batch: usize,
    },
}

impl Contender {
    fn label(self) -> String {
        match self {
            Contender::Defaults => "pgbatch defaults".to_owned(),
            Contender::Fixed(n) => format!("pgbatch, fixed {n} loads"),
            Contender::Minimal {
                connections,
                max_batch,
            } => format!("minimal, {connections} connections, batches of {max_batch}"),
        }
    }
}

/// One baseline run of `contender` against the database direct, after the
/// warm-up.
async fn contend(
    args: &Args,
    db: &Database,
    pool: &Pool,
    contender: Contender,
) -> anyhow::Result<Sample> {
    let (n_initiators, rows) = (args.baseline_initiators, args.table.rows);
    let run = Duration::from_secs_f64(args.seconds);
    let warmup = Duration::from_secs_f64(args.warmup);
    eprintln!("baseline: {n_initiators} initiators, {}", contender.label());
    Ok(match contender {
        Contender::Defaults => {
            let r = reads::batched_run_warm(
                pool,
                settings(Setting::Auto),
                n_initiators,
                warmup,
                run,
                rows,
            )
            .await?;
            Sample::of(&r.report, r.mean_batch, r.limit)
        }
        Contender::Fixed(n) => {
            let r = reads::batched_run_warm(
                pool,
                settings(Setting::Fixed(n)),
                n_initiators,
                warmup,
                run,
                rows,
            )
            .await?;
            Sample::of(&r.report, r.mean_batch, r.limit)
        }
        Contender::Minimal {
            connections,
            max_batch,
        } => {
            let r = reads::minimal_run(
                &db.config,
                connections,
                max_batch,
                n_initiators,
                warmup,
                run,
                rows,
            )
            .await?;
            Sample::of(&r.report, r.mean_batch, 0)
        }
    })
}

/// Per round, `f` of the defaults over `f` of the minimal batcher.
fn per_round_ratio(
    defaults: &[Sample],
    minimal: &[Sample],
    f: impl Fn(&Sample) -> f64,
) -> Vec<f64> {
    defaults
        .iter()
        .zip(minimal)
        .map(|(d, m)| f(d) / f(m))
        .collect()
}

async fn baseline(args: &Args, db: &Database) -> anyhow::Result<()> {
    // As the sweep's pool without added round trip.
    let pool = pgbatch::pg::pool(
        db.config.clone(),
        &PoolOptions::with_max_size(args.pool_size),
    )?;

    // Once each: the sweep only has to find the best, which the rounds
    // below then measure as carefully as the defaults.
    let mut swept = Vec::new();
    for &connections in &args.baseline_connections {
        for &max_batch in &args.baseline_caps {
            let m = Contender::Minimal {
                connections,
                max_batch,
            };
            swept.push(((connections, max_batch), contend(args, db, &pool, m).await?));
        }
    }
    let ((connections, max_batch), best_swept) = swept
        .iter()
        .copied()
        .max_by(|a, b| a.1.per_sec.total_cmp(&b.1.per_sec))
        .context("--baseline-connections and --baseline-caps give no setting")?;
    let best = Contender::Minimal {
        connections,
        max_batch,
    };
    println!(
        "\nMinimal eager batcher, {} rows, {} initiators, the database direct; each setting once, {:.1} s after {:.1} s of warm-up\n",
        args.table.rows, args.baseline_initiators, args.seconds, args.warmup
    );
    print_markdown(
        &[
            ("connections", Align::Right),
            ("batch cap", Align::Right),
            ("reads/s", Align::Right),
            ("p99 ms", Align::Right),
            ("mean batch", Align::Right),
        ],
        swept.iter().map(|((c, cap), s)| {
            vec![
                c.to_string(),
                cap.to_string(),
                format!("{:.0}", s.per_sec),
                format!("{:.2}", ms(s.p99)),
                format!("{:.1}", s.mean_batch),
            ]
        }),
    );
    println!(
        "\nbest: {} ({:.0} reads/s)",
        best.label(),
        best_swept.per_sec
    );

    let contenders = [Contender::Defaults, Contender::Fixed(connections), best];
    let mut runs: [Vec<Sample>; 3] = Default::default();
    for round in 0..args.rounds {
        eprintln!("baseline round {} of {}", round + 1, args.rounds);
        // Rotated each round, so none always runs first.
        let mut order = [0, 1, 2];
        order.rotate_left(round % 3);
        for i in order {
            runs[i].push(contend(args, db, &pool, contenders[i]).await?);
        }
    }
    println!(
        "\n{} rows, {} initiators, the database direct; pgbatch at the server's defaults on a pool of {} (and with a fixed limit of the minimal batcher's connections), the minimal batcher at its best setting above; {} interleaved rounds of {:.1} s after {:.1} s of warm-up; medians (range)\n",
        args.table.rows, args.baseline_initiators, args.pool_size, args.rounds, args.seconds, args.warmup
    );
    print_markdown(
        &[
            ("batcher", Align::Left),
            ("reads/s", Align::Right),
            ("p50 ms", Align::Right),
            ("p99 ms", Align::Right),
            ("mean batch", Align::Right),
        ],
        contenders.iter().zip(&runs).map(|(c, v)| {
            vec![
                c.label(),
                spread(&v.iter().map(|s| s.per_sec).collect::<Vec<_>>(), 0),
                format!("{:.2}", median_by(v, |s| ms(s.p50))),
                format!("{:.2}", median_by(v, |s| ms(s.p99))),
                format!("{:.1}", median_by(v, |s| s.mean_batch)),
            ]
        }),
    );
    let [defaults, fixed, minimal] = &runs;
    let reads = per_round_ratio(defaults, minimal, |s| s.per_sec);
    let p99 = per_round_ratio(defaults, minimal, |s| ms(s.p99));
    println!();
    print_markdown(
        &[
            ("defaults / minimal best, per round", Align::Left),
            ("median (range)", Align::Right),
            ("target (issue 43)", Align::Left),
            ("verdict", Align::Left),
        ],
        [
            vec![
                "reads/s".to_owned(),
                spread(&reads, 3),
                "at least 1.0".to_owned(),
                verdict(median(&reads) >= 1.0).to_owned(),
            ],
            vec![
                "p99".to_owned(),
                spread(&p99, 3),
                "below 1.0".to_owned(),
                verdict(median(&p99) < 1.0).to_owned(),
            ],
        ],
    );
    // No target: where the defaults fall short, this says whether the
    // limit's choice or the engine's cost per load is why.
    let engine = per_round_ratio(fixed, minimal, |s| s.per_sec);
    let engine_p99 = per_round_ratio(fixed, minimal, |s| ms(s.p99));
    println!(
        "\npgbatch fixed at {connections} loads / minimal best, per round: reads/s {}, p99 {}",
        spread(&engine, 3),
        spread(&engine_p99, 3)
    );
    Ok(())
}

/// What changes at the start of each phase of the timeline.
#[derive(Debug, Clone, Copy)]
struct Phase {
    name: &'static str,
    rtt: Duration,
    competing: bool,
}

const PHASES: [Phase; 5] = [
    Phase {
        name: "+0 ms",
        rtt: Duration::ZERO,
        competing: false,
    },
    Phase {
        name: "+5 ms",
        rtt: Duration::from_millis(5),
        competing: false,
    },
    Phase {
        name: "+0 ms again",
        rtt: Duration::ZERO,
        competing: false,
    },
    Phase {
        name: "+0 ms, competing bulk load",
        rtt: Duration::ZERO,
        competing: true,
    },
    Phase {
        name: "+0 ms, competing load stopped",
        rtt: Duration::ZERO,
        competing: false,
    },
];

/// Another client's load on the same database: back-to-back 1,000-key
/// `= ANY` statements on `connections` connections of its own, while
/// `on` is set.
async fn competing_load(
    config: tokio_postgres::Config,
    connections: usize,
    rows: u64,
    on: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    for c in 0..connections {
        let (client, conn) = config.connect(NoTls).await?;
        tokio::spawn(conn);
        let stmt = client.prepare(KvQuery.batch_sql()).await?;
        let (on, stop) = (Arc::clone(&on), Arc::clone(&stop));
        tasks.push(tokio::spawn(async move {
            let mut stream = KeyStream::new(77 + c as u64);
            while !stop.load(Relaxed) {
                if !on.load(Relaxed) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                let keys: Vec<String> = (0..1_000)
                    .map(|_| reads::key(stream.next_below(rows)))
                    .collect();
                client.query(&stmt, &[&keys]).await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

async fn timeline(args: &Args, db: &Database) -> anyhow::Result<()> {
    let (upstream, direct_tcp) = reads::tcp_target(db).await?;
    let rows = args.table.rows;
    let proxy = Arc::new(DelayProxy::start_adjustable(upstream, Duration::ZERO)?);
    let pool: Pool = pgbatch::pg::pool(
        reads::via(&direct_tcp, proxy.addr()),
        &PoolOptions::with_max_size(args.pool_size),
    )?;
    let lookup = Arc::new(Lookup::new(
        "kv",
        KvQuery,
        pool,
        &reads::read_settings(ReadPath::Batched, BatchSettings::default()),
    )?);
    let phase = Duration::from_secs_f64(args.phase_seconds);
    let interval = Duration::from_millis(100);
    let total = phase * PHASES.len() as u32;
    let n = 300;

    // The world changes on a schedule of its own.
    let (on, stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let competitor = tokio::spawn(competing_load(
        db.config.clone(),
        2,
        rows,
        Arc::clone(&on),
        Arc::clone(&stop),
    ));
    let limits: Arc<Vec<AtomicU64>> = Arc::new(
        (0..=(total.as_millis() / interval.as_millis()) as usize)
            .map(|_| AtomicU64::new(0))
            .collect(),
    );
    let start = Instant::now();
    let schedule = {
        let (lookup, limits, on) = (Arc::clone(&lookup), Arc::clone(&limits), Arc::clone(&on));
        let proxy = Arc::clone(&proxy);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            let mut phase_seen = usize::MAX;
            loop {
                tick.tick().await;
                let at = start.elapsed();
                let p = (at.as_nanos() / phase.as_nanos()) as usize;
                if p >= PHASES.len() {
                    break;
                }
                if p != phase_seen {
                    phase_seen = p;
                    proxy.set_rtt(PHASES[p].rtt);
                    on.store(PHASES[p].competing, Relaxed);
                }
                let i = (at.as_nanos() / interval.as_nanos()) as usize;
                if let (Some(slot), Some(s)) = (limits.get(i), lookup.batcher_stats()) {
                    slot.store(s.concurrency_limit, Relaxed);
                }
            }
        })
    };
    eprintln!(
        "timeline: {n} initiators, {} phases of {:.1} s",
        PHASES.len(),
        phase.as_secs_f64()
    );
    let reader = Arc::clone(&lookup);
    let series = closed_loop_timeline(n, total, interval, rows, move |k| {
        let lookup = Arc::clone(&reader);
        async move {
            if let Err(e) = lookup.get(reads::key(k)).await {
                panic!("{lookup:?} read failed: {e:#}");
            }
        }
    })
    .await;
    schedule.await?;
    stop.store(true, Relaxed);
    competitor.await??;
    lookup.shutdown().await;
    drop(proxy);

    let limits: Vec<u64> = limits.iter().map(|l| l.load(Relaxed)).collect();
    report_timeline(args, &series, &limits, phase)?;
    Ok(())
}

fn report_timeline(
    args: &Args,
    series: &Timeline,
    limits: &[u64],
    phase: Duration,
) -> anyhow::Result<()> {
    let per_phase = (phase.as_nanos() / series.interval.as_nanos()) as usize;
    let rates: Vec<f64> = series
        .intervals
        .iter()
        .map(|r| r.requests as f64 / series.interval.as_secs_f64())
        .collect();
    println!(
        "\nTimeline: 300 initiators, server defaults, through the adjustable proxy; every {} ms\n",
        series.interval.as_millis()
    );
    println!("| phase | from s | settled reads/s | settled p99 ms | limits (median, range) | back to 90% after |");
    println!("|---|---:|---:|---:|---|---:|");
    for (p, ph) in PHASES.iter().enumerate() {
        let from = p * per_phase;
        let to = ((p + 1) * per_phase).min(rates.len());
        if from >= to {
            break;
        }
        // What the phase settles at: its second half.
        let settled_from = from + (to - from) / 2;
        let settled = median(&rates[settled_from..to]);
        let p99 = median(
            &series.intervals[settled_from..to]
                .iter()
                .map(|r| ms(r.quantile(0.99)))
                .collect::<Vec<_>>(),
        );
        let lims: Vec<f64> = limits[from..to].iter().map(|&l| l as f64).collect();
        let (llo, lhi) = lims
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
                (a.min(x), b.max(x))
            });
        // The first interval from which five in a row average 90% of it.
        let back = (from..to.saturating_sub(4))
            .find(|&i| rates[i..i + 5].iter().sum::<f64>() / 5.0 >= 0.9 * settled)
            .map(|i| (i - from) as f64 * series.interval.as_secs_f64());
        println!(
            "| {} | {:.1} | {settled:.0} | {p99:.2} | {:.0} ({llo:.0}-{lhi:.0}) | {} |",
            ph.name,
            (from as f64) * series.interval.as_secs_f64(),
            median(&lims),
            back.map_or("never".to_owned(), |s| format!("{s:.1} s")),
        );
    }
    plot_timeline(&args.timeline_svg, series, &rates, limits, per_phase)?;
    eprintln!("drew {}", args.timeline_svg.display());
    Ok(())
}

fn plot_timeline(
    path: &Path,
    series: &Timeline,
    rates: &[f64],
    limits: &[u64],
    per_phase: usize,
) -> anyhow::Result<()> {
    use plotters::prelude::*;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let secs = |i: usize| i as f64 * series.interval.as_secs_f64();
    let end = secs(rates.len());
    let root = SVGBackend::new(path, (1000, 760)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let panels = root.split_evenly((3, 1));
    let p99: Vec<f64> = series
        .intervals
        .iter()
        .map(|r| ms(r.quantile(0.99)))
        .collect();
    let lims: Vec<f64> = limits.iter().take(rates.len()).map(|&l| l as f64).collect();
    let captions = [
        "reads/s (100 ms intervals)",
        "p99 latency, ms",
        "concurrency limit chosen",
    ];
    for (k, (area, values)) in panels.iter().zip([rates, &p99[..], &lims[..]]).enumerate() {
        let y_max = values.iter().copied().fold(1.0, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(captions[k], ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..end, 0f64..y_max)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .draw()
            .map_err(plot_err)?;
        for (p, ph) in PHASES.iter().enumerate().skip(1) {
            let x = secs(p * per_phase);
            chart
                .draw_series(LineSeries::new(vec![(x, 0.0), (x, y_max)], BLACK.mix(0.3)))
                .map_err(plot_err)?;
            if k == 0 {
                chart
                    .draw_series(std::iter::once(Text::new(
                        ph.name,
                        (x + 0.1, y_max * 0.95),
                        ("sans-serif", 12),
                    )))
                    .map_err(plot_err)?;
            }
        }
        chart
            .draw_series(LineSeries::new(
                values.iter().enumerate().map(|(i, &v)| (secs(i), v)),
                [BLUE, RED, GREEN][k].stroke_width(2),
            ))
            .map_err(plot_err)?;
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

/// A reads/s axis label: thousands (`12k`) from 10,000 up, the plain number
/// below, where an axis spans less (one initiator at 5 ms).
fn reads_label(v: &f64) -> String {
    if v.abs() >= 10_000.0 || *v == 0.0 {
        format!("{:.0}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_keep_the_defaults_but_the_concurrency() {
        assert_eq!(settings(Setting::Auto), BatchSettings::default());
        assert_eq!(
            settings(Setting::Fixed(3)).concurrency,
            Concurrency::Fixed(3)
        );
    }
}
