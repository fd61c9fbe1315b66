//! Criterion benches of the batcher's own overhead, with an in-memory loader.
//!
//! Every batcher figure has a baseline from the same run: the same callers
//! calling the loader directly, one key per call. With a loader this cheap
//! the batcher can only lose; what matters is how little it costs per key
//! (the Postgres benches show what it saves).

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::time::Duration;

use benches::{runtime, time_sequential, KeyStream, MemLoader};
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pgbatch::{Batcher, FlushPolicy, Loader};
use tokio::runtime::Runtime;

const ROWS: u64 = 100_000;

fn batcher(rt: &Runtime, loader: &MemLoader, policy: FlushPolicy) -> Batcher<u64, u64> {
    let _guard = rt.enter();
    Batcher::builder()
        .policy(policy)
        .build(loader.clone())
        .expect("valid batcher config")
}

/// `callers` tasks each make `per_caller` sequential requests; returns when
/// all are done. Callers run on the runtime's workers, as request handlers
/// would.
async fn round<F, Fut>(callers: usize, per_caller: usize, request: F)
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let request = request.clone();
            tokio::spawn(async move {
                let mut keys = KeyStream::new(i as u64);
                for _ in 0..per_caller {
                    request(keys.next_below(ROWS)).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("bench caller panicked");
    }
}

fn throughput(c: &mut Criterion) {
    let rt = runtime();
    let loader = MemLoader::new(ROWS);
    let eager = batcher(&rt, &loader, FlushPolicy::Eager);
    let fixed = batcher(&rt, &loader, FlushPolicy::FixedDelay);

    let mut g = c.benchmark_group("throughput");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for callers in [1usize, 16, 300] {
        let total = if callers == 1 { 3_000 } else { 30_000 };
        let per_caller = total / callers;
        g.throughput(Throughput::Elements((per_caller * callers) as u64));

        let l = loader.clone();
        g.bench_function(BenchmarkId::new("direct", callers), |b| {
            b.to_async(&rt).iter(|| {
                let l = l.clone();
                round(callers, per_caller, move |k| {
                    let l = l.clone();
                    async move {
                        black_box(l.load(vec![k]).await.ok());
                    }
                })
            });
        });
        for (name, b8r) in [("batcher-eager", &eager), ("batcher-fixed-delay", &fixed)] {
            // A fixed 0.5 ms delay with one caller is 2,000 keys/s at best:
            // measure it at the concurrency where it batches.
            if callers == 1 && name == "batcher-fixed-delay" {
                continue;
            }
            // At 16 callers the fixed delay caps throughput near 10,000
            // keys/s; keep one iteration well under a second.
            let per_caller = if name == "batcher-fixed-delay" && callers == 16 {
                100
            } else {
                per_caller
            };
            g.throughput(Throughput::Elements((per_caller * callers) as u64));
            g.bench_function(BenchmarkId::new(name, callers), |b| {
                b.to_async(&rt).iter(|| {
                    let b8r = b8r.clone();
                    round(callers, per_caller, move |k| {
                        let b8r = b8r.clone();
                        async move {
                            black_box(b8r.load(k).await.ok());
                        }
                    })
                });
            });
        }
    }
    g.finish();
}

/// One caller, one request at a time: the latency the batcher adds.
fn single_caller_latency(c: &mut Criterion) {
    let rt = runtime();
    let loader = MemLoader::new(ROWS);
    let eager = batcher(&rt, &loader, FlushPolicy::Eager);

    let mut g = c.benchmark_group("single_caller");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(1));
    let l = loader.clone();
    g.bench_function("direct", |b| {
        b.iter_custom(|iters| {
            let l = l.clone();
            time_sequential(&rt, iters, move |k| {
                let l = l.clone();
                async move {
                    black_box(l.load(vec![k % ROWS]).await.ok());
                }
            })
        });
    });
    g.bench_function("batcher-eager", |b| {
        b.iter_custom(|iters| {
            let b8r = eager.clone();
            time_sequential(&rt, iters, move |k| {
                let b8r = b8r.clone();
                async move {
                    black_box(b8r.load(k % ROWS).await.ok());
                }
            })
        });
    });
    g.finish();
}

criterion_group!(benches, throughput, single_caller_latency);
criterion_main!(benches);
