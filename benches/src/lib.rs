//! Shared pieces of the benchmarks: an in-memory [`Loader`] and a
//! closed-loop workload runner that records every request's latency.
//!
//! The criterion benches (`cargo bench -p benches`) measure the batcher's own
//! overhead with these; the load generator against Postgres reuses the
//! runner.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use pgbatch::{Loaded, Loader};

pub mod contender;
pub mod cpu;
pub mod dataloader;
pub mod delay_proxy;
/// A hand-written eager batcher: the baseline pgbatch's defaults must beat.
pub mod minimal;
pub mod open_loop;
pub mod reads;
pub mod rounds;

/// Logs to stderr what `RUST_LOG` asks for, nothing without it: a run can
/// show, say, the automatic limit's windows
/// (`RUST_LOG=pgbatch::batcher::limit=trace`).
pub fn log_from_env() {
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_default_env() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(false)
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// Opens the CSV file at `path` for appending (creating its directory, and
/// writing `header` when the file is new) and returns it with the current
/// Unix time, the first column of every row the load generators write.
///
/// # Errors
///
/// When the file cannot be created or written.
pub fn append_csv(path: &std::path::Path, header: &str) -> anyhow::Result<(std::fs::File, u64)> {
    use std::io::Write as _;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let new = !path.exists();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    if new {
        writeln!(f, "{header}")?;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok((f, now))
}

/// How a Markdown table column is aligned: text left, figures right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text.
    Left,
    /// Figures.
    Right,
}

/// The latency columns of a results table (see [`RunReport::latency_cells`]).
pub const LATENCY_COLUMNS: [(&str, Align); 4] = [
    ("avg ms", Align::Right),
    ("p50 ms", Align::Right),
    ("p99 ms", Align::Right),
    ("max ms", Align::Right),
];

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Prints a Markdown table: the load generators' results tables, which
/// BENCHMARKS.md quotes, all come out of this.
pub fn print_markdown<I>(columns: &[(&str, Align)], rows: I)
where
    I: IntoIterator<Item = Vec<String>>,
{
    let cells = |cells: Vec<String>| format!("| {} |", cells.join(" | "));
    println!(
        "{}",
        cells(columns.iter().map(|(c, _)| (*c).to_owned()).collect())
    );
    let rule = columns
        .iter()
        .map(|(_, a)| if *a == Align::Right { "---:" } else { "---" });
    println!("|{}|", rule.collect::<Vec<_>>().join("|"));
    for row in rows {
        assert_eq!(row.len(), columns.len(), "a row of {} cells", row.len());
        println!("{}", cells(row));
    }
}

/// A loader over an in-memory table: as cheap as a loader can be, so a
/// benchmark through it measures the batcher itself.
#[derive(Debug, Clone)]
pub struct MemLoader {
    table: Arc<HashMap<u64, u64>>,
}

impl MemLoader {
    /// A table of keys `0..rows`, each mapped to `key * 2`.
    pub fn new(rows: u64) -> Self {
        Self {
            table: Arc::new((0..rows).map(|k| (k, k * 2)).collect()),
        }
    }

    /// The lookup the loader does per key, for calling without a batcher.
    pub fn get(&self, key: u64) -> Option<u64> {
        self.table.get(&key).copied()
    }
}

impl Loader<u64, u64> for MemLoader {
    type Error = Infallible;

    async fn load(&self, keys: Vec<u64>) -> Result<Loaded<u64, u64>, Infallible> {
        // Sized up front, as a real loader would for its rows.
        let mut rows = Loaded::with_capacity(keys.len());
        rows.extend(keys.into_iter().filter_map(|k| self.get(k).map(|v| (k, v))));
        Ok(rows)
    }
}

/// The flags `cargo bench` passes to every bench target, for a bench's
/// clap `Args` to flatten. Cargo passes criterion's options to every
/// bench too, so such an `Args` also needs `#[command(ignore_errors = true)]`.
#[derive(Debug, clap::Args)]
pub struct CargoBenchFlags {
    /// A short smoke run (what `cargo bench -- --test` passes).
    #[arg(long)]
    pub test: bool,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    pub bench: bool,
}

/// The runtime every benchmark runs on: multi-thread with 2 workers, the
/// machine's core count, as a service would run.
///
/// # Panics
///
/// When the runtime cannot be built.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// The admin token of [`seeded_database`]'s databases.
pub const ADMIN_TOKEN: &str = "bench-admin-token";

/// A fresh database (the embedded test cluster, or `DATABASE_URL`),
/// migrated and seeded by the server's own code, with an admin whose token
/// is [`ADMIN_TOKEN`].
///
/// # Panics
///
/// When no database can be had: a benchmark cannot run without one.
pub async fn seeded_database(objects: u64, kv_rows: u64) -> tokio_postgres::Config {
    server::testing::seeded_database(objects, kv_rows, ADMIN_TOKEN)
        .await
        .expect("a database to benchmark against")
}

/// The server's app over `config` with `settings`, on a pool of
/// `pool_size` connections.
///
/// # Panics
///
/// When the settings are invalid.
pub fn server_app(
    config: &tokio_postgres::Config,
    pool_size: usize,
    settings: &server::settings::Settings,
) -> (axum::Router, server::AppState) {
    let state = server::AppState::connect(config, pool_size, settings).expect("valid settings");
    (server::app(state.clone()), state)
}

/// Where the server in a benchmark's process logs: its `served` line per
/// request costs CPU (BENCHMARKS.md, "Over HTTP"), so a benchmark that serves HTTP
/// logs as `pgbatch-server` does, only not onto the terminal.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerLogArgs {
    /// File the server's log lines go to, formatted as `pgbatch-server`
    /// writes them to standard error (verbosity from `RUST_LOG`, default
    /// `info`).
    #[arg(long, default_value = "/dev/null")]
    pub server_log: std::path::PathBuf,
}

