//! The HTTP benchmark: wrk drives the server's `GET /api/v1/kv/{pk}` with
//! random keys on the naive, batched and cached read paths, and
//! `GET /api/v1/user`, a route that does no database work once the token is
//! cached. That route is the ceiling (the lakeFS method: start from an empty
//! handler), and each read path is printed as a fraction of it. Below it,
//! `bare` serves the same JSON from a bare axum route (no middleware, no
//! token, nothing else in the router): the floor of what axum and hyper
//! cost here, which the authenticated route is judged against.
//!
//! The server runs in this process on its own router and pool, over the
//! same `random_read_test` table as the in-process load generator; wrk runs
//! as a separate process (`./scripts/ensure-bench-tools.sh` installs it).
//! All of them share the machine's cores, so each run also reports the CPU
//! time per request of the server (this process), of wrk and of Postgres,
//! and the share of the machine left idle ([`benches::cpu`]): while nothing
//! is idle, a route's throughput against another's is the inverse of their
//! total CPU per request, and these columns say where the difference is.
//!
//! ```text
//! cargo run --release -p benches --bin httpload             # 10M rows, 300 connections
//! cargo run --release -p benches --bin httpload -- --smoke  # seconds, for CI
//! ```

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{bail, Context as _};
use benches::cpu::{CpuSnapshot, CpuUse};
use benches::reads::TableArgs;
use benches::rounds::RoundArgs;
use benches::{
    print_markdown,
    Align::{Left, Right},
};
use clap::{Parser, ValueEnum as _};
use serde_json::Value;
use server::cli::{ConcurrencyArg, PolicyArg};
use server::db::Database;
use server::settings::{defaults, BatchSettings, ReadPath, ReadSettings, Settings};

/// The wrk script: random keys, the token, and a JSON summary line.
const SCRIPT: &str = include_str!("../../wrk/read.lua");

/// Drives the server's read paths over HTTP with wrk.
#[derive(Debug, Parser)]
#[command(
    about,
    mut_arg("seconds", |a| a.help("Seconds per run (whole seconds: wrk's resolution)")),
    mut_arg("rounds", |a| a.help(
        "Rounds of all runs. The table shows each path's median round and \
         the range, so a noisy moment on a shared machine moves one round, \
         not the verdict; the rounds interleave, so drift hits every path"
    ))
)]
struct Args {
    #[command(flatten)]
    table: TableArgs,
    /// wrk's open connections (each one request at a time: the initiators).
    #[arg(long, default_value_t = 300)]
    connections: usize,
    /// wrk's threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// `--seconds` (whole: wrk's resolution) and `--rounds`.
    #[command(flatten)]
    runs: RoundArgs<u64>,
    /// Keys of the hot-set run of the cached path (they fit in its cache).
    #[arg(long, default_value_t = 50_000)]
    hot_keys: u64,
    /// The server's `--batch-policy` for the batched and cached paths.
    #[arg(long, value_enum, default_value_t = PolicyArg::of(defaults::BATCH_POLICY).expect("every policy has a flag"))]
    batch_policy: PolicyArg,
    /// The server's batched statements at once: `auto` (its default,
    /// found by measurement up to `--pool-size`), or a fixed number.
    #[arg(long, default_value = "auto")]
    batch_concurrency: ConcurrencyArg,
    /// Runs to make, of: bare (the same JSON from a bare axum route), user
    /// (the no-database ceiling), naive, batched, cached, hot (cached, hot
    /// keys).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "bare,user,naive,batched,cached,hot"
    )]
    only: Vec<Run>,
    /// The server's pool size.
    #[arg(long, default_value_t = 16)]
    pool_size: usize,
    /// CSV file results are appended to.
    #[arg(long, default_value = "target/loadgen/http.csv")]
    csv: PathBuf,
    #[command(flatten)]
    log: benches::ServerLogArgs,
}

/// What one wrk run measured (latencies in microseconds).
#[derive(Debug)]
struct WrkResult {
    requests: u64,
    seconds: f64,
    errors: u64,
    mean_us: f64,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    /// CPU time spent during the run, by process.
    cpu: Option<CpuUse>,
}

impl WrkResult {
    fn per_sec(&self) -> f64 {
        self.requests as f64 / self.seconds
    }
}

/// One row of results.
struct Outcome {
    path: &'static str,
    keys: String,
    /// The median round.
    result: WrkResult,
    /// Requests/s of the slowest and fastest rounds.
    range: (f64, f64),
}

/// The allocator the server binary uses, so the server in this process
/// measures what `pgbatch-server` ships.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    let _logs = args.log.init()?;
    args.table.apply_smoke("httpload");
    if args.table.smoke {
        args.runs.seconds = 1;
        args.connections = 16;
        args.hot_keys = 1_000;
        args.runs.rounds = 1;
    }
    args.table
        .with_table(|o| o, async |db| measure(&args, db).await)
        .await
}

