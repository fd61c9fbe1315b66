//! Latency at a given load, and what each read costs the database. Each
//! contender's capacity is measured in a closed loop; then reads arrive at
//! fixed rates (an open loop), by default the same for every contender,
//! from 10% to 110% of the fastest one's capacity (finer from 50%), and each read's latency
//! counts from when it was meant to start, so a stall counts for every
//! read it held up (coordinated omission corrected). For each contender it
//! reports its *capacity within a target*: the highest rate it serves,
//! with every lower rate, answering every read with a p99 of at most 5 ms,
//! or 10 ms. A contender with no database (every read answered at once)
//! shows what the generator itself adds.
//!
//! The contenders read `random_read_test` through one `PgLoader` (the
//! batched `= ANY($1)` statement, the single-key one for a batch of one)
//! on one pool of `--pool-size` connections:
//!
//! - pgbatch at its defaults (`Batcher::new`), and with the adaptive flush
//!   policy (`FlushPolicy::Adaptive`), which trades a delay under load
//!   for fuller loads;
//! - the minimal batcher (`benches::minimal`, connections and a worker of
//!   its own each, batches of 64) at its best setting: the one of
//!   `--minimal-connections` that served most in the capacity runs;
//! - async-graphql's `DataLoader` at its defaults, and at its best setting
//!   of a sweep over its delay and batch size, by capacity too;
//! - one statement per read, the single-key statement on a pooled
//!   connection;
//! - no database: the generator's own latency and CPU, offered the same
//!   rates.
//!
//! In interleaved rounds, each load and contender is run after a warm-up:
//! reads/s answered, p50, p99 and p99.9, and the CPU per read of
//! Postgres's processes (read from `/proc`) and of this process. Prints a
//! Markdown table with the medians and the p99's range, appends to a CSV,
//! and draws p99 and Postgres CPU per read against load as SVG.
//!
//! ```text
//! cargo run --release -p benches --bin openloop
//! cargo run --release -p benches --bin openloop -- --smoke   # seconds, for CI
//! ```

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use benches::contender::{Contender, Reader};
use benches::cpu::{CpuSnapshot, CpuUse};
use benches::dataloader::DlSetting;
use benches::open_loop::{open_loop, OpenLoopReport};
use benches::reads::{key, TableArgs};
use benches::rounds::{median, median_by, WarmRoundArgs};
use benches::{closed_loop_warm, print_markdown, Align};
use clap::Parser;
use pgbatch::pg::{self, PgLoader, PoolOptions};
use server::db::queries::kv::KvQuery;
use server::db::Database;

/// The allocator the server binary uses, as in the other load generators.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Latency at fixed arrival rates, and Postgres CPU per read.
#[derive(Debug, Parser)]
#[command(about)]
struct Args {
    #[command(flatten)]
    table: TableArgs,
    /// Callers of the closed-loop capacity runs, each reading one key at
    /// a time.
    #[arg(long, default_value_t = 300)]
    initiators: usize,
    #[command(flatten)]
    runs: WarmRoundArgs,
    /// Loads to offer, in percent of capacity (up to 200).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "10,25,50,60,70,80,90,100,110"
    )]
    loads: Vec<u32>,
    /// Whose capacity the loads are shares of: the fastest contender's
    /// (every contender at the same rates; one past its capacity falls
    /// behind and is marked), pgbatch's defaults' (the same, and two
    /// builds compare at one load with `--capacity`), or each contender's
    /// own (the latency a user gets at that share of what it serves).
    #[arg(long, value_enum, default_value = "fastest")]
    rates_of: RatesOf,
    /// pgbatch's defaults' capacity in reads/s, given instead of measured:
    /// with `--rates-of defaults`, every contender and every build is
    /// offered the same rates, so two builds compare at one load.
    #[arg(long)]
    capacity: Option<f64>,
    /// Connections in the pool the contenders share.
    #[arg(long, default_value_t = 16)]
    pool_size: usize,
    /// The minimal batcher's connections tried by the capacity runs.
    #[arg(long, value_delimiter = ',', default_value = "2,3,4,6")]
    minimal_connections: Vec<usize>,
    /// Also pgbatch's defaults at these fixed numbers of loads at once
    /// (none by default): where the automatic limit's search costs latency.
    #[arg(long, value_delimiter = ',')]
    fixed_loads: Vec<usize>,
    /// The DataLoader's delays, in µs, tried by the capacity runs...
    #[arg(long, value_delimiter = ',', default_value = "0,100,500")]
    dataloader_delays_us: Vec<u64>,
    /// ...with each of these batch caps.
    #[arg(long, value_delimiter = ',', default_value = "64,256")]
    dataloader_batches: Vec<usize>,
    /// Contenders to run (all by default): one alone is what a profile
    /// of it needs.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Who::ALL)]
    only: Vec<Who>,
    /// CSV file results are appended to.
    #[arg(long, default_value = "target/loadgen/openloop.csv")]
    csv: PathBuf,
    /// SVG plot of p99 and Postgres CPU per read against load.
    #[arg(long, default_value = "target/loadgen/openloop.svg")]
    svg: PathBuf,
}

