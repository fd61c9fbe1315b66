//! lakeFS's own stat load test, `lakectl abuse random-read`, reproduced
//! with wrk (lakectl's Go module is not served here): keys read from a
//! file, each request a stat of one picked uniformly with replacement, from
//! `--connections` workers; the rate and lakectl's latency histogram
//! (cumulative counts within 1, 2, 5, ... 5000 ms). It runs through the
//! lakeFS-compatible route (`/lakefs/.../refs/main/objects/stat`, Basic
//! credentials, as lakectl sends them) beside the service's own stat route,
//! and also pages of 1,000 objects listed under a random directory
//! (`/lakefs/.../objects/ls`), in interleaved rounds.
//!
//! ```text
//! cargo run --release -p benches --bin randomread             # 1M objects
//! cargo run --release -p benches --bin randomread -- --smoke  # seconds, for CI
//! ```

use std::io::Write as _;
use std::process::Stdio;

use anyhow::{bail, Context as _};
use base64::Engine as _;
use benches::reads::TableArgs;
use benches::rounds::RoundArgs;
use benches::{print_markdown, Align};
use clap::Parser;
use serde_json::Value;
use server::db::Database;
use server::settings::Settings;

/// The wrk script: keys from a file, the route, a JSON summary line.
const SCRIPT: &str = include_str!("../../wrk/lakefs.lua");

/// lakectl's histogram buckets, in milliseconds.
const BUCKETS: [u32; 16] = [
    1, 2, 5, 7, 10, 15, 25, 50, 75, 100, 250, 350, 500, 750, 1000, 5000,
];

/// Reproduces `lakectl abuse random-read` against the lakeFS route.
#[derive(Debug, Parser)]
#[command(about)]
struct Args {
    #[command(flatten)]
    table: TableArgs,
    /// Demo objects (seeded into an empty `objects` table); every one's
    /// path is a key.
    #[arg(long, default_value_t = 1_000_000)]
    objects: u64,
    /// wrk's connections: lakectl's `--parallelism` (default 100).
    #[arg(long, default_value_t = 100)]
    connections: usize,
    /// wrk's threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// `--seconds` (whole: wrk's resolution) and `--rounds`.
    #[command(flatten)]
    runs: RoundArgs<u64>,
    #[command(flatten)]
    log: benches::ServerLogArgs,
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    let _logs = args.log.init()?;
    args.table.apply_smoke("randomread");
    if args.table.smoke {
        args.objects = 3_000;
        args.runs.seconds = 1;
        args.runs.rounds = 1;
        args.connections = 16;
    }
    args.table
        .with_table(|o| o, async |db| measure(&args, db).await)
        .await
}

/// One wrk run's summary.
#[derive(Debug, Clone)]
struct Run {
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
    histogram: Vec<u64>,
}

