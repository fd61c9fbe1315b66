//! Latency at a given load, and what each read costs the database. Each
//! contender's capacity is measured in a closed loop; then reads arrive at
//! fixed rates, 25, 50, 75 and 90% of it (an open loop), and each read's
//! latency counts from when it was meant to start, so a stall counts for
//! every read it held up (coordinated omission corrected).
//!
//! The contenders read `random_read_test` through one `PgLoader` (the
//! batched `= ANY($1)` statement, the single-key one for a batch of one)
//! on one pool of `--pool-size` connections:
//!
//! - pgbatch at its defaults (`Batcher::new`);
//! - the minimal batcher (`benches::minimal`, connections and a worker of
//!   its own each, batches of 64) at its best setting: the one of
//!   `--minimal-connections` that served most in the capacity runs;
//! - async-graphql's `DataLoader` at its defaults, and at its best setting
//!   of a sweep over its delay and batch size, by capacity too;
//! - one statement per read, the single-key statement on a pooled
//!   connection.
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
use benches::rounds::{median, WarmRoundArgs};
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
    /// Loads to offer, in percent of capacity.
    #[arg(long, value_delimiter = ',', default_value = "25,50,75,90")]
    loads: Vec<u32>,
    /// Whose capacity the loads are shares of: each contender's own (the
    /// latency a user gets at that share of what it serves), or pgbatch's
    /// defaults' (every contender at the same rates; one past its
    /// capacity falls behind and is marked).
    #[arg(long, value_enum, default_value = "own")]
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
    Minimal,
    DataloaderDefaults,
    DataloaderBest,
    OnePerRead,
}

impl Who {
    const ALL: [Self; 5] = [
        Self::Defaults,
        Self::Minimal,
        Self::DataloaderDefaults,
        Self::DataloaderBest,
        Self::OnePerRead,
    ];
}

/// See [`Args::rates_of`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RatesOf {
    Own,
    Defaults,
}

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
            postgres_us: cpu
                .postgres
                .map_or(f64::NAN, |pg| CpuUse::per_request_us(pg, report.completed)),
            client_us: CpuUse::per_request_us(cpu.server, report.completed),
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
        args.loads = vec![25, 90];
        args.minimal_connections = vec![2];
        args.dataloader_delays_us = vec![0];
        args.dataloader_batches = vec![64];
    }
    anyhow::ensure!(
        args.loads.iter().all(|&l| (1..=100).contains(&l)),
        "--loads are percentages of capacity, from 1 to 100"
    );
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
                    RatesOf::Own => own,
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
    verdict(args, &contenders, &samples);
    append_csv(args, &contenders, &samples)?;
    plot(&args.svg, args, &contenders, &samples)?;
    eprintln!(
        "appended to {} and drew {}",
        args.csv.display(),
        args.svg.display()
    );
    Ok(())
}

/// Whether the defaults' median p99 and Postgres CPU per read are at most
/// every other contender's at every load, and where not.
fn verdict(args: &Args, contenders: &[(Contender, f64)], samples: &[Vec<Vec<Sample>>]) {
    if !args.only.contains(&Who::Defaults) || contenders.len() < 2 {
        return; // nothing to compare the defaults with
    }
    let med = |v: &[Sample], f: fn(&Sample) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
    let mut missed = Vec::new();
    for (l, load) in args.loads.iter().enumerate() {
        let ours = &samples[l][0];
        for (c, (who, _)) in contenders.iter().enumerate().skip(1) {
            for (what, f) in [
                ("p99", (|s: &Sample| s.p99_ms) as fn(&Sample) -> f64),
                ("Postgres CPU per read", |s: &Sample| s.postgres_us),
            ] {
                let ratio = med(ours, f) / med(&samples[l][c], f);
                if ratio > 1.0 {
                    missed.push(format!("{what} {ratio:.2}x {} at {load}%", who.describe()));
                }
            }
        }
    }
    if missed.is_empty() {
        println!("target: at every load, the defaults' p99 and Postgres CPU per read at most every contender's: met");
    } else {
        println!(
            "target: at every load, the defaults' p99 and Postgres CPU per read at most every contender's: MISSED ({})",
            missed.join("; ")
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
/// against load, a line per contender.
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
    let colors = [BLUE, RED, GREEN, MAGENTA, BLACK];
    for (area, title, y_desc, f) in panels {
        let series: Vec<Vec<(f64, f64)>> = (0..contenders.len())
            .map(|c| {
                args.loads
                    .iter()
                    .enumerate()
                    .map(|(l, &load)| {
                        let xs: Vec<f64> = samples[l][c].iter().map(f).collect();
                        (f64::from(load), median(&xs))
                    })
                    .filter(|p| p.1.is_finite())
                    .collect()
            })
            .collect();
        let y_max = series.iter().flatten().map(|p| p.1).fold(0.0, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..100f64, 0f64..y_max.max(0.1))
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("offered load, % of capacity")
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
    fn loads_default_to_a_quarter_to_nine_tenths_of_capacity() {
        let args = Args::try_parse_from(["openloop"]).expect("the defaults parse");
        assert_eq!(args.loads, [25, 50, 75, 90]);
        assert_eq!(args.rates_of, RatesOf::Own);
    }
}
