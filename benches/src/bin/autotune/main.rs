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
//!   the new phase settles at. Before it, each fixed limit of `--fixed`
//!   runs under each phase's conditions in `--rounds` interleaved rounds:
//!   the best median is drawn dashed beside the phase, and the table gives
//!   what the phase settled at over it.
//! - `baseline` (only when named, and in `--smoke`): the strongest fair
//!   baseline of the engine, the eager batcher an engineer writes by hand
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
use benches::rounds::{median, median_by, range_by, spread, WarmRoundArgs};
use benches::{closed_loop_timeline, ms, print_markdown, Align, KeyStream, RunReport, Timeline};
use clap::Parser;
use pgbatch::pg::{BatchQuery as _, Pool, PoolOptions};
use pgbatch::Concurrency;
use server::db::queries::kv::KvQuery;
use server::db::Database;
use server::domain::lookup::Lookup;
use server::settings::{BatchSettings, ReadPath};
use tokio_postgres::NoTls;

mod baseline;
mod sweep;
mod timeline;

/// The allocator the server binary uses: these runs measure the server's
/// lookups (its statements, its loader), and with glibc's malloc a sixth
/// of this process's CPU went to allocating, on cores it shares with
/// Postgres (BENCHMARKS.md, "How close to the database's limit").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Measures the automatic concurrency limit against fixed ones.
#[derive(Debug, Parser)]
#[command(
    about,
    mut_arg("rounds", |a| a.help("Interleaved rounds of the sweep, and of the baseline's comparison")),
    mut_arg("seconds", |a| a.default_value("2"))
)]
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
    #[command(flatten)]
    runs: WarmRoundArgs,
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
    /// Loads running at once on average (0 for one statement per read).
    running: f64,
}

impl Sample {
    fn of(report: &RunReport, mean_batch: f64, limit: u64, running: f64) -> Self {
        Self {
            per_sec: report.per_sec(),
            p50: report.quantile(0.5),
            p99: report.quantile(0.99),
            mean_batch,
            limit,
            running,
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
        args.runs.smoke();
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
        sweep::sweep(args, db).await?;
    }
    if args.only.contains(&Part::Timeline) {
        timeline::timeline(args, db).await?;
    }
    if args.only.contains(&Part::Baseline) {
        baseline::baseline(args, db).await?;
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

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

/// Maps a plotters error, which borrows its backend, to `anyhow`.
fn plot_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("{e}")
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
    fn round_flags_keep_their_defaults() {
        let args = Args::try_parse_from(["autotune"]).expect("the defaults parse");
        let runs = &args.runs;
        assert_eq!((runs.rounds, runs.seconds, runs.warmup), (3, 2.0, 1.0));
    }

    #[test]
    fn settings_keep_the_defaults_but_the_concurrency() {
        assert_eq!(settings(Setting::Auto), BatchSettings::default());
        assert_eq!(
            settings(Setting::Fixed(3)).concurrency,
            Concurrency::Fixed(3)
        );
    }
}
