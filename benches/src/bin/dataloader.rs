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
//!   sweep over its delay and batch size;
//! - pgbatch with its best fixed concurrency, found by a sweep too: how
//!   far the automatic limit is from the best fixed one here.
//!
//! Then interleaved rounds of the four, each measured after a warm-up;
//! the table gives the medians and spreads of reads/s and p99, each
//! round's ratio against the two `DataLoader`s, the mean keys per load,
//! and the CPU each read cost this process and Postgres (where the time
//! goes).
//!
//! ```text
//! cargo run --release -p benches --bin dataloader
//! cargo run --release -p benches --bin dataloader -- --smoke   # seconds, for CI
//! ```

use std::sync::Arc;
use std::time::Duration;

use benches::contender::{Contender, Reader};
use benches::cpu::CpuSnapshot;
use benches::dataloader::DlSetting;
use benches::reads::{key, TableArgs};
use benches::rounds::{median, spread, WarmRoundArgs};
use benches::{closed_loop_warm, print_markdown, Align, ReadSample};
use clap::Parser;
use pgbatch::pg::{self, PgLoader, PoolOptions};
use server::db::queries::kv::KvQuery;
use server::db::Database;

/// Measures pgbatch against async-graphql's DataLoader on Postgres.
#[derive(Debug, Parser)]
#[command(
    about,
    mut_arg("rounds", |a| a.default_value("5").help("Interleaved rounds of the three contenders"))
)]
struct Args {
    #[command(flatten)]
    table: TableArgs,
    /// Concurrent callers, each asking for one key at a time.
    #[arg(long, default_value_t = 300)]
    resolvers: usize,
    #[command(flatten)]
    runs: WarmRoundArgs,
    /// Seconds per setting of the DataLoader's sweep.
    #[arg(long, default_value_t = 2.0)]
    sweep_seconds: f64,
    /// Connections in the pool both batchers share.
    #[arg(long, default_value_t = 16)]
    pool_size: usize,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    args.table.apply_smoke("dataloader");
    if args.table.smoke {
        args.runs.smoke();
        args.sweep_seconds = 0.2;
        args.resolvers = 64;
    }
    args.table
        .with_table(|o| o, async |db| measure(&args, db).await)
        .await
}

async fn run(
    args: &Args,
    db: &Database,
    loader: &PgLoader<KvQuery>,
    who: Contender,
    seconds: f64,
) -> ReadSample {
    let (warmup, run) = (
        Duration::from_secs_f64(args.runs.warmup),
        Duration::from_secs_f64(seconds),
    );
    // The CPU of the measured window: taken as the warm-up ends.
    let cpu_at_start = async {
        tokio::time::sleep(warmup).await;
        CpuSnapshot::take(db.cluster.as_ref())
    };
    let reader = Arc::new(
        Reader::start(who, db, loader)
            .await
            .unwrap_or_else(|e| panic!("{}: {e:#}", who.describe())),
    );
    let r = Arc::clone(&reader);
    let (report, before) = tokio::join!(
        closed_loop_warm(args.resolvers, warmup, run, args.table.rows, move |k| {
            let r = Arc::clone(&r);
            async move {
                if let Err(e) = r.get(key(k)).await {
                    panic!("{}: a read failed: {e}", who.describe());
                }
            }
        }),
        cpu_at_start
    );
    let mean_batch = reader.mean_batch();
    Arc::into_inner(reader)
        .expect("the reader is still shared after its run")
        .stop()
        .await;
    let cpu = CpuSnapshot::take(db.cluster.as_ref()).since(&before);
    ReadSample::new(&report, mean_batch, &cpu)
}

