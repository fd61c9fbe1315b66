//! pgbatch against async-graphql's `DataLoader`, the batcher Rust GraphQL
//! services meet first, over the same loader, pool and table in one run.
//!
//! Both batch the same `PgLoader` (one `SELECT ... WHERE pk = ANY($1)` per
//! batch, the single-key statement for a batch of one) on one pool of
//! `--pool-size` connections, reading `random_read_test` with
//! `--resolvers` concurrent callers ("resolvers"), each asking for one
//! random key at a time:
//!
//! - pgbatch at its defaults (`Batcher::new`: eager flushing, batches of up
//!   to 64, the automatic concurrency limit at most 16);
//! - the `DataLoader` at its defaults (a 1 ms delay, batches of up to
//!   1,000, no bound on loads at once; `DataLoader::new`, no cache);
//! - the `DataLoader` at its best setting, found in the same run by a
//!   sweep over its delay and batch size.
//!
//! Then interleaved rounds of the three, each measured after a warm-up;
//! the table gives the medians and spreads of reads/s and p99, and each
//! round's ratio against the two `DataLoader`s.
//!
//! ```text
//! cargo run --release -p benches --bin dataloader
//! cargo run --release -p benches --bin dataloader -- --smoke   # seconds, for CI
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_graphql::dataloader::{DataLoader, Loader as DataLoaderLoader};
use benches::reads::{key, TableArgs};
use benches::{closed_loop_warm, print_markdown, Align, RunReport};
use clap::Parser;
use pgbatch::pg::{self, PgError, PgLoader, PoolOptions};
use pgbatch::{Batcher, Loader as _};
use server::db::queries::kv::KvQuery;
use server::db::Database;

/// Measures pgbatch against async-graphql's DataLoader on Postgres.
#[derive(Debug, Parser)]
#[command(about)]
struct Args {
    #[command(flatten)]
    table: TableArgs,
    /// Concurrent callers, each asking for one key at a time.
    #[arg(long, default_value_t = 300)]
    resolvers: usize,
    /// Interleaved rounds of the three contenders.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Seconds measured per run.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Seconds of the same load before each run is measured.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Seconds per setting of the DataLoader's sweep.
    #[arg(long, default_value_t = 2.0)]
    sweep_seconds: f64,
    /// Connections in the pool both batchers share.
    #[arg(long, default_value_t = 16)]
    pool_size: usize,
}

/// The `PgLoader` as a `DataLoader`'s loader: the same statements on the
/// same pool. Its error must be `Clone`, so it is shared.
struct SameLoader(PgLoader<KvQuery>);

impl DataLoaderLoader<String> for SameLoader {
    type Value = String;
    type Error = Arc<PgError>;

    async fn load(&self, keys: &[String]) -> Result<HashMap<String, String>, Arc<PgError>> {
        self.0.load(keys.to_vec()).await.map_err(Arc::new)
    }
}

/// A `DataLoader` setting.
#[derive(Debug, Clone, Copy, PartialEq)]
struct DlSetting {
    delay: Duration,
    max_batch: usize,
}

impl DlSetting {
    /// `DataLoader::new`'s own.
    const DEFAULT: Self = Self {
        delay: Duration::from_millis(1),
        max_batch: 1000,
    };

    fn describe(self) -> String {
        format!(
            "delay {} µs, batches ≤ {}",
            self.delay.as_micros(),
            self.max_batch
        )
    }
}

/// One of the contenders of a round.
#[derive(Debug, Clone, Copy)]
enum Contender {
    Pgbatch,
    DataLoader(DlSetting),
}

/// One run's figures.
#[derive(Debug, Clone, Copy)]
struct Sample {
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
}

