//! The seed benchmark's read paths against `random_read_test`, shared by
//! the load generators: the table's rows, each read path as a closed-loop
//! run, and the database's bulk ceiling.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::net::SocketAddr;

use anyhow::{bail, Context as _};
use embedded_pg::ClusterOptions;
use pgbatch::cache::Admission;
use pgbatch::pg::copy;
use pgbatch::pg::{BatchQuery, Pool};
use server::cluster::replicas::ReadRouter;
use server::db::queries::kv::{kv_pk, KvQuery, KvRows, KV_COLUMNS, KV_TABLE};
use server::db::queries::system::count_rows;
use server::db::Database;
use server::domain::lookup::Lookup;
use server::settings::{BatchSettings, CacheSettings, DbSettings, ReadPath, ReadSettings};
use tokio_postgres::NoTls;

use crate::minimal::MinimalBatcher;
use crate::{closed_loop, closed_loop_warm, KeyStream, RunReport};

/// The flags every load generator shares: which table, on which database.
/// Each tool flattens these into its own flags.
#[derive(Debug, clap::Args)]
pub struct TableArgs {
    /// Rows in `random_read_test` (added with COPY when fewer exist).
    #[arg(long, default_value_t = 10_000_000)]
    pub rows: u64,
    /// A Postgres to use instead of the embedded one.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Directory of the embedded cluster (kept, so rows are loaded once).
    /// A cluster only starts with the major version that made it, so
    /// `scripts/bench.sh` names one per version.
    #[arg(long, env = "PGBATCH_BENCH_DATA_DIR", default_value = ".data/bench-pg")]
    pub data_dir: PathBuf,
    /// A seconds-long run on a small table (CI's proof that it works).
    #[arg(long)]
    pub smoke: bool,
}

impl TableArgs {
    /// With `--smoke`: a 20,000-row table in a throwaway cluster named after
    /// `tool`, which [`with_table`](Self::with_table) removes afterwards.
    /// Always a throwaway one, so a smoke run never removes a kept cluster.
    pub fn apply_smoke(&mut self, tool: &str) {
        if !self.smoke {
            return;
        }
        self.rows = 20_000;
        self.data_dir = std::env::temp_dir().join(format!("pgbatch-{tool}-{}", std::process::id()));
    }

    /// Opens the database (the embedded cluster with its buffers sized for
    /// the table, and `customize` applied to its options), migrates it,
    /// tops up and prewarms the table, runs `measure`, and closes the
    /// database again, removing a smoke run's throwaway cluster.
    ///
    /// # Errors
    ///
    /// When the database cannot be set up, or `measure` fails.
    pub async fn with_table<T>(
        &self,
        customize: impl FnOnce(ClusterOptions) -> ClusterOptions,
        measure: impl AsyncFnOnce(&Database) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let db = Database::open_with(
            &DbSettings {
                url: self.database_url.clone(),
                data_dir: self.data_dir.clone(),
                ..DbSettings::default()
            },
            |options| customize(options.setting("shared_buffers", SHARED_BUFFERS)),
        )
        .await?;
        let result = async {
            server::db::migrate(&db.config).await?;
            ensure_rows(&db.config, self.rows).await?;
            prewarm(&db.config).await?;
            // Every table a run prints is about this server.
            println!("PostgreSQL {}\n", server_version(&db.config).await?);
            measure(&db).await
        }
        .await;
        db.close().await;
        if self.smoke {
            // A throwaway cluster, and the server log beside it.
            let _ = std::fs::remove_dir_all(&self.data_dir);
            let _ = std::fs::remove_file(self.data_dir.with_extension("log"));
        }
        result
    }
}

/// The server's version, as `SHOW server_version` gives it.
///
/// # Errors
///
/// When the database cannot be reached.
pub async fn server_version(config: &tokio_postgres::Config) -> anyhow::Result<String> {
    let (client, conn) = config.connect(NoTls).await?;
    tokio::spawn(conn);
    Ok(client
        .query_one("SHOW server_version", &[])
        .await?
        .get::<_, String>(0))
}

