//! Demo of the micro-batcher until the HTTP object-metadata service lands.
//!
//! It simulates a database whose every statement costs one round trip and
//! occupies one of a few pooled connections, then runs the same closed-loop
//! workload two ways: one statement per lookup (naive), and lookups
//! coalesced by a [`Batcher`] into one statement per batch. No Postgres is
//! involved yet; the numbers show the shape of the win, not a measurement of
//! a real database.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use batcher::{Batcher, Loader};
use clap::Parser;
use tokio::sync::Semaphore;

/// Command-line options of the demo.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "Micro-batching demo: naive vs batched lookups against a simulated database"
)]
struct Args {
    /// Concurrent callers, each doing one lookup at a time.
    #[arg(long, default_value_t = 300, env = "DEMO_CALLERS")]
    callers: usize,
    /// How long each of the two runs lasts, in seconds.
    #[arg(long, default_value_t = 3, env = "DEMO_SECONDS")]
    seconds: u64,
    /// Simulated connections (statements that can run at once).
    #[arg(long, default_value_t = 8, env = "DEMO_CONNECTIONS")]
    connections: usize,
    /// Simulated round trip of one statement, in milliseconds.
    #[arg(long, default_value_t = 1, env = "DEMO_STATEMENT_MS")]
    statement_ms: u64,
}

/// A stand-in database: each statement holds a connection for one round
/// trip, however many keys it asks for (round trips dominate small queries).
#[derive(Debug)]
struct SimulatedDb {
    connections: Semaphore,
    round_trip: Duration,
    statements: AtomicU64,
}

impl SimulatedDb {
    async fn select(&self, keys: &[u64]) -> HashMap<u64, String> {
        let _conn = self.connections.acquire().await.expect("never closed");
        tokio::time::sleep(self.round_trip).await;
        self.statements.fetch_add(1, Relaxed);
        keys.iter().map(|&k| (k, format!("object-{k}"))).collect()
    }
}

#[derive(Debug, Clone)]
struct DbLoader(Arc<SimulatedDb>);

impl Loader<u64, String> for DbLoader {
    type Error = Infallible;

    async fn load(&self, keys: Vec<u64>) -> Result<HashMap<u64, String>, Infallible> {
        Ok(self.0.select(&keys).await)
    }
}

/// Runs `callers` closed-loop callers for `duration`; returns lookups done.
async fn run<F, Fut>(callers: usize, duration: Duration, lookup: F) -> u64
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let stop = Instant::now() + duration;
    let tasks: Vec<_> = (0..callers as u64)
        .map(|i| {
            let lookup = lookup.clone();
            tokio::spawn(async move {
                let mut done = 0u64;
                let mut key = i;
                while Instant::now() < stop {
                    if lookup(key).await {
                        done += 1;
                    }
                    key = key.wrapping_mul(6364136223846793005).wrapping_add(1) % 1_000_000;
                }
                done
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("caller task panicked");
    }
    total
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    anyhow::ensure!(args.callers > 0, "--callers must be at least 1");
    anyhow::ensure!(args.connections > 0, "--connections must be at least 1");
    let duration = Duration::from_secs(args.seconds.max(1));
    let db = Arc::new(SimulatedDb {
        connections: Semaphore::new(args.connections),
        round_trip: Duration::from_millis(args.statement_ms),
        statements: AtomicU64::new(0),
    });
    println!(
        "{} callers, {} connections, {} ms per statement, {} s per run\n",
        args.callers,
        args.connections,
        args.statement_ms,
        duration.as_secs()
    );

    let naive = {
        let db = Arc::clone(&db);
        run(args.callers, duration, move |k| {
            let db = Arc::clone(&db);
            async move { db.select(&[k]).await.contains_key(&k) }
        })
        .await
    };
    let naive_statements = db.statements.swap(0, Relaxed);

    let batcher: Batcher<u64, String> = Batcher::builder()
        .name("demo")
        .max_concurrent_batches(args.connections)
        .build(DbLoader(Arc::clone(&db)))?;
    let batched = {
        let batcher = batcher.clone();
        run(args.callers, duration, move |k| {
            let batcher = batcher.clone();
            async move { matches!(batcher.load(k).await, Ok(Some(_))) }
        })
        .await
    };
    let stats = batcher.stats();
    batcher.shutdown().await;
    let batched_statements = db.statements.load(Relaxed);

    let secs = duration.as_secs_f64();
    println!("| path | lookups/s | statements/s | mean keys per statement |");
    println!("|---|---:|---:|---:|");
    println!(
        "| naive | {:.0} | {:.0} | 1.0 |",
        naive as f64 / secs,
        naive_statements as f64 / secs
    );
    println!(
        "| batched | {:.0} | {:.0} | {:.1} |",
        batched as f64 / secs,
        batched_statements as f64 / secs,
        stats.batch_size.mean().unwrap_or(0.0)
    );
    println!(
        "\nbatched / naive = {:.1}x (simulated database; the Postgres-backed server comes next)",
        batched as f64 / naive.max(1) as f64
    );
    Ok(())
}