async fn measure(args: &Args, db: &Database) -> anyhow::Result<()> {
    let pool = pg::pool(
        db.config.clone(),
        &PoolOptions::with_max_size(args.pool_size),
    )?;
    let loader = PgLoader::new(pool, KvQuery);
    println!(
        "{} resolvers, pool of {}, {} rows; {} s runs after {} s warm-up\n",
        args.resolvers, args.pool_size, args.table.rows, args.runs.seconds, args.runs.warmup
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
                db,
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

    // pgbatch's best fixed limit, the same way.
    let mut fixed = Vec::new();
    for n in [2, 4, 6, 8, 12, 16]
        .into_iter()
        .filter(|&n| n <= args.pool_size)
    {
        let s = run(args, db, &loader, Contender::Fixed(n), args.sweep_seconds).await;
        fixed.push((n, s));
    }
    println!(
        "pgbatch fixed-limit sweep ({} s each):\n",
        args.sweep_seconds
    );
    print_markdown(
        &[
            ("loads at once", Align::Right),
            ("reads/s", Align::Right),
            ("p99 ms", Align::Right),
            ("keys/load", Align::Right),
        ],
        fixed.iter().map(|(n, s)| {
            vec![
                n.to_string(),
                format!("{:.0}", s.per_sec),
                format!("{:.2}", s.p99_ms),
                format!("{:.1}", s.mean_batch),
            ]
        }),
    );
    let best_fixed = fixed
        .iter()
        .max_by(|a, b| a.1.per_sec.total_cmp(&b.1.per_sec))
        .map_or(4, |(n, _)| *n);
    println!();

    let contenders = [
        ("pgbatch, defaults", Contender::Defaults),
        (
            "DataLoader, defaults",
            Contender::DataLoader(DlSetting::DEFAULT),
        ),
        ("DataLoader, best of sweep", Contender::DataLoader(best)),
        ("pgbatch, best fixed limit", Contender::Fixed(best_fixed)),
    ];
    let mut samples: Vec<Vec<ReadSample>> = vec![Vec::new(); contenders.len()];
    for round in 0..args.runs.rounds {
        // Each round in another order, so no contender always runs first.
        for i in 0..contenders.len() {
            let c = (i + round) % contenders.len();
            let s = run(args, db, &loader, contenders[c].1, args.runs.seconds).await;
            samples[c].push(s);
        }
    }

    println!(
        "Interleaved rounds: median (min-max) of {} rounds; ratios per round, then the median. \
         Best DataLoader setting: {}; best fixed pgbatch limit: {best_fixed}.\n",
        args.runs.rounds,
        best.describe()
    );
    let ratio = |who: usize, of: usize, f: fn(&ReadSample) -> f64| -> String {
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
            ("keys/load", Align::Right),
            ("client CPU µs/read", Align::Right),
            ("Postgres CPU µs/read", Align::Right),
        ],
        contenders.iter().enumerate().map(|(i, (name, _))| {
            let per_sec: Vec<f64> = samples[i].iter().map(|s| s.per_sec).collect();
            let p50: Vec<f64> = samples[i].iter().map(|s| s.p50_ms).collect();
            let p99: Vec<f64> = samples[i].iter().map(|s| s.p99_ms).collect();
            let column =
                |f: fn(&ReadSample) -> f64| -> Vec<f64> { samples[i].iter().map(f).collect() };
            vec![
                (*name).to_owned(),
                spread(&per_sec, 0),
                spread(&p50, 2),
                spread(&p99, 2),
                ratio(i, 1, |s| s.per_sec),
                ratio(i, 2, |s| s.per_sec),
                ratio(i, 2, |s| s.p99_ms),
                format!("{:.1}", median(&column(|s| s.mean_batch))),
                format!("{:.1}", median(&column(|s| s.client_us))),
                format!("{:.1}", median(&column(|s| s.postgres_us))),
            ]
        }),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_flags_keep_their_defaults() {
        let args = Args::try_parse_from(["dataloader"]).expect("the defaults parse");
        let runs = &args.runs;
        assert_eq!((runs.rounds, runs.seconds, runs.warmup), (5, 3.0, 1.0));
    }
}