impl ServerLogArgs {
    /// Sets the process's logging up as the server binary's; lines are
    /// written until the guard is dropped.
    ///
    /// # Errors
    ///
    /// When the file cannot be opened.
    pub fn init(&self) -> anyhow::Result<server::logs::LogGuard> {
        use anyhow::Context as _;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.server_log)
            .with_context(|| format!("opening {}", self.server_log.display()))?;
        Ok(server::logs::init_to(
            server::logs::Format::Text,
            false,
            file,
        ))
    }
}

/// Times `iters` sequential requests made from inside a spawned task, so
/// they run on a runtime worker, where real request handlers run. Request
/// `k` gets `k` (`0..iters`) as its argument.
///
/// # Panics
///
/// When a request panics.
pub fn time_sequential<F, Fut>(rt: &tokio::runtime::Runtime, iters: u64, request: F) -> Duration
where
    F: Fn(u64) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    rt.block_on(async move {
        tokio::spawn(async move {
            let start = Instant::now();
            for k in 0..iters {
                request(k).await;
            }
            start.elapsed()
        })
        .await
        .expect("bench task")
    })
}

/// What a closed-loop run measured.
#[derive(Debug)]
pub struct RunReport {
    /// Requests completed.
    pub requests: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Per-request latency in nanoseconds.
    pub latency: Histogram<u64>,
}

impl RunReport {
    /// Completed requests per second.
    pub fn per_sec(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    /// The `q`-quantile (`0.0..=1.0`) of latency.
    pub fn quantile(&self, q: f64) -> Duration {
        Duration::from_nanos(self.latency.value_at_quantile(q))
    }

    /// The mean latency.
    pub fn mean(&self) -> Duration {
        Duration::from_nanos(self.latency.mean() as u64)
    }

    /// The largest latency seen.
    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.latency.max())
    }

    /// Mean, p50, p99 and max in milliseconds, the cells under
    /// [`LATENCY_COLUMNS`].
    pub fn latency_cells(&self) -> [String; 4] {
        [
            self.mean(),
            self.quantile(0.5),
            self.quantile(0.99),
            self.max(),
        ]
        .map(|d| format!("{:.2}", ms(d)))
    }
}

/// One run of a read contender, as the tools comparing contenders over
/// interleaved rounds tabulate it.
#[derive(Debug, Clone, Copy)]
pub struct ReadSample {
    /// Reads per second.
    pub per_sec: f64,
    /// Median latency of a read, in milliseconds.
    pub p50_ms: f64,
    /// 99th percentile latency of a read, in milliseconds.
    pub p99_ms: f64,
    /// Keys per load (per statement, for contenders without a batcher).
    pub mean_batch: f64,
    /// CPU per read over the measured run, in µs, of this process: the
    /// batcher, the pool, the driver, the callers.
    pub client_us: f64,
    /// The same of Postgres's processes (`NaN` when they could not be
    /// read).
    pub postgres_us: f64,
}

impl ReadSample {
    /// The figures of `run`, whose loads took `mean_batch` keys each and
    /// which used `cpu`.
    pub fn new(run: &RunReport, mean_batch: f64, cpu: &cpu::CpuUse) -> Self {
        Self {
            per_sec: run.per_sec(),
            p50_ms: ms(run.quantile(0.5)),
            p99_ms: ms(run.quantile(0.99)),
            mean_batch,
            client_us: cpu::CpuUse::per_request_us(cpu.server, run.requests),
            postgres_us: cpu
                .postgres
                .map_or(f64::NAN, |pg| cpu::CpuUse::per_request_us(pg, run.requests)),
        }
    }
}

/// xorshift64*: a fast per-caller key stream; benchmark keys need to be
/// spread, not unpredictable.
#[derive(Debug, Clone)]
pub struct KeyStream(u64);

