//! Small reads beside bulk ones: the latency of single-key reads alone,
//! and while bulk requests overload the same batcher.
//!
//! One `Batcher` at its defaults over a `PgLoader` of `random_read_test`
//! serves `--singles` callers, each reading one key at a time (`load`),
//! first alone and then beside `--bulk-callers` callers that each ask for
//! `--bulk-keys` keys at a time (`load_many`), more than the batcher
//! serves. In rounds: the single reads' p50 and p99 alone and beside the
//! bulk, their ratio (the target: at most 2x), and what the bulk callers
//! got through.
//!
//! ```text
//! cargo run --release -p benches --bin bulk
//! cargo run --release -p benches --bin bulk -- --smoke   # seconds, for CI
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use benches::reads::{key, TableArgs};
use benches::rounds::{median_by, spread, WarmRoundArgs};
use benches::{closed_loop_warm, print_markdown, Align, KeyStream, RunReport};
use clap::Parser;
use pgbatch::pg::{self, PgLoader, PoolOptions};
use pgbatch::{Batcher, Error};
use server::db::queries::kv::KvQuery;
use server::db::Database;

/// The allocator the server binary uses, as in the other load generators.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Single-key reads alone and beside bulk requests that overload the
/// batcher.
#[derive(Debug, Parser)]
#[command(about)]
struct Args {
    #[command(flatten)]
    table: TableArgs,
    #[command(flatten)]
    runs: WarmRoundArgs,
    /// Callers reading one key at a time.
    #[arg(long, default_value_t = 20)]
    singles: usize,
    /// Callers asking for `--bulk-keys` keys at a time: by default as many
    /// as keep the database busy without the batcher's queue (8,192 keys)
    /// refusing their requests, so every key waits its turn.
    #[arg(long, default_value_t = 6)]
    bulk_callers: usize,
    /// Keys of each bulk request.
    #[arg(long, default_value_t = 1000)]
    bulk_keys: usize,
    /// Connections of the pool.
    #[arg(long, default_value_t = 16)]
    pool_size: usize,
}

/// The single reads beside the bulk, in one round.
#[derive(Debug, Clone, Copy)]
struct Beside {
    p50_ms: f64,
    p99_ms: f64,
    singles_per_sec: f64,
    bulk_keys_per_sec: f64,
    /// Single reads that failed (overloaded or timed out).
    singles_failed: u64,
    /// Bulk keys refused or timed out.
    bulk_failed: u64,
}

/// One round's figures: the single reads alone, and beside the bulk.
#[derive(Debug, Clone, Copy)]
struct Round {
    alone_p50_ms: f64,
    alone_p99_ms: f64,
    /// Single reads that failed alone.
    alone_failed: u64,
    beside: Beside,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    benches::log_from_env();
    let mut args = Args::parse();
    args.table.apply_smoke("bulk");
    if args.table.smoke {
        args.runs.smoke();
        args.bulk_callers = 4;
        args.bulk_keys = 200;
        args.singles = 4;
    }
    args.table
        .with_table(|o| o, async |db| measure(&args, db).await)
        .await
}

async fn measure(args: &Args, db: &Database) -> anyhow::Result<()> {
    let pool = pg::pool(
        db.config.clone(),
        &PoolOptions::with_max_size(args.pool_size),
    )?;
    let loader = PgLoader::new(pool, KvQuery);
    println!(
        "{} rows; {} single-key callers, beside {} callers of {} keys; {} rounds of {} s after {} s of warm-up\n",
        args.table.rows,
        args.singles,
        args.bulk_callers,
        args.bulk_keys,
        args.runs.rounds,
        args.runs.seconds,
        args.runs.warmup
    );
    let mut rounds = Vec::new();
    for _ in 0..args.runs.rounds {
        rounds.push(round(args, &loader).await);
    }
    let cell = |f: &dyn Fn(&Round) -> f64, digits: usize| {
        spread(&rounds.iter().map(f).collect::<Vec<_>>(), digits)
    };
    let mut rows = vec![vec![
        "alone".to_owned(),
        cell(&|r| r.alone_p50_ms, 2),
        cell(&|r| r.alone_p99_ms, 2),
        "1".to_owned(),
        "–".to_owned(),
        "–".to_owned(),
    ]];
    let singles_failed: u64 = rounds
        .iter()
        .map(|r| r.alone_failed + r.beside.singles_failed)
        .sum();
    let bulk_failed: u64 = rounds.iter().map(|r| r.beside.bulk_failed).sum();
    rows.push(vec![
        format!("beside {} bulk callers", args.bulk_callers),
        cell(&|r| r.beside.p50_ms, 2),
        cell(&|r| r.beside.p99_ms, 2),
        cell(&|r| r.beside.p99_ms / r.alone_p99_ms, 2),
        format!(
            "{} ({singles_failed} failed, alone or beside)",
            cell(&|r| r.beside.singles_per_sec, 0)
        ),
        format!(
            "{} ({bulk_failed} failed)",
            cell(&|r| r.beside.bulk_keys_per_sec, 0)
        ),
    ]);
    print_markdown(
        &[
            ("single reads", Align::Left),
            ("p50 ms (range)", Align::Right),
            ("p99 ms (range)", Align::Right),
            ("p99 ÷ alone", Align::Right),
            ("single reads/s", Align::Right),
            ("bulk keys/s", Align::Right),
        ],
        rows,
    );
    println!();
    let ratio = median_by(&rounds, |r| r.beside.p99_ms / r.alone_p99_ms);
    println!(
        "target: single reads' p99 beside the bulk at most 2x alone: {} ({ratio:.2}x)",
        if ratio <= 2.0 { "met" } else { "MISSED" },
    );
    Ok(())
}

