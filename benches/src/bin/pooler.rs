//! Batched reads behind a transaction-mode connection pooler against a
//! direct connection, in one run: what `--pooler transaction` costs.
//!
//! PgBouncer (Debian's package, `scripts/ensure-pgbouncer.sh`) is started in
//! transaction mode in front of the benchmark cluster, with as many server
//! connections as the pool has. Each run reads `random_read_test` through
//! the server's batched lookup at its defaults (automatic concurrency),
//! measured after a warm-up, in interleaved rounds:
//!
//! - direct, prepared statements: the service on a direct connection;
//! - direct, unnamed statements: what unnamed statements alone cost;
//! - direct, unnamed, statement timeout set per transaction: all of what
//!   the service does behind a pooler, but the pooler;
//! - through PgBouncer, unnamed, timeout per transaction: the service
//!   behind a transaction-mode pooler (`--pooler transaction`).
//!
//! Then the wrong setting, prepared statements through PgBouncer, is shown
//! failing: reads are sent and their errors counted.
//!
//! ```text
//! cargo run --release -p benches --bin pooler
//! cargo run --release -p benches --bin pooler -- --smoke   # seconds, for CI
//! ```

use std::time::Duration;

use anyhow::Context as _;
use benches::reads::{self, TableArgs};
use benches::rounds::{median, range_by, WarmRoundArgs};
use benches::{print_markdown, Align};
use clap::Parser;
use embedded_pg::pgbouncer::{PgBouncer, PoolMode};
use pgbatch::pg::{Pool, PoolOptions, Statements};
use server::cluster::coherence::Coherence;
use server::cluster::replicas::ReadRouter;
use server::db::queries::kv::KvQuery;
use server::db::Database;
use server::domain::lookup::Lookup;
use server::settings::{BatchSettings, Pooler, ReplicaSettings};

/// Measures batched reads through PgBouncer against a direct connection.
#[derive(Debug, Parser)]
#[command(about)]
struct Args {
    #[command(flatten)]
    table: TableArgs,
    /// Concurrent initiators, each doing one read at a time.
    #[arg(long, value_delimiter = ',', default_value = "16,300")]
    initiators: Vec<usize>,
    #[command(flatten)]
    runs: WarmRoundArgs,
    /// Connections of each pool, and PgBouncer's server connections.
    #[arg(long, default_value_t = 16)]
    pool_size: usize,
}

/// One way of reaching the database.
#[derive(Debug, Clone, Copy)]
struct Setup {
    name: &'static str,
    through_pooler: bool,
    statements: fn(Duration) -> Statements,
}

const SETUPS: [Setup; 4] = [
    Setup {
        name: "direct, prepared (--pooler none)",
        through_pooler: false,
        statements: |t| Pooler::None.statements(t),
    },
    Setup {
        name: "direct, unnamed",
        through_pooler: false,
        statements: |_| Statements::default().mode(pgbatch::pg::StatementMode::Unnamed),
    },
    Setup {
        name: "direct, unnamed, timeout per transaction",
        through_pooler: false,
        statements: |t| Pooler::Transaction.statements(t),
    },
    Setup {
        name: "PgBouncer, unnamed, timeout per transaction (--pooler transaction)",
        through_pooler: true,
        statements: |t| Pooler::Transaction.statements(t),
    },
];

/// One run's figures.
#[derive(Debug, Clone, Copy)]
struct Sample {
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    failed: bool,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    args.table.apply_smoke("pooler");
    if args.table.smoke {
        args.runs.smoke();
        args.initiators = vec![32];
    }
    args.table
        .with_table(|o| o, async |db| measure(&args, db).await)
        .await
}

fn router(pool: &Pool, statements: Statements) -> ReadRouter {
    ReadRouter::new(
        pool.clone(),
        Vec::new(),
        statements,
        &ReplicaSettings::default(),
        server::settings::defaults::REQUEST_TIMEOUT,
        Coherence::default(),
    )
}