impl From<&RunReport> for Sample {
    fn from(r: &RunReport) -> Self {
        Self {
            per_sec: r.per_sec(),
            p50_ms: benches::ms(r.quantile(0.5)),
            p99_ms: benches::ms(r.quantile(0.99)),
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    args.table.apply_smoke("dataloader");
    if args.table.smoke {
        args.rounds = 1;
        args.seconds = 0.3;
        args.warmup = 0.1;
        args.sweep_seconds = 0.2;
        args.resolvers = 64;
    }
    args.table
        .with_table(|o| o, async |db| measure(&args, db).await)
        .await
}

async fn run(args: &Args, loader: &PgLoader<KvQuery>, who: Contender, seconds: f64) -> Sample {
    let (warmup, run) = (
        Duration::from_secs_f64(args.warmup),
        Duration::from_secs_f64(seconds),
    );
    let rows = args.table.rows;
    let report = match who {
        Contender::Pgbatch => {
            let batcher: Batcher<String, String> = Batcher::new(loader.clone());
            let reader = batcher.clone();
            let report = closed_loop_warm(args.resolvers, warmup, run, rows, move |k| {
                let batcher = reader.clone();
                async move {
                    if let Err(e) = batcher.load(key(k)).await {
                        panic!("pgbatch read failed: {e}");
                    }
                }
            })
            .await;
            batcher.shutdown().await;
            report
        }
        Contender::DataLoader(setting) => {
            let dl = Arc::new(
                DataLoader::new(SameLoader(loader.clone()), tokio::spawn)
                    .delay(setting.delay)
                    .max_batch_size(setting.max_batch),
            );
            closed_loop_warm(args.resolvers, warmup, run, rows, move |k| {
                let dl = Arc::clone(&dl);
                async move {
                    if let Err(e) = dl.load_one(key(k)).await {
                        panic!("DataLoader read failed: {e}");
                    }
                }
            })
            .await
        }
    };
    Sample::from(&report)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// `median (min-max)` of `v`, with `digits` decimals.
fn spread(v: &[f64], digits: usize) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "{:.digits$} ({min:.digits$}-{max:.digits$})",
        median(v.to_vec())
    )
}

async fn measure(args: &Args, db: &Database) -> anyhow::Result<()> {
    let pool = pg::pool(
        db.config.clone(),
        &PoolOptions::with_max_size(args.pool_size),
    )?;
    let loader = PgLoader::new(pool, KvQuery);
    println!(
        "{} resolvers, pool of {}, {} rows; {} s runs after {} s warm-up\n",
        args.resolvers, args.pool_size, args.table.rows, args.seconds, args.warmup
    );

    // The DataLoader's best setting, found on this machine in this run.
    let mut sweep = Vec::new();
    for delay_us in [0, 100, 500, 1000] {
        for max_batch in [64, 128, 256, 1000] {
            let setting = DlSetting {
                delay: Duration::from_micros(delay_us),
                max_batch,
            };
            let s = run(
                args,
                &loader,
                Contender::DataLoader(setting),
                args.sweep_seconds,
            )
            .await;
            sweep.push((setting, s));
        }
    }
    println!("DataLoader sweep ({} s each):\n", args.sweep_seconds);
    print_markdown(
        &[
            ("setting", Align::Left),
            ("reads/s", Align::Right),
            ("p50 ms", Align::Right),
            ("p99 ms", Align::Right),
        ],
        sweep.iter().map(|(setting, s)| {
            vec![
                setting.describe(),
                format!("{:.0}", s.per_sec),
                format!("{:.2}", s.p50_ms),
                format!("{:.2}", s.p99_ms),
            ]
        }),
    );
    let best = sweep
        .iter()
        .max_by(|a, b| a.1.per_sec.total_cmp(&b.1.per_sec))
        .map_or(DlSetting::DEFAULT, |(setting, _)| *setting);
    println!();

    let contenders = [
        ("pgbatch, defaults", Contender::Pgbatch),
        (
            "DataLoader, defaults",
            Contender::DataLoader(DlSetting::DEFAULT),
        ),
        ("DataLoader, best of sweep", Contender::DataLoader(best)),
    ];
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); contenders.len()];
    for round in 0..args.rounds {
        // Each round in another order, so no contender always runs first.
        for i in 0..contenders.len() {
            let c = (i + round) % contenders.len();
            let s = run(args, &loader, contenders[c].1, args.seconds).await;
            samples[c].push(s);
        }
    }

    println!(
        "Interleaved rounds: median (min-max) of {} rounds; ratios per round, then the median. \
         Best DataLoader setting: {}.\n",
        args.rounds,
        best.describe()
    );
    let ratio = |who: usize, of: usize, f: fn(&Sample) -> f64| -> String {
        let v: Vec<f64> = samples[who]
            .iter()
            .zip(&samples[of])
            .map(|(a, b)| f(a) / f(b))
            .collect();
        spread(&v, 2)
    };
    print_markdown(
        &[
            ("contender", Align::Left),
            ("reads/s", Align::Right),
            ("p50 ms", Align::Right),
            ("p99 ms", Align::Right),
            ("reads/s ÷ DataLoader defaults", Align::Right),
            ("reads/s ÷ DataLoader best", Align::Right),
            ("p99 ÷ DataLoader best", Align::Right),
        ],
        contenders.iter().enumerate().map(|(i, (name, _))| {
            let per_sec: Vec<f64> = samples[i].iter().map(|s| s.per_sec).collect();
            let p50: Vec<f64> = samples[i].iter().map(|s| s.p50_ms).collect();
            let p99: Vec<f64> = samples[i].iter().map(|s| s.p99_ms).collect();
            vec![
                (*name).to_owned(),
                spread(&per_sec, 0),
                spread(&p50, 2),
                spread(&p99, 2),
                ratio(i, 1, |s| s.per_sec),
                ratio(i, 2, |s| s.per_sec),
                ratio(i, 2, |s| s.p99_ms),
            ]
        }),
    );
    Ok(())
}