/// A contender `--only` can select: for `minimal` and `dataloader-best`,
/// its best setting by capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Who {
    Defaults,
    Adaptive,
    Minimal,
    DataloaderDefaults,
    DataloaderBest,
    OnePerRead,
    NoDatabase,
}

impl Who {
    const ALL: [Self; 7] = [
        Self::Defaults,
        Self::Adaptive,
        Self::Minimal,
        Self::DataloaderDefaults,
        Self::DataloaderBest,
        Self::OnePerRead,
        Self::NoDatabase,
    ];
}

/// See [`Args::rates_of`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RatesOf {
    Fastest,
    Own,
    Defaults,
}

/// The p99 targets capacity is reported within, in milliseconds.
const TARGETS_MS: [f64; 2] = [5.0, 10.0];

/// One open-loop run's figures.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// The rate offered.
    offered: f64,
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    postgres_us: f64,
    client_us: f64,
    mean_batch: f64,
    /// Reads failed or timed out, or the run stopped past capacity.
    fell_behind: bool,
}

impl Sample {
    fn new(rate: f64, report: &OpenLoopReport, cpu: &CpuUse, mean_batch: f64) -> Self {
        Self {
            offered: rate,
            per_sec: report.per_sec(),
            p50_ms: report.quantile_ms(0.5),
            p99_ms: report.quantile_ms(0.99),
            p999_ms: report.quantile_ms(0.999),
            // None answered (the run stopped in its warm-up): no figure.
            postgres_us: cpu
                .postgres
                .filter(|_| report.completed > 0)
                .map_or(f64::NAN, |pg| CpuUse::per_request_us(pg, report.completed)),
            client_us: match report.completed {
                0 => f64::NAN,
                n => CpuUse::per_request_us(cpu.server, n),
            },
            mean_batch,
            fell_behind: report.fell_behind || report.failed > 0,
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    benches::log_from_env();
    let mut args = Args::parse();
    args.table.apply_smoke("openloop");
    if args.table.smoke {
        args.runs.smoke();
        args.initiators = 64;
        args.loads = vec![25, 110];
        args.minimal_connections = vec![2];
        args.dataloader_delays_us = vec![0];
        args.dataloader_batches = vec![64];
    }
    anyhow::ensure!(
        args.loads.iter().all(|&l| (1..=200).contains(&l)),
        "--loads are percentages of capacity, from 1 to 200"
    );
    args.loads.sort_unstable();
    args.loads.dedup();
    args.table
        .with_table(|o| o, async |db| measure(&args, db).await)
        .await
}

/// `who`'s reads/s in a closed loop of `--initiators` callers.
async fn capacity(
    args: &Args,
    db: &Database,
    loader: &PgLoader<KvQuery>,
    who: Contender,
) -> anyhow::Result<f64> {
    let reader = Arc::new(Reader::start(who, db, loader).await?);
    let r = Arc::clone(&reader);
    let report = closed_loop_warm(
        args.initiators,
        Duration::from_secs_f64(args.runs.warmup),
        Duration::from_secs_f64(args.runs.seconds),
        args.table.rows,
        move |k| {
            let r = Arc::clone(&r);
            async move {
                if let Err(e) = r.get(key(k)).await {
                    panic!("{}: a read failed: {e}", who.describe());
                }
            }
        },
    )
    .await;
    Arc::into_inner(reader)
        .context("the reader is still shared after its run")?
        .stop()
        .await;
    Ok(report.per_sec())
}

/// `who` at `rate` reads/s, in an open loop.
async fn open(
    args: &Args,
    db: &Database,
    loader: &PgLoader<KvQuery>,
    who: Contender,
    rate: f64,
) -> anyhow::Result<Sample> {
    let reader = Arc::new(Reader::start(who, db, loader).await?);
    let r = Arc::clone(&reader);
    let warmup = Duration::from_secs_f64(args.runs.warmup);
    // The CPU of the measured window: taken as the warm-up ends.
    let cpu_at_start = async {
        tokio::time::sleep(warmup).await;
        CpuSnapshot::take(db.cluster.as_ref())
    };
    let (report, before) = tokio::join!(
        open_loop(
            rate,
            warmup,
            Duration::from_secs_f64(args.runs.seconds),
            args.table.rows,
            move |k| {
                let r = Arc::clone(&r);
                async move { r.get(key(k)).await.is_ok() }
            },
        ),
        cpu_at_start
    );
    let cpu = CpuSnapshot::take(db.cluster.as_ref()).since(&before);
    let sample = Sample::new(rate, &report, &cpu, reader.mean_batch());
    Arc::into_inner(reader)
        .context("the reader is still shared after its run")?
        .stop()
        .await;
    Ok(sample)
}

/// The best of `settings` by capacity, and that capacity.
async fn best_of(
    args: &Args,
    db: &Database,
    loader: &PgLoader<KvQuery>,
    settings: impl IntoIterator<Item = Contender>,
) -> anyhow::Result<(Contender, f64)> {
    let mut best: Option<(Contender, f64)> = None;
    for who in settings {
        let per_sec = capacity(args, db, loader, who).await?;
        println!("capacity of {}: {per_sec:.0} reads/s", who.describe());
        if best.is_none_or(|(_, b)| per_sec > b) {
            best = Some((who, per_sec));
        }
    }
    best.context("no setting to try")
}

async fn measure(args: &Args, db: &Database) -> anyhow::Result<()> {
    let pool = pg::pool(
        db.config.clone(),
        &PoolOptions::with_max_size(args.pool_size),
    )?;
    let loader = PgLoader::new(pool, KvQuery);
    println!(
        "{} rows, pool of {}; capacity with {} callers; {} interleaved rounds of {} s after {} s \
         of warm-up\n",
        args.table.rows,
        args.pool_size,
        args.initiators,
        args.runs.rounds,
        args.runs.seconds,
        args.runs.warmup
    );
    // Capacities, and the best settings of the minimal batcher and the
    // DataLoader, by the same closed loop.
    let wanted = |who| args.only.contains(&who);
    let mut contenders = Vec::new();
    let mut defaults_capacity = args.capacity;
    if wanted(Who::Defaults) || (args.rates_of == RatesOf::Defaults && args.capacity.is_none()) {
        let defaults = match args.capacity {
            Some(given) => (Contender::Defaults, given),
            None => best_of(args, db, &loader, [Contender::Defaults]).await?,
        };
        defaults_capacity = Some(defaults.1);
        if wanted(Who::Defaults) {
            contenders.push(defaults);
        }
    }
    if wanted(Who::Adaptive) {
        contenders.push(best_of(args, db, &loader, [Contender::Adaptive]).await?);
    }
    for &n in &args.fixed_loads {
        contenders.push(best_of(args, db, &loader, [Contender::Fixed(n)]).await?);
    }
    if wanted(Who::Minimal) {
        let settings = args
            .minimal_connections
            .iter()
            .map(|&connections| Contender::Minimal { connections });
        contenders.push(best_of(args, db, &loader, settings).await?);
    }
    if wanted(Who::DataloaderDefaults) {
        let setting = [Contender::DataLoader(DlSetting::DEFAULT)];
        contenders.push(best_of(args, db, &loader, setting).await?);
    }
    if wanted(Who::DataloaderBest) {
        let settings = args.dataloader_delays_us.iter().flat_map(|&us| {
            args.dataloader_batches.iter().map(move |&max_batch| {
                Contender::DataLoader(DlSetting {
                    delay: Duration::from_micros(us),
                    max_batch,
                })
            })
        });
        contenders.push(best_of(args, db, &loader, settings).await?);
    }
    if wanted(Who::OnePerRead) {
        contenders.push(best_of(args, db, &loader, [Contender::OnePerRead]).await?);
    }
    // The fastest database contender's capacity; the generator alone is
    // offered it too, whatever the rates are shares of.
    let fastest = contenders.iter().map(|c| c.1).fold(f64::NAN, f64::max);
    if wanted(Who::NoDatabase) {
        let cap = if fastest.is_nan() {
            capacity(args, db, &loader, Contender::NoDatabase).await?
        } else {
            fastest
        };
        contenders.push((Contender::NoDatabase, cap));
    }
    let fastest = if fastest.is_nan() {
        contenders.iter().map(|c| c.1).fold(f64::NAN, f64::max)
    } else {
        fastest
    };
    println!();

    let n = contenders.len();
    // samples[load][contender]: one per round.
    let mut samples = vec![vec![Vec::<Sample>::new(); n]; args.loads.len()];
    for round in 0..args.runs.rounds {
        for (l, &load) in args.loads.iter().enumerate() {
            // Each round in another order, so no contender always runs
            // first.
            for i in 0..n {
                let c = (i + round) % n;
                let (who, own) = contenders[c];
                let of = match args.rates_of {
                    RatesOf::Own if who != Contender::NoDatabase => own,
                    RatesOf::Own | RatesOf::Fastest => fastest,
                    RatesOf::Defaults => {
                        defaults_capacity.context("the defaults' capacity is measured above")?
                    }
                };
                let rate = of * f64::from(load) / 100.0;
                samples[l][c].push(open(args, db, &loader, who, rate).await?);
            }
        }
    }

    let cell = |v: &[Sample], f: fn(&Sample) -> f64, digits: usize| {
        let xs: Vec<f64> = v.iter().map(f).collect();
        format!("{:.*}", digits, median(&xs))
    };
    print_markdown(
        &[
            ("load", Align::Right),
            ("contender", Align::Left),
            ("capacity reads/s", Align::Right),
            ("offered/s", Align::Right),
            ("answered/s", Align::Right),
            ("p50 ms", Align::Right),
            ("p99 ms (range)", Align::Right),
            ("p99.9 ms", Align::Right),
            ("Postgres CPU µs/read", Align::Right),
            ("client CPU µs/read", Align::Right),
            ("keys/load", Align::Right),
        ],
        args.loads.iter().enumerate().flat_map(|(l, load)| {
            let samples = &samples;
            contenders.iter().enumerate().map(move |(c, (who, cap))| {
                let v = &samples[l][c];
                let p99: Vec<f64> = v.iter().map(|s| s.p99_ms).collect();
                let (lo, hi) = (
                    p99.iter().copied().fold(f64::INFINITY, f64::min),
                    p99.iter().copied().fold(0.0, f64::max),
                );
                let behind = if v.iter().any(|s| s.fell_behind) {
                    " (fell behind)"
                } else {
                    ""
                };
                vec![
                    format!("{load}%"),
                    format!("{}{behind}", who.describe()),
                    format!("{cap:.0}"),
                    cell(v, |s| s.offered, 0),
                    cell(v, |s| s.per_sec, 0),
                    cell(v, |s| s.p50_ms, 2),
                    format!("{} ({lo:.2}-{hi:.2})", cell(v, |s| s.p99_ms, 2)),
                    cell(v, |s| s.p999_ms, 2),
                    cell(v, |s| s.postgres_us, 1),
                    cell(v, |s| s.client_us, 1),
                    cell(v, |s| s.mean_batch, 1),
                ]
            })
        }),
    );
    println!();
    let within = within_targets(&contenders, &samples);
    verdict(args, &contenders, &samples, &within, fastest);
    append_csv(args, &contenders, &samples)?;
    plot(&args.svg, args, &contenders, &samples)?;
    eprintln!(
        "appended to {} and drew {}",
        args.csv.display(),
        args.svg.display()
    );
    Ok(())
}

/// Each contender's capacity within each of [`TARGETS_MS`]: the highest
/// offered rate at which, and at every lower one, it answered every read
/// (at least 99% of the rate, never fell behind) with a median p99 within
/// the target; 0 where none. Printed as a table.
fn within_targets(contenders: &[(Contender, f64)], samples: &[Vec<Vec<Sample>>]) -> Vec<[f64; 2]> {
    let within: Vec<[f64; 2]> = (0..contenders.len())
        .map(|c| {
            let by_rate: Vec<&[Sample]> = samples.iter().map(|l| &l[c][..]).collect();
            TARGETS_MS.map(|target| capacity_within(&by_rate, target))
        })
        .collect();
    print_markdown(
        &[
            ("contender", Align::Left),
            ("closed-loop capacity reads/s", Align::Right),
            ("capacity within p99 ≤ 5 ms", Align::Right),
            ("capacity within p99 ≤ 10 ms", Align::Right),
            ("≤ 10 ms ÷ closed loop", Align::Right),
        ],
        contenders.iter().zip(&within).map(|((who, cap), w)| {
            // The generator alone is offered the others' rates; it has no
            // capacity of its own to compare with.
            let alone = *who == Contender::NoDatabase;
            let or_dash = |cell: String| if alone { "–".to_owned() } else { cell };
            vec![
                who.describe(),
                or_dash(format!("{cap:.0}")),
                format!("{:.0}", w[0]),
                format!("{:.0}", w[1]),
                or_dash(format!("{:.2}", w[1] / cap)),
            ]
        }),
    );
    println!();
    within
}

/// The highest offered rate of `by_rate` (one contender's rounds at each
/// rate, rates rising) at which, and at every lower rate, the contender
/// answered at least 99% of the rate, never fell behind, and had a median
/// p99 of at most `target_ms`; 0 where the lowest rate misses.
fn capacity_within(by_rate: &[&[Sample]], target_ms: f64) -> f64 {
    let mut best = 0.0;
    for v in by_rate {
        let offered = median_by(v, |s| s.offered);
        let served = !v.iter().any(|s| s.fell_behind)
            && median_by(v, |s| s.per_sec) >= 0.99 * offered
            && median_by(v, |s| s.p99_ms) <= target_ms;
        if !served {
            break;
        }
        best = offered;
    }
    best
}

/// The targets of the defaults against the others, met or missed: capacity
/// within p99 ≤ 10 ms at least 1.2x the best of the minimal batcher and the
/// DataLoader and 0.9x their own closed-loop capacity; every read answered
/// at every rate up to the fastest contender's capacity; at 25% load,
/// Postgres CPU per read at most 1.1x the lowest and p99 at most every
/// contender's.
fn verdict(
    args: &Args,
    contenders: &[(Contender, f64)],
    samples: &[Vec<Vec<Sample>>],
    within: &[[f64; 2]],
    fastest: f64,
) {
    if contenders
        .first()
        .is_none_or(|c| c.0 != Contender::Defaults)
    {
        return; // nothing to judge
    }
    let say = |what: &str, met: bool, detail: String| {
        let verdict = if met { "met" } else { "MISSED" };
        println!("target: {what}: {verdict} ({detail})");
    };
    let ours = within[0][1];
    let peers: Vec<(usize, f64)> = contenders
        .iter()
        .enumerate()
        .filter(|(_, (who, _))| matches!(who, Contender::Minimal { .. } | Contender::DataLoader(_)))
        .map(|(c, _)| (c, within[c][1]))
        .collect();
    if let Some(&(c, best)) = peers.iter().max_by(|a, b| a.1.total_cmp(&b.1)) {
        say(
            "capacity within p99 ≤ 10 ms at least 1.2x the best of the minimal batcher and the DataLoader",
            ours >= 1.2 * best,
            format!(
                "{ours:.0} against {best:.0} for {}: {:.2}x",
                contenders[c].0.describe(),
                ours / best
            ),
        );
    }
    say(
        "capacity within p99 ≤ 10 ms at least 0.9x the defaults' closed-loop capacity",
        ours >= 0.9 * contenders[0].1,
        format!("{:.2}x", ours / contenders[0].1),
    );
    let behind: Vec<String> = args
        .loads
        .iter()
        .enumerate()
        .filter(|(l, _)| {
            let v = &samples[*l][0];
            median_by(v, |s| s.offered) <= fastest
                && (v.iter().any(|s| s.fell_behind)
                    || median_by(v, |s| s.per_sec) < 0.99 * median_by(v, |s| s.offered))
        })
        .map(|(_, load)| format!("{load}%"))
        .collect();
    say(
        "every read answered at every rate up to the fastest contender's capacity",
        behind.is_empty(),
        if behind.is_empty() {
            "none fell behind".to_owned()
        } else {
            format!("fell behind at {}", behind.join(", "))
        },
    );
    if let Some(l) = args.loads.iter().position(|&load| load == 25) {
        let databases: Vec<usize> = (1..contenders.len())
            .filter(|&c| contenders[c].0 != Contender::NoDatabase)
            .collect();
        let med = |c: usize, f: fn(&Sample) -> f64| median_by(&samples[l][c], f);
        let lowest = databases
            .iter()
            .map(|&c| med(c, |s| s.postgres_us))
            .fold(f64::INFINITY, f64::min);
        let cpu = med(0, |s| s.postgres_us);
        say(
            "at 25%, Postgres CPU per read at most 1.1x the lowest contender's",
            cpu <= 1.1 * lowest,
            format!("{cpu:.1} µs against {lowest:.1}: {:.2}x", cpu / lowest),
        );
        let p99 = med(0, |s| s.p99_ms);
        let slower: Vec<String> = databases
            .iter()
            .filter(|&&c| med(c, |s| s.p99_ms) < p99)
            .map(|&c| {
                format!(
                    "{} {:.2} ms",
                    contenders[c].0.describe(),
                    med(c, |s| s.p99_ms)
                )
            })
            .collect();
        say(
            "at 25%, p99 at most every contender's",
            slower.is_empty(),
            if slower.is_empty() {
                format!("{p99:.2} ms")
            } else {
                format!("{p99:.2} ms against {}", slower.join(", "))
            },
        );
    }
}

fn append_csv(
    args: &Args,
    contenders: &[(Contender, f64)],
    samples: &[Vec<Vec<Sample>>],
) -> anyhow::Result<()> {
    let (mut f, now) = benches::append_csv(
        &args.csv,
        "unix_time,rows,seconds,load_percent,rates_of,contender,capacity_per_sec,round,offered_per_sec,answered_per_sec,p50_ms,p99_ms,p999_ms,postgres_us_per_read,client_us_per_read,keys_per_load,fell_behind",
    )?;
    for (l, load) in args.loads.iter().enumerate() {
        for (c, (who, cap)) in contenders.iter().enumerate() {
            for (round, s) in samples[l][c].iter().enumerate() {
                writeln!(
                    f,
                    "{now},{},{},{load},{:?},\"{}\",{cap:.0},{round},{:.0},{:.0},{:.3},{:.3},{:.3},{:.2},{:.2},{:.1},{}",
                    args.table.rows,
                    args.runs.seconds,
                    args.rates_of,
                    who.describe(),
                    s.offered,
                    s.per_sec,
                    s.p50_ms,
                    s.p99_ms,
                    s.p999_ms,
                    s.postgres_us,
                    s.client_us,
                    s.mean_batch,
                    s.fell_behind
                )?;
            }
        }
    }
    Ok(())
}

/// What a panel plots of a run.
type Metric = fn(&Sample) -> f64;

/// Two panels: the median p99, and the median Postgres CPU per read, each
/// against the median offered rate, a line per contender, on log scales
/// (p99 spans a millisecond to seconds past capacity).
fn plot(
    path: &Path,
    args: &Args,
    contenders: &[(Contender, f64)],
    samples: &[Vec<Vec<Sample>>],
) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing {}: {e}", path.display());
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let root = SVGBackend::new(path, (900, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (top, bottom) = root.split_vertically(450);
    let panels: [(_, &str, &str, Metric); 2] = [
        (&top, "p99 latency from the intended start", "p99 ms", |s| {
            s.p99_ms
        }),
        (&bottom, "Postgres CPU per read", "µs per read", |s| {
            s.postgres_us
        }),
    ];
    let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    for (area, title, y_desc, f) in panels {
        let series: Vec<Vec<(f64, f64)>> = (0..contenders.len())
            .map(|c| {
                (0..args.loads.len())
                    .map(|l| {
                        let v = &samples[l][c];
                        (median_by(v, |s| s.offered) / 1e3, median_by(v, f))
                    })
                    .filter(|p| p.1.is_finite() && p.1 > 0.0)
                    .collect()
            })
            .collect();
        let points = || series.iter().flatten();
        let x_max = points().map(|p| p.0).fold(0.0, f64::max) * 1.05;
        let y_max = points().map(|p| p.1).fold(0.0, f64::max) * 1.5;
        let y_min = points().map(|p| p.1).fold(f64::INFINITY, f64::min) / 1.5;
        let (y_min, y_max) = if y_min.is_finite() {
            (y_min, y_max)
        } else {
            (0.1, 1.0)
        };
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..x_max.max(1.0), (y_min..y_max).log_scale())
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("offered reads/s, thousands")
            .y_desc(y_desc)
            .draw()
            .map_err(|e| err(&e))?;
        for (c, points) in series.into_iter().enumerate() {
            let color = colors[c % colors.len()];
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(contenders[c].0.describe())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(|e| err(&e))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE)
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_contender_is_offered_a_tenth_to_past_the_fastest_capacity() {
        let args = Args::try_parse_from(["openloop"]).expect("the defaults parse");
        assert_eq!(args.loads, [10, 25, 50, 60, 70, 80, 90, 100, 110]);
        assert_eq!(args.rates_of, RatesOf::Fastest);
        assert!(args.only.contains(&Who::NoDatabase));
    }

    fn sample(offered: f64, per_sec: f64, p99_ms: f64, fell_behind: bool) -> Sample {
        Sample {
            offered,
            per_sec,
            p50_ms: p99_ms / 4.0,
            p99_ms,
            p999_ms: p99_ms,
            postgres_us: 10.0,
            client_us: 10.0,
            mean_batch: 1.0,
            fell_behind,
        }
    }

    #[test]
    fn capacity_within_a_target_ends_at_the_first_rate_that_misses_it() {
        let ok = |rate| vec![sample(rate, rate, 2.0, false); 3];
        let slow = |rate| vec![sample(rate, rate, 12.0, false); 3];
        // Rates 10k-50k served within 5 ms, 60k at 12 ms, 70k within 5
        // ms again: the curve's first crossing counts, not a lucky rate
        // after it.
        let rates = [ok(10e3), ok(30e3), ok(50e3), slow(60e3), ok(70e3)];
        let by_rate: Vec<&[Sample]> = rates.iter().map(|v| &v[..]).collect();
        assert_eq!(capacity_within(&by_rate, 5.0), 50e3);
        assert_eq!(capacity_within(&by_rate, 15.0), 70e3);
        // Falling behind in one round, or answering less than the rate,
        // is not serving it, whatever the p99 of the reads answered.
        let mut behind = ok(60e3);
        behind[1].fell_behind = true;
        let short = vec![sample(60e3, 50e3, 2.0, false); 3];
        for miss in [behind, short] {
            let rates = [ok(10e3), miss, ok(70e3)];
            let by_rate: Vec<&[Sample]> = rates.iter().map(|v| &v[..]).collect();
            assert_eq!(capacity_within(&by_rate, 15.0), 10e3);
        }
        let rates = [slow(10e3)];
        assert_eq!(capacity_within(&[&rates[0][..]], 5.0), 0.0);
    }
}