impl KeyStream {
    /// A stream seeded from `seed` (any value, zero included).
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next key in `0..range`.
    pub fn next_below(&mut self, range: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % range
    }
}

/// Runs `callers` tasks, each calling `request(key)` back to back with
/// random keys in `0..key_range` until `duration` has passed, and records
/// every request's latency. Must be called inside a multi-thread runtime.
pub async fn closed_loop<F, Fut>(
    callers: usize,
    duration: Duration,
    key_range: u64,
    request: F,
) -> RunReport
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    closed_loop_warm(callers, Duration::ZERO, duration, key_range, request).await
}

/// As [`closed_loop`], after `warmup` of the same load that is not
/// recorded: what a long-running service sees, once whatever adapts to
/// the load (an automatic concurrency limit) has.
pub async fn closed_loop_warm<F, Fut>(
    callers: usize,
    warmup: Duration,
    duration: Duration,
    key_range: u64,
    request: F,
) -> RunReport
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let start = Instant::now() + warmup;
    let stop = start + duration;
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let request = request.clone();
            tokio::spawn(async move {
                let mut keys = KeyStream::new(i as u64);
                let mut hist = new_histogram();
                let mut n = 0u64;
                loop {
                    let t0 = Instant::now();
                    if t0 >= stop {
                        break;
                    }
                    request(keys.next_below(key_range)).await;
                    if t0 >= start {
                        let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
                        hist.saturating_record(ns);
                        n += 1;
                    }
                }
                (n, hist)
            })
        })
        .collect();
    let mut latency = new_histogram();
    let mut requests = 0;
    for t in tasks {
        let (n, hist) = t.await.expect("benchmark caller panicked");
        requests += n;
        latency.add(hist).expect("histograms have the same bounds");
    }
    RunReport {
        requests,
        elapsed: start.elapsed(),
        latency,
    }
}

/// What a [`closed_loop_timeline`] run measured, interval by interval.
#[derive(Debug)]
pub struct Timeline {
    /// The length of one interval.
    pub interval: Duration,
    /// Per interval: the requests that finished in it, and their latency
    /// in nanoseconds.
    pub intervals: Vec<RunReport>,
}

/// As [`closed_loop`], recording each request in the `interval` (from the
/// start) in which it finished, for a time series of throughput and
/// latency.
pub async fn closed_loop_timeline<F, Fut>(
    callers: usize,
    duration: Duration,
    interval: Duration,
    key_range: u64,
    request: F,
) -> Timeline
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let start = Instant::now();
    let stop = start + duration;
    let buckets = (duration.as_nanos() / interval.as_nanos().max(1)) as usize + 1;
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let request = request.clone();
            tokio::spawn(async move {
                let mut keys = KeyStream::new(i as u64);
                // (interval, latency in µs): a histogram per interval per
                // caller would take far more memory.
                let mut samples: Vec<(u32, u32)> = Vec::new();
                loop {
                    let t0 = Instant::now();
                    if t0 >= stop {
                        break;
                    }
                    request(keys.next_below(key_range)).await;
                    let done = Instant::now();
                    let at = ((done - start).as_nanos() / interval.as_nanos().max(1)) as u32;
                    let us = u32::try_from((done - t0).as_micros()).unwrap_or(u32::MAX);
                    samples.push((at, us));
                }
                samples
            })
        })
        .collect();
    let mut intervals: Vec<RunReport> = (0..buckets)
        .map(|_| RunReport {
            requests: 0,
            elapsed: interval,
            latency: new_histogram(),
        })
        .collect();
    for t in tasks {
        for (at, us) in t.await.expect("benchmark caller panicked") {
            if let Some(r) = intervals.get_mut(at as usize) {
                r.requests += 1;
                r.latency.saturating_record(u64::from(us) * 1_000);
            }
        }
    }
    // The last interval is cut short by the stop.
    intervals.truncate(buckets - 1);
    Timeline {
        interval,
        intervals,
    }
}

fn new_histogram() -> Histogram<u64> {
    // 1 ns to 60 s at 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_stream_stays_in_range_and_spreads() {
        let mut s = KeyStream::new(0);
        let keys: Vec<u64> = (0..1000).map(|_| s.next_below(100)).collect();
        assert!(keys.iter().all(|&k| k < 100));
        let distinct: std::collections::HashSet<_> = keys.iter().collect();
        assert!(distinct.len() > 90, "{}", distinct.len());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn closed_loop_counts_and_records_every_request() {
        let r = closed_loop(4, Duration::from_millis(50), 10, |_| async {
            tokio::time::sleep(Duration::from_millis(1)).await;
        })
        .await;
        assert!(r.requests > 0);
        assert_eq!(r.latency.len(), r.requests);
        assert!(r.quantile(0.5) >= Duration::from_millis(1));
    }
}