async fn measure(args: &Args, db: &Database) -> anyhow::Result<()> {
    server::domain::auth::bootstrap_admin(&db.config, Some(benches::ADMIN_TOKEN)).await?;
    let seeded = server::db::seed::seed(&db.config, args.objects, 0).await?;
    if seeded.objects.rows > 0 {
        eprintln!("seeded {} objects", seeded.objects.rows);
    }
    let mut keys = tempfile::Builder::new()
        .prefix("pgbatch-keys-")
        .tempfile()?;
    for n in 1..=args.objects {
        writeln!(keys, "{}", server::db::seed::object_path(n))?;
    }
    keys.flush()?;
    eprintln!("read a total of {} keys from key file", args.objects);
    let script = tempfile::Builder::new()
        .prefix("pgbatch-wrk-")
        .suffix(".lua")
        .tempfile()?;
    std::fs::write(script.path(), SCRIPT)?;

    let token = benches::ADMIN_TOKEN;
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{token}", server::domain::auth::token_id(token)))
    );
    let bearer = format!("Bearer {token}");
    let routes: [(&str, &str, &str); 3] = [
        ("native", "stat, this service's route", &bearer),
        ("lakefs", "statObject, lakeFS route (Basic)", &basic),
        ("list", "listObjects, 1,000 per page (Basic)", &basic),
    ];
    let (router, state) = benches::server_app(&db.config, 16, &Settings::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serve = tokio::spawn(server::http::serve::serve(
        listener,
        router,
        server::http::serve::EdgeSettings::default(),
        async {
            let _ = stopped.await;
        },
    ));
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); routes.len()];
    for round in 0..args.runs.rounds.max(1) {
        for (i, (route, name, auth)) in routes.iter().enumerate() {
            eprintln!("round {}: {name}", round + 1);
            // Warms the connections, the buffers and the token cache.
            wrk(
                args,
                script.path(),
                keys.path(),
                &url,
                auth,
                route,
                1,
                round,
            )
            .await?;
            runs[i].push(
                wrk(
                    args,
                    script.path(),
                    keys.path(),
                    &url,
                    auth,
                    route,
                    args.runs.seconds,
                    round,
                )
                .await?,
            );
        }
    }
    let _ = stop.send(());
    serve.await??;
    state.shutdown().await;

    println!(
        "\n{} objects, {} connections (lakectl's --parallelism), {} interleaved rounds of {} s; medians (range)\n",
        args.objects, args.connections, args.runs.rounds, args.runs.seconds
    );
    // Each route's median round, and the range of its rounds' rates.
    let medians: Vec<(&str, Run, (f64, f64))> = routes
        .iter()
        .zip(runs)
        .map(|((_, name, _), mut r)| {
            r.sort_by(|a, b| a.per_sec.total_cmp(&b.per_sec));
            let range = (r[0].per_sec, r[r.len() - 1].per_sec);
            (*name, r.swap_remove(r.len() / 2), range)
        })
        .collect();
    print_markdown(
        &[
            ("route", Align::Left),
            ("requests/s", Align::Right),
            ("p50 ms", Align::Right),
            ("p99 ms", Align::Right),
            ("errors", Align::Right),
        ],
        medians.iter().map(|(name, m, (lo, hi))| {
            vec![
                (*name).to_owned(),
                format!("{:.0} ({lo:.0}-{hi:.0})", m.per_sec),
                format!("{:.2}", m.p50_ms),
                format!("{:.2}", m.p99_ms),
                m.errors.to_string(),
            ]
        }),
    );
    println!(
        "\nlakectl's histogram of the median round (answers within each bound, cumulative):\n"
    );
    let columns: Vec<(&str, Align)> = std::iter::once("ms")
        .chain(medians.iter().map(|(name, _, _)| *name))
        .map(|c| (c, Align::Right))
        .collect();
    print_markdown(
        &columns,
        BUCKETS.iter().enumerate().map(|(b, bound)| {
            std::iter::once(bound.to_string())
                .chain(
                    medians
                        .iter()
                        .map(|(_, m, _)| m.histogram.get(b).copied().unwrap_or(0).to_string()),
                )
                .collect()
        }),
    );
    Ok(())
}

/// One wrk run against `url`'s `route`.
#[allow(clippy::too_many_arguments)]
async fn wrk(
    args: &Args,
    script: &std::path::Path,
    keys: &std::path::Path,
    url: &str,
    auth: &str,
    route: &str,
    seconds: u64,
    seed: usize,
) -> anyhow::Result<Run> {
    let out = tokio::process::Command::new("wrk")
        .arg(format!("-t{}", args.threads))
        .arg(format!("-c{}", args.connections))
        .arg(format!("-d{seconds}s"))
        .args(["--timeout", "10s", "-s"])
        .arg(script)
        .arg(url)
        .arg("--")
        .arg(auth)
        .arg(keys)
        .arg(route)
        .arg(seed.to_string())
        .stdin(Stdio::null())
        .output()
        .await
        .context("could not run wrk; ./scripts/ensure-bench-tools.sh installs it")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "wrk failed ({}): {stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("WRK_RESULT "))
        .with_context(|| format!("no WRK_RESULT line in wrk's output: {stdout}"))?;
    let v: Value = serde_json::from_str(line)?;
    let n = |k: &str| v[k].as_f64().unwrap_or(0.0);
    let errors = [
        "connect_errors",
        "read_errors",
        "write_errors",
        "status_errors",
        "timeouts",
    ]
    .iter()
    .map(|k| n(k) as u64)
    .sum();
    let histogram = BUCKETS
        .iter()
        .map(|b| v["histogram_ms"][b.to_string()].as_u64().unwrap_or(0))
        .collect();
    Ok(Run {
        per_sec: n("requests") / (n("duration_us") / 1e6).max(1e-9),
        p50_ms: n("p50_us") / 1e3,
        p99_ms: n("p99_us") / 1e3,
        errors,
        histogram,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_flags_keep_their_defaults() {
        let args = Args::try_parse_from(["randomread"]).expect("the defaults parse");
        let (seconds, rounds): (u64, usize) = (args.runs.seconds, args.runs.rounds);
        assert_eq!((seconds, rounds), (10, 3));
        // wrk counts whole seconds.
        assert!(Args::try_parse_from(["randomread", "--seconds", "1.5"]).is_err());
    }
}