async fn measure(args: &Args, db: &Database) -> anyhow::Result<()> {
    // With users present this only makes sure the bench token is an admin's.
    server::domain::auth::bootstrap_admin(&db.config, Some(benches::ADMIN_TOKEN)).await?;
    let script = tempfile::Builder::new()
        .prefix("pgbatch-wrk-")
        .suffix(".lua")
        .tempfile()?;
    std::fs::write(script.path(), SCRIPT)?;

    let all = args.table.rows;
    let mut results = Vec::new();
    // (name, path, read path, route, keys). Each run is warmed up first:
    // Postgres's buffers, the server's caches and wrk's connections.
    // The read path `None`: the bare route.
    let runs: [(Run, &'static str, Option<ReadPath>, &str, u64); 6] = [
        (Run::Bare, BARE, None, "user", 1),
        (
            Run::User,
            "no database (GET /api/v1/user)",
            Some(ReadPath::Naive),
            "user",
            1,
        ),
        (Run::Naive, "naive", Some(ReadPath::Naive), "kv", all),
        (Run::Batched, "batched", Some(ReadPath::Batched), "kv", all),
        (Run::Cached, "cached", Some(ReadPath::Cached), "kv", all),
        (
            Run::Hot,
            "cached, hot keys",
            Some(ReadPath::Cached),
            "kv",
            args.hot_keys,
        ),
    ];
    let runs: Vec<_> = runs
        .into_iter()
        .filter(|r| args.only.contains(&r.0))
        .collect();
    let mut rounds: Vec<Vec<WrkResult>> = runs.iter().map(|_| Vec::new()).collect();
    for round in 0..args.runs.rounds.max(1) {
        for (i, &(_, path, read_path, route, keys)) in runs.iter().enumerate() {
            eprintln!("round {}/{}: {path}", round + 1, args.runs.rounds.max(1));
            let seed = round * runs.len() + i;
            let result =
                serve_and_drive(args, db, script.path(), read_path, route, keys, seed).await?;
            append_csv(
                &args.csv,
                round,
                path,
                &keys_label(route, keys),
                &result,
                args,
            )?;
            rounds[i].push(result);
        }
    }
    for (&(_, path, _, route, keys), mut results_of) in runs.iter().zip(rounds) {
        results_of.sort_by(|a, b| a.per_sec().total_cmp(&b.per_sec()));
        let range = (
            results_of[0].per_sec(),
            results_of[results_of.len() - 1].per_sec(),
        );
        let result = results_of.swap_remove(results_of.len() / 2);
        results.push(Outcome {
            path,
            keys: keys_label(route, keys),
            result,
            range,
        });
    }
    print_table(&results, args);
    eprintln!("appended every round to {}", args.csv.display());
    Ok(())
}

/// The policy as its flag spells it (`adaptive`, `fixed-delay`).
fn policy_name(policy: PolicyArg) -> String {
    policy
        .to_possible_value()
        .map_or_else(|| format!("{policy:?}"), |v| v.get_name().to_owned())
}

fn keys_label(route: &str, keys: u64) -> String {
    if route == "user" {
        "-".to_owned()
    } else {
        format!("uniform in {keys}")
    }
}

/// The runs `--only` chooses from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Run {
    /// The same JSON from a bare axum route: the floor.
    Bare,
    /// The authenticated no-database route.
    User,
    /// One statement per read.
    Naive,
    /// Batched reads.
    Batched,
    /// Cached reads, uniform keys.
    Cached,
    /// Cached reads, hot keys.
    Hot,
}

/// The bare route's row.
const BARE: &str = "bare axum route (same JSON, no layers)";

/// A router with one route, `GET /api/v1/user`, that answers what `app`'s
/// answers the admin, with nothing around it: no layer, no extractor, no
/// state. The floor of the HTTP stack's own cost per request.
async fn bare_router(app: axum::Router) -> anyhow::Result<axum::Router> {
    use tower::ServiceExt as _;
    let req = axum::http::Request::get("/api/v1/user")
        .header("authorization", format!("Bearer {}", benches::ADMIN_TOKEN))
        .body(axum::body::Body::empty())?;
    let res = app.oneshot(req).await?;
    anyhow::ensure!(
        res.status().is_success(),
        "GET /api/v1/user: {}",
        res.status()
    );
    let body = axum::body::to_bytes(res.into_body(), 1 << 20).await?;
    Ok(axum::Router::new().route(
        "/api/v1/user",
        axum::routing::get(move || {
            let body = body.clone();
            async move {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    body,
                )
            }
        }),
    ))
}

