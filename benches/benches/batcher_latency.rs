//! Latency percentiles and throughput of the batcher against calling the
//! loader directly, measured in the same run, printed as a Markdown table.
//!
//! `cargo bench -p benches --bench batcher_latency` (add `-- --test` for a
//! seconds-long smoke run). Criterion reports means; this reports the tail.
//!
//! To profile one case, `-- --callers 300 --only eager` runs just that one,
//! without its direct baseline (the ratio column then shows `-`);
//! `--millis N` sets each case's length (default 3000); `--concurrency N`
//! fixes the loads at once instead of the automatic default. The last
//! column is the limit the batcher ended at.

use std::time::Duration;

use benches::{closed_loop, MemLoader, RunReport};
use pgbatch::{Batcher, Concurrency, FlushPolicy, Loader};

const ROWS: u64 = 100_000;

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
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
    let millis = value("--millis").map(|v| v.parse().expect("--millis takes a number"));
    let duration = Duration::from_millis(millis.unwrap_or(if smoke { 100 } else { 3_000 }));
    let callers_list: Vec<usize> = match value("--callers") {
        Some(v) => vec![v.parse().expect("--callers takes a number")],
        None => vec![1, 16, 300],
    };
    // A substring of the path names: "direct", "eager", "fixed".
    let only = value("--only");
    let concurrency = value("--concurrency")
        .map(|v| Concurrency::Fixed(v.parse().expect("--concurrency takes a number")));
    let wanted = |name: &str| only.as_deref().is_none_or(|o| name.contains(o));

    let rt = benches::runtime();
    let loader = MemLoader::new(ROWS);

    println!(
        "| callers | path | keys/s | × direct | p50 µs | p99 µs | p99.9 µs | max µs | mean batch | limit |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for callers in callers_list {
        let direct = wanted("direct").then(|| {
            rt.block_on({
                let l = loader.clone();
                closed_loop(callers, duration, ROWS, move |k| {
                    let l = l.clone();
                    async move {
                        std::hint::black_box(l.load(vec![k]).await.ok());
                    }
                })
            })
        });
        if let Some(direct) = &direct {
            row(callers, "direct", direct, Some(direct), None, None);
        }
        for (name, policy) in [
            ("batcher eager", FlushPolicy::Eager),
            ("batcher fixed 0.5 ms", FlushPolicy::FixedDelay),
        ] {
            if !wanted(name) {
                continue;
            }
            let b: Batcher<u64, u64> = {
                let _guard = rt.enter();
                let builder = Batcher::builder().policy(policy);
                match concurrency {
                    Some(c) => builder.concurrency(c),
                    None => builder,
                }
                .build(loader.clone())
                .expect("valid config")
            };
            let report = rt.block_on({
                let b = b.clone();
                closed_loop(callers, duration, ROWS, move |k| {
                    let b = b.clone();
                    async move {
                        std::hint::black_box(b.load(k).await.ok());
                    }
                })
            });
            let stats = b.stats();
            assert_eq!(stats.failed_keys + stats.timed_out + stats.overloaded, 0);
            row(
                callers,
                name,
                &report,
                direct.as_ref(),
                stats.batch_size.mean(),
                Some(stats.concurrency_limit),
            );
            rt.block_on(b.shutdown());
        }
    }
}

fn row(
    callers: usize,
    name: &str,
    r: &RunReport,
    base: Option<&RunReport>,
    batch: Option<f64>,
    limit: Option<u64>,
) {
    println!(
        "| {callers} | {name} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
        r.per_sec(),
        base.map_or("-".to_owned(), |b| format!(
            "{:.2}",
            r.per_sec() / b.per_sec()
        )),
        us(r.quantile(0.5)),
        us(r.quantile(0.99)),
        us(r.quantile(0.999)),
        us(r.max()),
        batch.map_or("-".to_owned(), |m| format!("{m:.1}")),
        limit.map_or("-".to_owned(), |l| l.to_string()),
    );
}
