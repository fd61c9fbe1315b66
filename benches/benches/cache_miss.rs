//! The cache's miss path in memory: a cache in front of the eager batcher,
//! with uniform keys over a key space far larger than the cache (so almost
//! every lookup misses), against the batcher alone, in the same run.
//!
//! `cargo bench -p benches --bench cache_miss` (`-- --test` for a smoke
//! run; `--only cached` or `--only batcher` runs one path, for profiling;
//! `--millis N` sets each run's length, `--capacity N` the cache's entries,
//! default 100,000).

use std::convert::Infallible;
use std::time::Duration;

use benches::{closed_loop, RunReport};
use clap::Parser;
use pgbatch::cache::{Admission, Cache};
use pgbatch::{Batcher, Loaded, Loader};

/// Uniform keys over this many: the loadgen's table size.
const KEYS: u64 = 10_000_000;
const CALLERS: usize = 300;

/// Answers every key with a computed value: no table to hold 10M keys.
#[derive(Clone)]
struct Computed;

impl Loader<u64, u64> for Computed {
    type Error = Infallible;

    async fn load(&self, keys: Vec<u64>) -> Result<Loaded<u64, u64>, Infallible> {
        let mut rows = Loaded::with_capacity(keys.len());
        rows.extend(keys.into_iter().map(|k| (k, k * 2)));
        Ok(rows)
    }
}

#[derive(Parser)]
// `cargo bench -p benches -- <args>` gives every bench of the package the
// same arguments (criterion's filters and options too): ignore what is not
// ours.
#[command(ignore_errors = true)]
struct Args {
    #[command(flatten)]
    cargo: benches::CargoBenchFlags,
    /// Each run's length (default 3,000, or 200 with `--test`).
    #[arg(long)]
    millis: Option<u64>,
    /// Rounds of every path (default 3, or 1 with `--test`).
    #[arg(long)]
    rounds: Option<usize>,
    /// The cache's entries.
    #[arg(long, default_value_t = 100_000)]
    capacity: u64,
    /// Runs only the paths whose name contains this (`batcher`, `cached`,
    /// `second`), for profiling.
    #[arg(long)]
    only: Option<String>,
}

fn main() {
    let args = Args::parse();
    let millis = args
        .millis
        .unwrap_or(if args.cargo.test { 200 } else { 3_000 });
    let rounds = args.rounds.unwrap_or(if args.cargo.test { 1 } else { 3 });
    let wanted = |name: &str| args.only.as_deref().is_none_or(|o| name.contains(o));
    let duration = Duration::from_millis(millis);
    let rt = benches::runtime();

    println!("| round | path | keys/s | × batcher | p50 µs | p99 µs | hits |");
    println!("|---:|---|---:|---:|---:|---:|---:|");
    for round in 1..=rounds {
        let batcher = || -> Batcher<u64, u64> {
            let _guard = rt.enter();
            Batcher::builder()
                .max_batch_size(64)
                .build(Computed)
                .expect("valid config")
        };
        let base = wanted("batcher").then(|| {
            let b = batcher();
            let r = rt.block_on(closed_loop(CALLERS, duration, KEYS, {
                let b = b.clone();
                move |k| {
                    let b = b.clone();
                    async move {
                        std::hint::black_box(b.load(k).await.ok());
                    }
                }
            }));
            rt.block_on(b.shutdown());
            row(round, "batcher", &r, Some(&r), None);
            r
        });
        for (name, admission) in [
            ("cached", Admission::Always),
            ("cached, second miss", Admission::SecondMiss),
        ] {
            if !wanted(name) {
                continue;
            }
            let b = batcher();
            let cache: Cache<u64, u64> = Cache::builder()
                .max_capacity(args.capacity)
                .admission(admission)
                .build_with_batcher(b.clone())
                .expect("valid cache");
            let r = rt.block_on(closed_loop(CALLERS, duration, KEYS, {
                let cache = cache.clone();
                move |k| {
                    let cache = cache.clone();
                    async move {
                        std::hint::black_box(cache.get(k).await.ok());
                    }
                }
            }));
            let s = cache.stats();
            rt.block_on(b.shutdown());
            let hits = s.hits as f64 / (s.hits + s.misses + s.coalesced).max(1) as f64;
            row(round, name, &r, base.as_ref(), Some(hits));
        }
    }
}

/// One line of the table: `r` against `base` (`-` without one).
fn row(round: usize, name: &str, r: &RunReport, base: Option<&RunReport>, hits: Option<f64>) {
    let us = |q: f64| r.quantile(q).as_secs_f64() * 1e6;
    println!(
        "| {round} | {name} | {:.0} | {} | {:.1} | {:.1} | {} |",
        r.per_sec(),
        base.map_or("-".into(), |b| format!("{:.2}", r.per_sec() / b.per_sec())),
        us(0.5),
        us(0.99),
        hits.map_or("-".into(), |h| format!("{:.1}%", h * 100.0)),
    );
}