/// Serves the app with reads through `read_path` on a fresh port (`None`:
/// [`bare_router`]), warms it up, and drives it with wrk once.
async fn serve_and_drive(
    args: &Args,
    db: &Database,
    script: &Path,
    read_path: Option<ReadPath>,
    route: &str,
    keys: u64,
    seed: usize,
) -> anyhow::Result<WrkResult> {
    let settings = Settings {
        read: ReadSettings {
            path: read_path.unwrap_or(ReadPath::Naive),
            batch: BatchSettings {
                policy: args.batch_policy.into(),
                concurrency: args.batch_concurrency.0,
                ..BatchSettings::default()
            },
            timeout: std::time::Duration::from_secs(5),
            ..ReadSettings::default()
        },
        ..Settings::default()
    };
    let (router, state) = benches::server_app(&db.config, args.pool_size, &settings);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stopped = async {
        let _ = stopped.await;
    };
    // The app's routes are served by the server's own edge, as
    // `pgbatch-server` serves them (its limits, body draining and lingering
    // close included); the bare route by `axum::serve`, the floor.
    let serve = match read_path {
        None => {
            let router = bare_router(router).await?;
            tokio::spawn(async move {
                axum::serve(listener, router)
                    .with_graceful_shutdown(stopped)
                    .await
            })
        }
        Some(_) => tokio::spawn(server::http::serve::serve(
            listener,
            router,
            server::http::serve::EdgeSettings::default(),
            stopped,
        )),
    };
    let warm_up = if args.table.smoke { 1 } else { 3 };
    wrk(args, script, &url, route, keys, warm_up, seed).await?;
    let before = state.reads.kv.batcher_stats();
    let cluster = db.cluster.as_ref();
    let cpu_before = CpuSnapshot::take(cluster);
    let mut result = wrk(args, script, &url, route, keys, args.runs.seconds, seed).await?;
    let cpu = CpuSnapshot::take(cluster).since(&cpu_before);
    eprintln!("  {route}: {}", cpu.describe(result.requests));
    result.cpu = Some(cpu);
    // How well the run batched: the database's cost per key depends on it.
    if let (Some(a), Some(b)) = (before, state.reads.kv.batcher_stats()) {
        let loaded = |s: &pgbatch::StatsSnapshot| s.found + s.not_found + s.failed_keys;
        let (batches, loaded) = (b.batches - a.batches, loaded(&b) - loaded(&a));
        if batches > 0 {
            eprintln!(
                "  {route}: {batches} batches, {:.1} keys per batch, {} loads at once at the end",
                loaded as f64 / batches as f64,
                b.concurrency_limit
            );
        }
    }
    let _ = stop.send(());
    serve.await?.context("server")?;
    Ok(result)
}

/// Runs wrk once and reads its summary line.
async fn wrk(
    args: &Args,
    script: &Path,
    url: &str,
    route: &str,
    keys: u64,
    seconds: u64,
    seed: usize,
) -> anyhow::Result<WrkResult> {
    let out = tokio::process::Command::new("wrk")
        .arg(format!("-t{}", args.threads))
        .arg(format!("-c{}", args.connections))
        .arg(format!("-d{seconds}s"))
        .args(["--timeout", "10s", "-s"])
        .arg(script)
        .arg(url)
        .args(["--", benches::ADMIN_TOKEN, route, &keys.to_string()])
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
    let v: Value = serde_json::from_str(line).context("wrk's summary line")?;
    let num = |k: &str| v[k].as_f64().unwrap_or(0.0);
    let result = WrkResult {
        requests: num("requests") as u64,
        seconds: num("duration_us") / 1e6,
        errors: [
            "connect_errors",
            "read_errors",
            "write_errors",
            "status_errors",
            "timeouts",
        ]
        .iter()
        .map(|k| num(k) as u64)
        .sum(),
        mean_us: num("mean_us"),
        p50_us: num("p50_us"),
        p99_us: num("p99_us"),
        max_us: num("max_us"),
        cpu: None,
    };
    if result.requests == 0 {
        bail!("wrk completed no requests: {stdout}");
    }
    Ok(result)
}