/// The primary key of the `k`-th row (`k` in `0..rows`; rows are numbered
/// from 1).
pub fn key(k: u64) -> String {
    kv_pk(k + 1)
}

/// Tops `random_read_test` up to `rows` rows (numbered from 1) with COPY,
/// then freezes and analyses it.
///
/// # Errors
///
/// When the database fails.
pub async fn ensure_rows(config: &tokio_postgres::Config, rows: u64) -> anyhow::Result<()> {
    let (mut client, conn) = config.connect(NoTls).await?;
    tokio::spawn(conn);
    let have = count_rows(&client, KV_TABLE).await?;
    if have >= rows {
        return Ok(());
    }
    eprintln!("loading rows {}..={rows} into {KV_TABLE}", have + 1);
    let start = Instant::now();
    let tx = client.transaction().await?;
    let source = KvRows::new(have + 1..=rows);
    copy::copy_rows(&tx, KV_TABLE, &KV_COLUMNS, source, false, |_| {})
        .await
        .context("COPY")?;
    tx.commit().await?;
    eprintln!(
        "loaded {} rows in {:.1} s; vacuuming",
        rows - have,
        start.elapsed().as_secs_f64()
    );
    // Frozen, analysed and with a visibility map, reads do not write.
    client
        .batch_execute(&format!("VACUUM (FREEZE, ANALYZE) {KV_TABLE}"))
        .await?;
    Ok(())
}

/// Shared buffers for the benchmark cluster: room for all of
/// `random_read_test` (10M rows: about 1.3 GB of heap and 0.4 GB of index).
/// At Postgres's default 128 MB, most random reads miss and copy a page
/// from the kernel's cache with a `pread`, which a profile showed as a
/// fifth of the server's CPU time.
pub const SHARED_BUFFERS: &str = "3GB";