/// One round: the single reads alone, then beside the bulk callers, each
/// run on a batcher of its own at the defaults.
async fn round(args: &Args, loader: &PgLoader<KvQuery>) -> Round {
    let warmup = Duration::from_secs_f64(args.runs.warmup);
    let seconds = Duration::from_secs_f64(args.runs.seconds);
    let batcher = Batcher::new(loader.clone());
    let failed = Arc::new(AtomicU64::new(0));
    let alone = singles(args, &batcher, &failed, warmup, seconds).await;
    batcher.shutdown().await;
    let ms = |q| alone.quantile(q).as_secs_f64() * 1e3;
    Round {
        alone_p50_ms: ms(0.5),
        alone_p99_ms: ms(0.99),
        alone_failed: failed.load(Relaxed),
        beside: beside_bulk(args, &Batcher::new(loader.clone()), warmup, seconds).await,
    }
}

/// The single reads while `--bulk-callers` ask for `--bulk-keys` keys at a
/// time from the same `batcher`, which is then shut down.
async fn beside_bulk(
    args: &Args,
    batcher: &Batcher<String, String>,
    warmup: Duration,
    seconds: Duration,
) -> Beside {
    let rows = args.table.rows;
    let stop = Arc::new(AtomicBool::new(false));
    let bulk_keys = Arc::new(AtomicU64::new(0));
    let bulk_failed = Arc::new(AtomicU64::new(0));
    let bulk: Vec<_> = (0..args.bulk_callers)
        .map(|i| {
            let (batcher, stop) = (batcher.clone(), Arc::clone(&stop));
            let (done, failed) = (Arc::clone(&bulk_keys), Arc::clone(&bulk_failed));
            let n = args.bulk_keys;
            tokio::spawn(async move {
                let mut keys = KeyStream::new(1_000_000 + i as u64);
                while !stop.load(Relaxed) {
                    let ask: Vec<String> = (0..n).map(|_| key(keys.next_below(rows))).collect();
                    let answers = batcher.load_many(ask).await;
                    let bad = answers.iter().filter(|a| a.is_err()).count() as u64;
                    if bad == n as u64 {
                        // Refused whole (overloaded): a client backs off
                        // a little rather than spin on refusals.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    done.fetch_add(n as u64 - bad, Relaxed);
                    failed.fetch_add(bad, Relaxed);
                }
            })
        })
        .collect();
    let singles_failed = Arc::new(AtomicU64::new(0));
    let before = (bulk_keys.load(Relaxed), Instant::now());
    let report = singles(args, batcher, &singles_failed, warmup, seconds).await;
    let bulk_per_sec =
        (bulk_keys.load(Relaxed) - before.0) as f64 / before.1.elapsed().as_secs_f64();
    stop.store(true, Relaxed);
    for task in bulk {
        let _ = task.await;
    }
    batcher.shutdown().await;
    let ms = |q| report.quantile(q).as_secs_f64() * 1e3;
    Beside {
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        singles_per_sec: report.per_sec(),
        bulk_keys_per_sec: bulk_per_sec,
        singles_failed: singles_failed.load(Relaxed),
        bulk_failed: bulk_failed.load(Relaxed),
    }
}

/// `--singles` callers reading one key at a time from `batcher`; a failed
/// read is counted in `failed` and its latency recorded all the same (a
/// timeout is the latency its caller saw).
async fn singles(
    args: &Args,
    batcher: &Batcher<String, String>,
    failed: &Arc<AtomicU64>,
    warmup: Duration,
    seconds: Duration,
) -> RunReport {
    let (b, failed) = (batcher.clone(), Arc::clone(failed));
    closed_loop_warm(args.singles, warmup, seconds, args.table.rows, move |k| {
        let (b, failed) = (b.clone(), Arc::clone(&failed));
        async move {
            if let Err(e) = b.load(key(k)).await {
                if !matches!(e, Error::Overloaded | Error::Timeout(_)) {
                    panic!("a single read failed: {e}");
                }
                failed.fetch_add(1, Relaxed);
            }
        }
    })
    .await
}