fn print_table(results: &[Outcome], args: &Args) {
    let ceiling = results
        .iter()
        .find(|o| o.path.starts_with("no database"))
        .map_or(f64::NAN, |o| o.result.per_sec());
    println!(
        "\n{} rows; wrk: {} threads, {} connections, {} s per run, {} rounds; batch policy {}\n",
        args.table.rows,
        args.threads,
        args.connections,
        args.runs.seconds,
        args.runs.rounds.max(1),
        policy_name(args.batch_policy)
    );
    let share = |per_sec: f64| {
        if ceiling.is_nan() {
            "-".to_owned()
        } else {
            format!("{:.0}%", 100.0 * per_sec / ceiling)
        }
    };
    let columns = [
        ("path", Left),
        ("keys", Left),
        ("requests/s (median)", Right),
        ("range of rounds", Right),
        ("of no-database ceiling", Right),
        ("avg ms", Right),
        ("p50 ms", Right),
        ("p99 ms", Right),
        ("max ms", Right),
        ("errors", Right),
        ("server CPU µs/req", Right),
        ("Postgres CPU µs/req", Right),
        ("wrk CPU µs/req", Right),
        ("idle", Right),
    ];
    print_markdown(
        &columns,
        results.iter().map(|o| {
            let r = &o.result;
            vec![
                o.path.to_owned(),
                o.keys.to_string(),
                format!("{:.0}", r.per_sec()),
                format!("{:.0}-{:.0}", o.range.0, o.range.1),
                share(r.per_sec()),
                format!("{:.2}", r.mean_us / 1e3),
                format!("{:.2}", r.p50_us / 1e3),
                format!("{:.2}", r.p99_us / 1e3),
                format!("{:.2}", r.max_us / 1e3),
                r.errors.to_string(),
            ]
            .into_iter()
            .chain(cpu_cells(r))
            .collect()
        }),
    );
    let share_of = |path: &str| {
        results
            .iter()
            .find(|o| o.path == path)
            .map(|o| o.result.per_sec() / ceiling)
    };
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    println!();
    // The authenticated no-database route against the bare one.
    if let Some(bare) = results.iter().find(|o| o.path == BARE) {
        let got = ceiling / bare.result.per_sec();
        if !got.is_nan() {
            println!(
                "target: no database at least 70% of the bare route: {} ({:.0}%)",
                verdict(got >= 0.7),
                got * 100.0
            );
        }
    }
    // The goals: batched and hot keys against the no-database
    // route, uniform keys through the cache against batched.
    for (path, goal) in [("cached, hot keys", 0.9), ("batched", 0.75)] {
        let Some(got) = share_of(path).filter(|g| !g.is_nan()) else {
            continue;
        };
        println!(
            "target: {path} at least {:.0}% of the no-database ceiling: {} ({:.0}%)",
            goal * 100.0,
            verdict(got >= goal),
            got * 100.0
        );
    }
    if let (Some(cached), Some(batched)) = (share_of("cached"), share_of("batched")) {
        let got = cached / batched;
        if !got.is_nan() {
            println!(
                "target: cached (uniform keys) at least 0.95x batched: {} ({:.2}x)",
                verdict(got >= 0.95),
                got
            );
        }
    }
    if results.iter().any(|o| o.result.errors > 0) {
        println!("warning: some requests failed (see the errors column)");
    }
}

/// The CPU columns of a run: server, Postgres and wrk per request, and
/// the idle share; `-` where not measured.
fn cpu_cells(r: &WrkResult) -> [String; 4] {
    let us = |d: Option<std::time::Duration>| {
        d.map_or_else(
            || "-".to_owned(),
            |d| format!("{:.1}", CpuUse::per_request_us(d, r.requests)),
        )
    };
    let cpu = r.cpu.as_ref();
    [
        us(cpu.map(|c| c.server)),
        us(cpu.and_then(|c| c.postgres)),
        us(cpu.map(|c| c.load)),
        cpu.and_then(|c| c.idle)
            .map_or_else(|| "-".to_owned(), |i| format!("{:.0}%", i * 100.0)),
    ]
}

fn append_csv(
    path: &Path,
    round: usize,
    run: &str,
    keys: &str,
    r: &WrkResult,
    args: &Args,
) -> anyhow::Result<()> {
    let (mut f, now) = benches::append_csv(
        path,
        "unix_time,rows,connections,seconds,batch_policy,round,path,keys,requests_per_sec,avg_ms,p50_ms,p99_ms,max_ms,errors",
    )?;
    writeln!(
        f,
        "{now},{},{},{},{},{round},\"{run}\",{keys},{:.0},{:.3},{:.3},{:.3},{:.3},{}",
        args.table.rows,
        args.connections,
        args.runs.seconds,
        policy_name(args.batch_policy),
        r.per_sec(),
        r.mean_us / 1e3,
        r.p50_us / 1e3,
        r.p99_us / 1e3,
        r.max_us / 1e3,
        r.errors
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_flags_keep_their_defaults() {
        let args = Args::try_parse_from(["httpload"]).expect("the defaults parse");
        let (seconds, rounds): (u64, usize) = (args.runs.seconds, args.runs.rounds);
        assert_eq!((seconds, rounds), (10, 3));
        // wrk counts whole seconds.
        assert!(Args::try_parse_from(["httpload", "--seconds", "1.5"]).is_err());
    }
}