/// Loads `random_read_test` and its index into shared buffers with
/// `pg_prewarm`, so every run starts warm rather than the first one paying
/// for the misses. Skipped, with a message, where the extension is missing.
///
/// # Errors
///
/// When the database fails for another reason.
pub async fn prewarm(config: &tokio_postgres::Config) -> anyhow::Result<()> {
    let (client, conn) = config.connect(NoTls).await?;
    tokio::spawn(conn);
    if let Err(e) = client
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
        .await
    {
        eprintln!("pg_prewarm is not available ({e}); runs start with cold buffers");
        return Ok(());
    }
    let start = Instant::now();
    let pages: i64 = client
        .query_one(
            "SELECT pg_prewarm('random_read_test') + pg_prewarm('random_read_test_pkey')",
            &[],
        )
        .await?
        .get(0);
    eprintln!(
        "prewarmed {pages} pages ({} MiB) in {:.1} s",
        pages * 8 / 1024,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Keys per second of back-to-back `= ANY($1)` queries of `keys` random
/// keys on `connections` connections: what the database itself can serve.
///
/// # Errors
///
/// When a connection cannot be made or a query fails: the ceiling is
/// meaningless then.
pub async fn ceiling(
    config: &tokio_postgres::Config,
    connections: usize,
    keys: usize,
    rows: u64,
    run: Duration,
) -> anyhow::Result<f64> {
    statement_rate(
        config,
        "",
        KvQuery.batch_sql(),
        connections,
        keys,
        rows,
        run,
    )
    .await
}

/// The batched read statements compared by `loadgen --only statements`:
/// a name, what each connection runs first, and the statement, which
/// takes the keys as `$1::text[]`.
pub const STATEMENTS: [(&str, &str, &str); 4] = [
    (
        "= ANY($1)",
        "",
        "SELECT pk, payload FROM random_read_test WHERE pk = ANY($1)",
    ),
    (
        "= ANY($1), generic plan",
        "SET plan_cache_mode = force_generic_plan",
        "SELECT pk, payload FROM random_read_test WHERE pk = ANY($1)",
    ),
    (
        "= ANY($1), custom plans",
        "SET plan_cache_mode = force_custom_plan",
        "SELECT pk, payload FROM random_read_test WHERE pk = ANY($1)",
    ),
    (
        "unnest($1) join",
        "",
        "SELECT t.pk, t.payload FROM unnest($1::text[]) AS k(pk) \
         JOIN random_read_test t ON t.pk = k.pk",
    ),
];

/// Keys found per second by back-to-back runs of `sql` with `keys` random
/// keys each, on `connections` connections of their own (each first runs
/// `setup`).
///
/// # Errors
///
/// When a connection cannot be made or a query fails.
pub async fn statement_rate(
    config: &tokio_postgres::Config,
    setup: &str,
    sql: &str,
    connections: usize,
    keys: usize,
    rows: u64,
    run: Duration,
) -> anyhow::Result<f64> {
    let mut clients = Vec::with_capacity(connections);
    for _ in 0..connections {
        let (client, conn) = config.connect(NoTls).await?;
        tokio::spawn(conn);
        client.batch_execute(setup).await?;
        let stmt = client.prepare(sql).await?;
        clients.push((client, stmt));
    }
    let start = Instant::now();
    let stop = start + run;
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(c, (client, stmt))| {
            tokio::spawn(async move {
                let mut stream = KeyStream::new(1_000 + c as u64);
                let mut done = 0u64;
                while Instant::now() < stop {
                    let batch: Vec<String> =
                        (0..keys).map(|_| key(stream.next_below(rows))).collect();
                    done += client.query(&stmt, &[&batch]).await?.len() as u64;
                }
                anyhow::Ok(done)
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// The settings of the load generators' read paths: `batch`, a deadline
/// long enough that a saturated run does not time out, and room in the
/// cache for a million rows.
pub fn read_settings(path: ReadPath, batch: BatchSettings) -> ReadSettings {
    ReadSettings {
        path,
        batch,
        timeout: Duration::from_secs(30),
        cache: CacheSettings {
            capacity: 1_000_000,
            ..CacheSettings::default()
        },
        ..ReadSettings::default()
    }
}

/// `n` initiators reading random keys through `lookup`.
///
/// # Panics
///
/// When a read fails.
async fn lookup_run(lookup: &Lookup<KvQuery>, n: usize, run: Duration, rows: u64) -> RunReport {
    let lookup = Arc::new(lookup.clone());
    closed_loop(n, run, rows, move |k| {
        let lookup = Arc::clone(&lookup);
        async move {
            if let Err(e) = lookup.get(key(k)).await {
                panic!("{lookup:?} read failed: {e:#}");
            }
        }
    })
    .await
}

/// Naive: `n` initiators, one `SELECT ... WHERE pk = $1` per read, each on a
/// connection taken from `pool`.
///
/// # Panics
///
/// When a read fails.
pub async fn naive_run(pool: &Pool, n: usize, run: Duration, rows: u64) -> RunReport {
    let settings = read_settings(ReadPath::Naive, BatchSettings::default());
    let lookup = Lookup::new("kv", KvQuery, pool.clone(), &settings)
        .expect("the naive path has no settings to reject");
    lookup_run(&lookup, n, run, rows).await
}

/// Pipelined: `n` initiators share `connections` connections (round robin)
/// and send single-key queries without waiting, which tokio-postgres
/// pipelines on each connection.
///
/// # Errors
///
/// When a connection cannot be made.
///
/// # Panics
///
/// When a read fails.
pub async fn pipelined_run(
    config: &tokio_postgres::Config,
    connections: usize,
    n: usize,
    run: Duration,
    rows: u64,
) -> anyhow::Result<RunReport> {
    let mut clients = Vec::with_capacity(connections);
    for _ in 0..connections {
        let (client, conn) = config.connect(NoTls).await?;
        tokio::spawn(conn);
        let stmt = client.prepare(KvQuery.single_sql()).await?;
        clients.push((client, stmt));
    }
    let clients = Arc::new(clients);
    let next = Arc::new(AtomicUsize::new(0));
    Ok(closed_loop(n, run, rows, move |k| {
        let clients = Arc::clone(&clients);
        let i = next.fetch_add(1, Relaxed) % clients.len();
        async move {
            let (client, stmt) = &clients[i];
            client
                .query_opt(stmt, &[&key(k)])
                .await
                .expect("pipelined read");
        }
    })
    .await)
}

/// Batched: `n` initiators through one batcher set up as `batch`. Returns
/// the report and the mean batch size.
///
/// # Errors
///
/// When the settings are invalid.
///
/// # Panics
///
/// When a read fails.
pub async fn batched_run(
    pool: &Pool,
    batch: BatchSettings,
    n: usize,
    run: Duration,
    rows: u64,
) -> anyhow::Result<(RunReport, f64)> {
    let settings = read_settings(ReadPath::Batched, batch);
    let lookup = Lookup::new("kv", KvQuery, pool.clone(), &settings)?;
    let report = lookup_run(&lookup, n, run, rows).await;
    let mean = mean_batch(&lookup);
    lookup.shutdown().await;
    Ok((report, mean))
}

/// What [`batched_run_warm`] measured.
#[derive(Debug)]
pub struct BatchedRun {
    /// Latencies and throughput after the warm-up.
    pub report: RunReport,
    /// The mean batch size over the whole run.
    pub mean_batch: f64,
    /// The batcher's concurrency limit at the end.
    pub limit: u64,
    /// Loads running at once, on average over the warm-up and the run:
    /// below the limit, the slots stood idle between loads (or the
    /// automatic limit sat lower).
    pub running: f64,
}

/// As [`batched_run`], on `source` (a pool, or a router that says how
/// statements are sent), measured after `warmup` of the same load (not
/// recorded), so an automatic concurrency limit has found its level: what
/// a long-running service sees.
///
/// # Errors
///
/// When the settings are invalid.
///
/// # Panics
///
/// When a read fails.
pub async fn batched_run_warm(
    source: impl Into<ReadRouter>,
    batch: BatchSettings,
    n: usize,
    warmup: Duration,
    run: Duration,
    rows: u64,
) -> anyhow::Result<BatchedRun> {
    let settings = read_settings(ReadPath::Batched, batch);
    let lookup = Arc::new(Lookup::new("kv", KvQuery, source, &settings)?);
    let reader = Arc::clone(&lookup);
    let started = Instant::now();
    let report = closed_loop_warm(n, warmup, run, rows, move |k| {
        let lookup = Arc::clone(&reader);
        async move {
            if let Err(e) = lookup.get(key(k)).await {
                panic!("{lookup:?} read failed: {e:#}");
            }
        }
    })
    .await;
    let stats = lookup
        .batcher_stats()
        .context("a batched lookup has a batcher")?;
    let elapsed = started.elapsed();
    lookup.shutdown().await;
    Ok(BatchedRun {
        report,
        mean_batch: stats.batch_size.mean().unwrap_or(0.0),
        limit: stats.concurrency_limit,
        running: Duration::from_nanos(stats.load_duration.sum).div_duration_f64(elapsed),
    })
}

/// What [`minimal_run`] measured.
#[derive(Debug)]
pub struct MinimalRun {
    /// Latencies and throughput after the warm-up.
    pub report: RunReport,
    /// Keys per statement over the whole run.
    pub mean_batch: f64,
    /// Statements running at once, on average over the warm-up and the
    /// run (as [`BatchedRun::running`]).
    pub running: f64,
}

/// As [`batched_run_warm`], through the hand-written
/// [`MinimalBatcher`] on `connections` connections of its own, with
/// batches of at most `max_batch` keys.
///
/// # Errors
///
/// When a connection cannot be made.
///
/// # Panics
///
/// When a read fails.
pub async fn minimal_run(
    config: &tokio_postgres::Config,
    connections: usize,
    max_batch: usize,
    n: usize,
    warmup: Duration,
    run: Duration,
    rows: u64,
) -> anyhow::Result<MinimalRun> {
    let batcher = Arc::new(MinimalBatcher::start(config, connections, max_batch).await?);
    let reader = Arc::clone(&batcher);
    let started = Instant::now();
    let report = closed_loop_warm(n, warmup, run, rows, move |k| {
        let batcher = Arc::clone(&reader);
        async move {
            if let Err(e) = batcher.get(key(k)).await {
                panic!("minimal batcher read failed: {e:#}");
            }
        }
    })
    .await;
    let mean_batch = batcher.mean_batch();
    let running = batcher.busy().div_duration_f64(started.elapsed());
    // Every caller has finished, so the run holds the only handle.
    Arc::into_inner(batcher)
        .context("the minimal batcher is still shared after its run")?
        .shutdown()
        .await;
    Ok(MinimalRun {
        report,
        mean_batch,
        running,
    })
}

/// What a cached run measured.
#[derive(Debug)]
pub struct CachedRun {
    /// Latencies and throughput.
    pub report: RunReport,
    /// The batcher's mean batch size.
    pub mean_batch: f64,
    /// Hits over all lookups.
    pub hit_rate: f64,
}

/// Cached: `n` initiators through a 1M-entry cache with `admission` in
/// front of a batcher set up as `batch`.
///
/// # Errors
///
/// When the settings are invalid.
///
/// # Panics
///
/// When a read fails.
pub async fn cached_run(
    pool: &Pool,
    batch: BatchSettings,
    admission: Admission,
    n: usize,
    run: Duration,
    rows: u64,
) -> anyhow::Result<CachedRun> {
    let mut settings = read_settings(ReadPath::Cached, batch);
    settings.cache.admission = admission;
    let lookup = Lookup::new("kv", KvQuery, pool.clone(), &settings)?;
    let report = lookup_run(&lookup, n, run, rows).await;
    let s = lookup
        .cache_stats()
        .context("a cached lookup has a cache")?;
    let lookups = (s.hits + s.misses + s.coalesced).max(1);
    let mean_batch = mean_batch(&lookup);
    lookup.shutdown().await;
    Ok(CachedRun {
        report,
        mean_batch,
        hit_rate: s.hits as f64 / lookups as f64,
    })
}

/// The mean size of the batches `lookup`'s batcher ran (0 without one).
fn mean_batch(lookup: &Lookup<KvQuery>) -> f64 {
    lookup
        .batcher_stats()
        .and_then(|s| s.batch_size.mean())
        .unwrap_or(0.0)
}

/// The mean of `samples` sequential `SELECT 1` round trips on one
/// connection: the round-trip time a read path pays per statement, proxy
/// included (see [`crate::delay_proxy`]).
///
/// # Errors
///
/// When the database fails.
pub async fn round_trip(
    config: &tokio_postgres::Config,
    samples: usize,
) -> anyhow::Result<Duration> {
    let (client, conn) = config.connect(NoTls).await?;
    tokio::spawn(conn);
    let stmt = client.prepare("SELECT 1").await?;
    let samples = samples.max(1);
    let start = Instant::now();
    for _ in 0..samples {
        client.query_one(&stmt, &[]).await?;
    }
    Ok(start.elapsed() / u32::try_from(samples).unwrap_or(u32::MAX))
}

/// One caller's lookup, timed two ways over the same `pool`: a hit of the
/// server's cached read path, and an uncached single-row lookup
/// (`SELECT ... WHERE pk = $1`, prepared), each the mean of sequential
/// calls.
#[derive(Debug, Clone, Copy)]
pub struct HitVsUncached {
    /// A cache hit (`Lookup::get` on the cached path, key already cached).
    pub hit: Duration,
    /// An uncached lookup of a key not read before in the run.
    pub uncached: Duration,
}

/// Measures [`HitVsUncached`]: `hits` sequential hits over 1,000 cached
/// keys, and `lookups` sequential uncached reads of distinct keys of a
/// `rows`-row table, in a spawned task (where request handlers run).
///
/// # Errors
///
/// When the settings are invalid or a read fails.
pub async fn hit_vs_uncached(
    pool: &Pool,
    rows: u64,
    hits: u64,
    lookups: u64,
) -> anyhow::Result<HitVsUncached> {
    const HOT: u64 = 1_000;
    let settings = read_settings(ReadPath::Cached, BatchSettings::default());
    let cached = Lookup::new("kv", KvQuery, pool.clone(), &settings)?;
    let uncached = pgbatch::pg::PgLoader::new(pool.clone(), KvQuery);
    let rows = rows.max(HOT + 1);
    tokio::spawn(async move {
        // Twice: the read cache stores a key from its second miss on
        // (`Admission::SecondMiss`, the default).
        for _ in 0..2 {
            for k in 0..HOT {
                cached.get(key(k)).await?.context("a seeded row")?;
            }
        }
        let primed = cached.cache_stats().context("the cached path")?;
        let keys: Vec<String> = (0..hits).map(|i| key(i % HOT)).collect();
        let start = Instant::now();
        for k in keys {
            std::hint::black_box(cached.get(k).await?);
        }
        let hit = start.elapsed() / u32::try_from(hits.max(1)).unwrap_or(u32::MAX);
        let timed = cached.cache_stats().context("the cached path")?;
        anyhow::ensure!(
            timed.hits - primed.hits == hits,
            "only {} of the {hits} timed reads were hits",
            timed.hits - primed.hits
        );
        // Distinct keys spread over the table, none of them cached by this
        // process; Postgres may have them in its buffers, as it would in
        // production.
        let mut stream = KeyStream::new(7);
        let start = Instant::now();
        for _ in 0..lookups {
            let k = HOT + stream.next_below(rows - HOT);
            std::hint::black_box(uncached.load_one(&key(k)).await?);
        }
        let uncached = start.elapsed() / u32::try_from(lookups.max(1)).unwrap_or(u32::MAX);
        cached.shutdown().await;
        Ok(HitVsUncached { hit, uncached })
    })
    .await?
}

/// The TCP address and settings of the database, for a
/// [`DelayProxy`](crate::delay_proxy::DelayProxy) to forward to.
///
/// # Errors
///
/// When the database is not reachable over TCP.
pub async fn tcp_target(db: &Database) -> anyhow::Result<(SocketAddr, tokio_postgres::Config)> {
    if let Some(cluster) = &db.cluster {
        let addr = cluster
            .tcp_addr()
            .context("the cluster has no TCP listener")?;
        let config = cluster
            .tcp_config(db.config.get_dbname().unwrap_or("postgres"))
            .context("the cluster has no TCP listener")?;
        return Ok((addr, config));
    }
    let (Some(tokio_postgres::config::Host::Tcp(host)), Some(port)) =
        (db.config.get_hosts().first(), db.config.get_ports().first())
    else {
        bail!("latency runs need a Postgres reachable over TCP (a host name and port in DATABASE_URL)");
    };
    let addr = tokio::net::lookup_host((host.as_str(), *port))
        .await?
        .next()
        .with_context(|| format!("{host} does not resolve"))?;
    Ok((addr, via(&db.config, addr)))
}

/// `config` with its host and port replaced by `addr` (`Config::host`
/// appends to the host list, so the settings are copied over instead).
pub fn via(config: &tokio_postgres::Config, addr: SocketAddr) -> tokio_postgres::Config {
    let mut out = tokio_postgres::Config::new();
    out.host(addr.ip().to_string()).port(addr.port());
    if let Some(user) = config.get_user() {
        out.user(user);
    }
    if let Some(password) = config.get_password() {
        out.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        out.dbname(dbname);
    }
    out
}
