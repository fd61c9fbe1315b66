//! Cross-instance cache invalidation, measured: two
//! server instances on one database, both on the cached read path.
//!
//! 1. Invalidation delay: instance A caches an object, instance B writes
//!    it, and A is polled until its cached read path returns the new value;
//!    the delay runs from B's acknowledgement. Meanwhile B writes other
//!    objects at a steady rate, so notifications arrive under load.
//! 2. What the notifications cost writes: 300 callers upsert through B's
//!    micro-batching writer with the notification triggers enabled and
//!    disabled, interleaved rounds, in the same run.
//!
//! ```text
//! cargo run --release -p benches --bin coherence
//! cargo run --release -p benches --bin coherence -- --smoke
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use benches::rounds::RoundArgs;
use benches::{closed_loop, print_markdown, seeded_database, Align, RunReport};
use clap::Parser;
use hdrhistogram::Histogram;
use server::db::queries::objects::ObjectRow;
use server::model::objects::{ObjectKey, Stat};
use server::settings::{ReadPath, ReadSettings, Settings};
use server::AppState;

/// Measures cross-instance invalidation.
#[derive(Debug, Parser)]
#[command(
    about,
    mut_arg("seconds", |a| a.default_value("5").help("Seconds per cost run")),
    mut_arg("rounds", |a| a.help("Interleaved rounds of the cost runs"))
)]
struct Args {
    /// Objects seeded in repository `demo`.
    #[arg(long, default_value_t = 20_000)]
    objects: u64,
    /// Invalidation probes (one at a time).
    #[arg(long, default_value_t = 500)]
    probes: u64,
    /// Background writes per second through B while probing.
    #[arg(long, default_value_t = 2_000)]
    write_rate: u64,
    /// Concurrent writers in the cost runs.
    #[arg(long, default_value_t = 300)]
    callers: usize,
    #[command(flatten)]
    runs: RoundArgs,
    /// A few seconds in all, for CI: proves the tool runs.
    #[arg(long)]
    smoke: bool,
}

fn row(i: u64, address: &str) -> ObjectRow {
    ObjectRow {
        repository: "demo".to_owned(),
        path: format!("coherence/{i:09}"),
        physical_address: address.to_owned(),
        size_bytes: 1,
        checksum: "c".to_owned(),
        content_type: "application/octet-stream".to_owned(),
        metadata: serde_json::json!({}),
        mtime: None,
    }
}

fn address(stat: Option<Stat>) -> Option<String> {
    match stat {
        Some(Stat {
            object: Some(s), ..
        }) => Some(s.physical_address.clone()),
        _ => None,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        (args.objects, args.probes) = (1_000, 20);
        (args.runs.seconds, args.runs.rounds) = (0.3, 1);
    }
    let config = seeded_database(args.objects, 0).await;
    let settings = Settings {
        read: ReadSettings {
            path: ReadPath::Cached,
            ..ReadSettings::default()
        },
        ..Settings::default()
    };
    let a = AppState::connect(&config, 8, &settings)?;
    let b = AppState::connect(&config, 8, &settings)?;
    for s in [&a, &b] {
        let start = Instant::now();
        while s.coherence.connects() == 0 {
            anyhow::ensure!(start.elapsed() < Duration::from_secs(10), "no listener");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    println!(
        "PostgreSQL {}",
        benches::reads::server_version(&config).await?
    );
    let delays = probe_delays(&a, &b, &args).await?;
    let q = |q: f64| Duration::from_nanos(delays.value_at_quantile(q)).as_secs_f64() * 1e3;
    println!(
        "\n### Invalidation delay, B's write acknowledged to A's cached read seeing it\n\n\
         {} probes, B writing {} other objects/s meanwhile, {} objects\n",
        delays.len(),
        args.write_rate,
        args.objects,
    );
    print_markdown(
        &[
            ("p50 ms", Align::Right),
            ("p90 ms", Align::Right),
            ("p99 ms", Align::Right),
            ("max ms", Align::Right),
        ],
        [[
            q(0.5),
            q(0.9),
            q(0.99),
            Duration::from_nanos(delays.max()).as_secs_f64() * 1e3,
        ]
        .map(|ms| format!("{ms:.2}"))
        .to_vec()],
    );

    write_cost(&b, &config, &args).await?;
    a.shutdown().await;
    b.shutdown().await;
    Ok(())
}

/// Probes one key at a time while a background task writes others.
async fn probe_delays(a: &AppState, b: &AppState, args: &Args) -> anyhow::Result<Histogram<u64>> {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let background = {
        let writes = b.writes.clone();
        let stop = Arc::clone(&stop);
        let every = Duration::from_secs_f64(1.0 / args.write_rate.max(1) as f64);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut i = 1_000_000u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tick.tick().await;
                i += 1;
                let writes = writes.clone();
                // Not awaited here, so a slow write does not lower the rate.
                tokio::spawn(async move {
                    let _ = writes.put(row(i % 1_000_000 + 1_000_000, "s3://bg")).await;
                });
            }
        })
    };
    let mut hist = Histogram::<u64>::new(3)?;
    for i in 0..args.probes {
        let key = ObjectKey {
            repository: "demo".to_owned(),
            path: format!("coherence/{i:09}"),
        };
        b.writes.put(row(i, "s3://old")).await?;
        // Cached in A (after B's write has reached it).
        while address(a.reads.object_stat.get(key.clone()).await?).as_deref() != Some("s3://old") {
            tokio::task::yield_now().await;
        }
        let new = format!("s3://new/{i}");
        b.writes.put(row(i, &new)).await?;
        let acked = Instant::now();
        // Polled without sleeping: tokio's timers would round to 1 ms.
        while address(a.reads.object_stat.get(key.clone()).await?).as_deref() != Some(&new) {
            anyhow::ensure!(
                acked.elapsed() < Duration::from_secs(10),
                "A never saw probe {i}"
            );
            tokio::task::yield_now().await;
        }
        hist.record(u64::try_from(acked.elapsed().as_nanos()).unwrap_or(u64::MAX))?;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    background.await?;
    Ok(hist)
}

