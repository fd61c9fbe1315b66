//! The cache's miss path in memory: a cache in front of the eager batcher,
//! with uniform keys over a key space far larger than the cache (so almost
//! every lookup misses), against the batcher alone, in the same run.
//!
//! `cargo bench -p benches --bench cache_miss` (`-- --test` for a smoke
//! run; `--only cached` or `--only batcher` runs one path, for profiling;
//! `--millis N` sets each run's length, `--capacity N` the cache's entries,
//! default 100,000).

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use benches::closed_loop;
use pgbatch::cache::{Admission, Cache};
use pgbatch::{Batcher, Loader};

/// Uniform keys over this many: the loadgen's table size.
const KEYS: u64 = 10_000_000;
const CALLERS: usize = 300;

/// Answers every key with a computed value: no table to hold 10M keys.
#[derive(Clone)]
struct Computed;

impl Loader<u64, u64> for Computed {
    type Error = Infallible;

    async fn load(&self, keys: Vec<u64>) -> Result<HashMap<u64, u64>, Infallible> {
        let mut rows = HashMap::with_capacity(keys.len());
        rows.extend(keys.into_iter().map(|k| (k, k * 2)));
        Ok(rows)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--test");
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let millis: u64 = value("--millis").map_or(if smoke { 200 } else { 3_000 }, |v| {
        v.parse().expect("--millis takes a number")
    });
    let rounds: usize = value("--rounds").map_or(if smoke { 1 } else { 3 }, |v| {
        v.parse().expect("--rounds takes a number")
    });
    let capacity: u64 =
        value("--capacity").map_or(100_000, |v| v.parse().expect("--capacity takes a number"));
    let only = value("--only");
    let wanted = |name: &str| only.as_deref().is_none_or(|o| name.contains(o));
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
            println!(
                "| {round} | batcher | {:.0} | 1.00 | {:.1} | {:.1} | - |",
                r.per_sec(),
                r.quantile(0.5).as_secs_f64() * 1e6,
                r.quantile(0.99).as_secs_f64() * 1e6
            );
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
                .max_capacity(capacity)
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
            println!(
                "| {round} | {name} | {:.0} | {} | {:.1} | {:.1} | {:.1}% |",
                r.per_sec(),
                base.as_ref()
                    .map_or("-".into(), |b| format!("{:.2}", r.per_sec() / b.per_sec())),
                r.quantile(0.5).as_secs_f64() * 1e6,
                r.quantile(0.99).as_secs_f64() * 1e6,
                100.0 * s.hits as f64 / (s.hits + s.misses + s.coalesced).max(1) as f64
            );
        }
    }
}