async fn measure(args: &Args, db: &Database) -> anyhow::Result<()> {
    let cluster = db
        .cluster
        .as_ref()
        .context("this benchmark puts PgBouncer in front of the embedded cluster; run it without DATABASE_URL")?;
    let bouncer = PgBouncer::start(cluster, PoolMode::Transaction, args.pool_size).await?;
    let options = PoolOptions::with_max_size(args.pool_size);
    let direct = pgbatch::pg::pool(db.config.clone(), &options)?;
    let dbname = db.config.get_dbname().unwrap_or("postgres");
    let pooled = pgbatch::pg::pool(bouncer.config(dbname), &options)?;
    let timeout = server::settings::defaults::REQUEST_TIMEOUT;
    let rows = args.table.rows;
    let (run, warmup) = (
        Duration::from_secs_f64(args.runs.seconds),
        Duration::from_secs_f64(args.runs.warmup),
    );
    let mut samples: Vec<Vec<Vec<Sample>>> =
        vec![vec![Vec::new(); SETUPS.len()]; args.initiators.len()];
    for round in 0..args.runs.rounds {
        for (i, &n) in args.initiators.iter().enumerate() {
            for (s, setup) in SETUPS.iter().enumerate() {
                eprintln!("round {}: {n} initiators, {}", round + 1, setup.name);
                let pool = if setup.through_pooler {
                    &pooled
                } else {
                    &direct
                };
                let source = router(pool, (setup.statements)(timeout));
                let sample = match tokio::spawn(reads::batched_run_warm(
                    source,
                    BatchSettings::default(),
                    n,
                    warmup,
                    run,
                    rows,
                ))
                .await
                {
                    Ok(Ok(r)) => Sample {
                        per_sec: r.report.per_sec(),
                        p50_ms: r.report.quantile(0.5).as_secs_f64() * 1e3,
                        p99_ms: r.report.quantile(0.99).as_secs_f64() * 1e3,
                        failed: false,
                    },
                    // A read failed: counted, and the row says so.
                    Ok(Err(_)) | Err(_) => Sample {
                        per_sec: 0.0,
                        p50_ms: f64::NAN,
                        p99_ms: f64::NAN,
                        failed: true,
                    },
                };
                samples[i][s].push(sample);
            }
        }
    }
    println!(
        "\nBatched reads, server defaults (automatic concurrency), pools of {}; PgBouncer 1.18 in transaction mode with {} server connections; {} interleaved rounds of {:.1} s after {:.1} s of warm-up; medians (range)\n",
        args.pool_size, args.pool_size, args.runs.rounds, args.runs.seconds, args.runs.warmup
    );
    let mut table: Vec<Vec<String>> = Vec::new();
    for (i, &n) in args.initiators.iter().enumerate() {
        let base = median(&samples[i][0].iter().map(|s| s.per_sec).collect::<Vec<_>>());
        for (s, setup) in SETUPS.iter().enumerate() {
            let runs = &samples[i][s];
            let ok: Vec<&Sample> = runs.iter().filter(|r| !r.failed).collect();
            let failed = format!("{} of {}", runs.len() - ok.len(), runs.len());
            if ok.is_empty() {
                let dash = || "-".to_owned();
                table.push(vec![
                    n.to_string(),
                    setup.name.to_owned(),
                    dash(),
                    dash(),
                    dash(),
                    dash(),
                    failed,
                ]);
                continue;
            }
            let rates: Vec<f64> = ok.iter().map(|r| r.per_sec).collect();
            let m = median(&rates);
            let (lo, hi) = range_by(&rates, |x| *x);
            table.push(vec![
                n.to_string(),
                setup.name.to_owned(),
                format!("{m:.0} ({lo:.0}-{hi:.0})"),
                format!("{:.2}", m / base),
                format!(
                    "{:.2}",
                    median(&ok.iter().map(|r| r.p50_ms).collect::<Vec<_>>())
                ),
                format!(
                    "{:.2}",
                    median(&ok.iter().map(|r| r.p99_ms).collect::<Vec<_>>())
                ),
                failed,
            ]);
        }
    }
    print_markdown(
        &[
            ("initiators", Align::Right),
            ("setup", Align::Left),
            ("reads/s", Align::Right),
            ("× direct prepared", Align::Right),
            ("p50 ms", Align::Right),
            ("p99 ms", Align::Right),
            ("runs failed", Align::Right),
        ],
        table,
    );
    wrong_setting(&pooled, timeout, rows).await?;
    drop(bouncer);
    Ok(())
}

/// Reads through the pooler with prepared statements (`--pooler none`
/// behind a transaction-mode pooler) and prints how many failed and why.
async fn wrong_setting(pooled: &Pool, timeout: Duration, rows: u64) -> anyhow::Result<()> {
    const READS: u64 = 2_000;
    let settings = reads::read_settings(
        server::settings::ReadPath::Batched,
        BatchSettings::default(),
    );
    let lookup = std::sync::Arc::new(Lookup::new(
        "kv",
        KvQuery,
        router(pooled, Pooler::None.statements(timeout)),
        &settings,
    )?);
    let tasks: Vec<_> = (0..READS)
        .map(|i| {
            let lookup = std::sync::Arc::clone(&lookup);
            tokio::spawn(async move {
                lookup
                    .get(reads::key(1 + i * 7_919 % rows))
                    .await
                    .err()
                    .map(|e| format!("{e:#}"))
            })
        })
        .collect();
    // Failures by their message: one line each, with its count.
    let mut failures = std::collections::BTreeMap::<String, u64>::new();
    for task in tasks {
        if let Some(e) = task.await? {
            *failures.entry(e).or_default() += 1;
        }
    }
    let failed: u64 = failures.values().sum();
    println!(
        "\nPgBouncer, prepared statements (--pooler none, the wrong setting): {failed} of {READS} reads failed"
    );
    for (message, n) in &failures {
        println!("  {n} with: {message}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_flags_keep_their_defaults() {
        let args = Args::try_parse_from(["pooler"]).expect("the defaults parse");
        let runs = &args.runs;
        assert_eq!((runs.rounds, runs.seconds, runs.warmup), (3, 3.0, 1.0));
    }
}