/// Upserts through B's writer with the triggers on and off, interleaved.
async fn write_cost(
    b: &AppState,
    config: &tokio_postgres::Config,
    args: &Args,
) -> anyhow::Result<()> {
    let (client, conn) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let run = Duration::from_secs_f64(args.runs.seconds);
    let mut results: Vec<(&str, RunReport)> = Vec::new();
    for _ in 0..args.runs.rounds {
        for (label, action) in [
            ("notifications on", "ENABLE"),
            ("notifications off", "DISABLE"),
        ] {
            client
                .batch_execute(&format!("ALTER TABLE objects {action} TRIGGER USER"))
                .await?;
            let writes = b.writes.clone();
            let report = closed_loop(args.callers, run, 1_000_000, move |k| {
                let writes = writes.clone();
                async move {
                    let _ = writes.put(row(k + 2_000_000, "s3://cost")).await;
                }
            })
            .await;
            results.push((label, report));
        }
    }
    client
        .batch_execute("ALTER TABLE objects ENABLE TRIGGER USER")
        .await?;
    println!(
        "\n### Micro-batched upserts through one instance, {} callers, {:.1} s per run\n",
        args.callers, args.runs.seconds
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    print_markdown(
        &[
            ("run", Align::Left),
            ("upserts/s", Align::Right),
            ("p50 ms", Align::Right),
            ("p99 ms", Align::Right),
        ],
        results.iter().map(|(label, r)| {
            vec![
                (*label).to_owned(),
                format!("{:.0}", r.per_sec()),
                format!("{:.2}", ms(r.quantile(0.5))),
                format!("{:.2}", ms(r.quantile(0.99))),
            ]
        }),
    );
    let median_of = |label: &str| {
        let v: Vec<f64> = results
            .iter()
            .filter(|(l, _)| *l == label)
            .map(|(_, r)| r.per_sec())
            .collect();
        benches::rounds::median(&v)
    };
    let (on, off) = (
        median_of("notifications on"),
        median_of("notifications off"),
    );
    println!(
        "\nmedian upserts/s: {on:.0} with notifications, {off:.0} without: {:.2}x",
        on / off
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_flags_keep_their_defaults() {
        let args = Args::try_parse_from(["coherence"]).expect("the defaults parse");
        let (seconds, rounds): (f64, usize) = (args.runs.seconds, args.runs.rounds);
        assert_eq!((seconds, rounds), (5.0, 3));
    }
}
