//! Scoped batching against what multi-tenant services do without it, on
//! the 10M-row table under a row-level-security policy, in one run.
//!
//! `--callers` concurrent callers (300) ask for one key at a time; each
//! request belongs to one of S scopes (1, 10, 100, 1,000), a role and the
//! setting `app.tenant` the policy reads, and asks for a key its scope
//! may see (the policy gives tenant `t` the rows whose number ends in `t`).
//! Contenders, each reading the same requests on one pool:
//!
//! - pgbatch scoped: one `Batcher<String, String, Scope>` at its defaults
//!   for every request; each load runs as one scope, in a transaction of
//!   its own (`BEGIN`, the prologue setting the role and `app.tenant` as
//!   parameters, the batch, `COMMIT`, pipelined in one round trip);
//! - one transaction per request, as PostgREST runs a request: the same
//!   transaction around the one-key statement, pipelined the same way
//!   (the strongest form of it);
//! - async-graphql's `DataLoader` created per request, its usual use under
//!   auth (one loader per request, so nothing is shared), with no delay
//!   (its best for one key: the default 1 ms delay only adds latency);
//! - pgbatch unscoped (one shared batcher as the pool's login role, which
//!   bypasses the policy): what scoping costs, at one scope;
//! - at one scope only, pgbatch scoped as a role whose policy admits every
//!   row (`USING (true)`): the scope's transaction and prologue with a
//!   policy that costs nothing, so how the cost splits between the
//!   transaction and the policy.
//!
//! Interleaved rounds per scope count; medians with their spread; ratios
//! per round against one transaction per request and, at one scope,
//! against unscoped batching.
//!
//! ```text
//! cargo run --release -p benches --bin scopes
//! cargo run --release -p benches --bin scopes -- --smoke   # seconds, for CI
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use async_graphql::dataloader::{DataLoader, Loader as DataLoaderLoader};
use benches::cpu::{CpuSnapshot, Postgres};
use benches::reads::{key, TableArgs};
use benches::rounds::{median, spread, WarmRoundArgs};
use benches::{closed_loop_warm, print_markdown, Align, ReadSample, RunReport};
use clap::Parser;
use pgbatch::pg::{self, PgError, PgLoader, PoolOptions, Scope, ScopedPgLoader, Sql};
use pgbatch::{Batcher, ScopedLoader};
use server::db::queries::kv::KvQuery;
use server::db::Database;

/// Measures scoped batching on Postgres under row-level security.
#[derive(Debug, Parser)]
#[command(
    about,
    mut_arg("rounds", |a| a.default_value("3").help("Interleaved rounds of the contenders, per scope count"))
)]
struct Args {
    #[command(flatten)]
    table: TableArgs,
    /// Concurrent callers, each asking for one key at a time.
    #[arg(long, default_value_t = 300)]
    callers: usize,
    /// The scope counts to measure, comma-separated (at most 1,000).
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000")]
    scopes: Vec<u64>,
    #[command(flatten)]
    runs: WarmRoundArgs,
    /// Connections in the pool every contender uses.
    #[arg(long, default_value_t = 16)]
    pool_size: usize,
    /// Scopes one scoped load may serve, their transactions pipelined on
    /// one connection (1: a load per scope); the loader's default if not
    /// given.
    #[arg(long)]
    scopes_per_load: Option<usize>,
}

/// The role every scope runs as; the policy applies to it.
const ROLE: &str = "pgbatch_bench_tenant";
/// A role whose policy admits every row.
const OPEN_ROLE: &str = "pgbatch_bench_open";

/// One of the contenders of a round.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Contender {
    Scoped,
    TransactionPerRequest,
    DataLoaderPerRequest,
    Unscoped,
    ScopedOpen,
    /// Scoped, each load serving one scope: what several scopes a load
    /// buy, measured in the same run.
    ScopedOnePerLoad,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Scoped => "pgbatch scoped",
            Contender::TransactionPerRequest => "one transaction per request",
            Contender::DataLoaderPerRequest => "DataLoader per request",
            Contender::Unscoped => "pgbatch unscoped (bypasses the policy)",
            Contender::ScopedOpen => "pgbatch scoped, a policy admitting every row",
            Contender::ScopedOnePerLoad => "pgbatch scoped, one scope a load",
        }
    }
}

/// The requests' scopes and which key each may read.
struct Scopes {
    /// Each tenant's scope: the role and its setting.
    as_role: Vec<Scope>,
    /// The same settings as the role whose policy admits every row.
    open: Vec<Scope>,
}

impl Scopes {
    fn new(count: u64) -> anyhow::Result<Self> {
        let scopes = |role: &str| {
            (0..count)
                .map(|t| {
                    Ok(Scope::builder()
                        .label(format!("tenant {t}"))
                        .role(role)
                        .setting("app.tenant", t.to_string())
                        .build()?)
                })
                .collect::<anyhow::Result<Vec<_>>>()
        };
        Ok(Self {
            as_role: scopes(ROLE)?,
            open: scopes(OPEN_ROLE)?,
        })
    }

    /// For the random draw `k` of `rows`: its request's scope, and a key
    /// that scope may see (a row whose number ends in the scope's
    /// tenant), near `k`.
    fn request(&self, k: u64, rows: u64) -> (&Scope, String) {
        let (i, key) = self.draw(k, rows);
        (&self.as_role[i], key)
    }

    /// As [`request`](Self::request), as the role every row is open to.
    fn request_open(&self, k: u64, rows: u64) -> (&Scope, String) {
        let (i, key) = self.draw(k, rows);
        (&self.open[i], key)
    }

    fn draw(&self, k: u64, rows: u64) -> (usize, String) {
        let count = self.as_role.len() as u64;
        let thousand = k / 1000;
        let tenant = thousand % count;
        let mut row = thousand * 1000 + tenant;
        if row == 0 || row > rows {
            row = 1000 + tenant;
        }
        // `key(k)` names row k + 1.
        (tenant as usize, key(row - 1))
    }
}

/// A `DataLoader`'s loader for one request: the scoped loader as its
/// scope.
struct OneRequest {
    loader: ScopedPgLoader<KvQuery>,
    scope: Scope,
    loads: Arc<AtomicU64>,
}

impl DataLoaderLoader<String> for OneRequest {
    type Value = String;
    type Error = Arc<PgError>;

    async fn load(&self, keys: &[String]) -> Result<HashMap<String, String>, Arc<PgError>> {
        self.loads.fetch_add(1, Relaxed);
        ScopedLoader::load(&self.loader, &self.scope, keys.to_vec())
            .await
            .map(pgbatch::Loaded::into_values)
            .map_err(Arc::new)
    }
}

/// The one-key statement, as the per-request transaction runs it.
static ONE: std::sync::LazyLock<Sql> =
    std::sync::LazyLock::new(|| Sql::new("SELECT pk, payload FROM random_read_test WHERE pk = $1"));

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    args.table.apply_smoke("scopes");
    if args.table.smoke {
        args.runs.smoke();
        args.callers = 32;
        args.scopes = vec![1, 10];
    }
    anyhow::ensure!(
        args.scopes.iter().all(|&s| (1..=1000).contains(&s)),
        "--scopes are between 1 and 1000"
    );
    args.table
        .with_table(|o| o, async |db| measure(&args, db).await)
        .await
}

/// The roles and the policies: a row is tenant `t`'s if its number ends
/// in `t` (its last three digits); every row is the open role's. The login
/// role (a superuser here) bypasses both.
async fn create_policy(db: &Database) -> anyhow::Result<()> {
    let (client, conn) = db.config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    client
        .batch_execute(&format!(
            "DO $$ BEGIN CREATE ROLE {ROLE} NOLOGIN;
                 EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             DO $$ BEGIN CREATE ROLE {OPEN_ROLE} NOLOGIN;
                 EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             GRANT {ROLE}, {OPEN_ROLE} TO CURRENT_USER;
             GRANT SELECT ON random_read_test TO {ROLE}, {OPEN_ROLE};
             ALTER TABLE random_read_test ENABLE ROW LEVEL SECURITY;
             DROP POLICY IF EXISTS by_tenant ON random_read_test;
             CREATE POLICY by_tenant ON random_read_test FOR SELECT TO {ROLE}
               USING (right(pk, 3)::int = current_setting('app.tenant')::int);
             DROP POLICY IF EXISTS open ON random_read_test;
             CREATE POLICY open ON random_read_test FOR SELECT TO {OPEN_ROLE} USING (true);"
        ))
        .await?;
    Ok(())
}

async fn run(
    args: &Args,
    postgres: Option<Postgres<'_>>,
    pool: &pg::Pool,
    scopes: &Arc<Scopes>,
    who: Contender,
) -> ReadSample {
    let (warmup, seconds) = (
        Duration::from_secs_f64(args.runs.warmup),
        Duration::from_secs_f64(args.runs.seconds),
    );
    let rows = args.table.rows;
    let cpu_at_start = async {
        tokio::time::sleep(warmup).await;
        CpuSnapshot::take_of(postgres)
    };
    let plain = PgLoader::new(pool.clone(), KvQuery);
    let mut loader = plain
        .clone()
        .scoped(["app.tenant"])
        .expect("a settable name");
    if who == Contender::ScopedOnePerLoad {
        loader = loader.scopes_per_load(1);
    } else if let Some(n) = args.scopes_per_load {
        loader = loader.scopes_per_load(n);
    }
    let loads = Arc::new(AtomicU64::new(0));
    let (report, before, batcher_loads): (RunReport, _, Option<f64>) = match who {
        Contender::Scoped | Contender::ScopedOpen | Contender::ScopedOnePerLoad => {
            let batcher: Batcher<String, String, Scope> =
                Batcher::builder().build_scoped(loader).expect("defaults");
            let (b, scopes) = (batcher.clone(), Arc::clone(scopes));
            let (report, before) = tokio::join!(
                closed_loop_warm(args.callers, warmup, seconds, rows, move |k| {
                    let (b, scopes) = (b.clone(), Arc::clone(&scopes));
                    async move {
                        let (scope, key) = if who == Contender::ScopedOpen {
                            scopes.request_open(k, rows)
                        } else {
                            scopes.request(k, rows)
                        };
                        match b.load_as(scope, key).await {
                            Ok(Some(_)) => {}
                            other => panic!("scoped read: {other:?}"),
                        }
                    }
                }),
                cpu_at_start
            );
            let mean = batcher.stats().batch_size.mean();
            batcher.shutdown().await;
            (report, before, mean)
        }
        Contender::Unscoped => {
            let batcher: Batcher<String, String> = Batcher::new(plain);
            let (b, scopes) = (batcher.clone(), Arc::clone(scopes));
            let (report, before) = tokio::join!(
                closed_loop_warm(args.callers, warmup, seconds, rows, move |k| {
                    let (b, scopes) = (b.clone(), Arc::clone(&scopes));
                    async move {
                        let (_, key) = scopes.request(k, rows);
                        match b.load(key).await {
                            Ok(Some(_)) => {}
                            other => panic!("unscoped read: {other:?}"),
                        }
                    }
                }),
                cpu_at_start
            );
            let mean = batcher.stats().batch_size.mean();
            batcher.shutdown().await;
            (report, before, mean)
        }
        Contender::TransactionPerRequest => {
            let scopes = Arc::clone(scopes);
            let (report, before) = tokio::join!(
                closed_loop_warm(args.callers, warmup, seconds, rows, move |k| {
                    let (loader, scopes) = (loader.clone(), Arc::clone(&scopes));
                    async move {
                        let (scope, key) = scopes.request(k, rows);
                        // The same transaction and prologue a load has.
                        let rows = loader.query_as(scope, &ONE, &[&key]).await;
                        assert_eq!(rows.expect("a read").len(), 1, "found");
                    }
                }),
                cpu_at_start
            );
            (report, before, Some(1.0))
        }
        Contender::DataLoaderPerRequest => {
            let (counted, scopes) = (Arc::clone(&loads), Arc::clone(scopes));
            let (report, before) = tokio::join!(
                closed_loop_warm(args.callers, warmup, seconds, rows, move |k| {
                    let (loader, scopes, loads) =
                        (loader.clone(), Arc::clone(&scopes), Arc::clone(&counted));
                    async move {
                        let (scope, key) = scopes.request(k, rows);
                        let request = OneRequest {
                            loader,
                            scope: scope.clone(),
                            loads,
                        };
                        let dl = DataLoader::new(request, tokio::spawn).delay(Duration::ZERO);
                        match dl.load_one(key).await {
                            Ok(Some(_)) => {}
                            other => panic!("DataLoader read: {other:?}"),
                        }
                    }
                }),
                cpu_at_start
            );
            (report, before, Some(1.0))
        }
    };
    let cpu = CpuSnapshot::take_of(postgres).since(&before);
    ReadSample::new(&report, batcher_loads.unwrap_or(f64::NAN), &cpu)
}

async fn measure(args: &Args, db: &Database) -> anyhow::Result<()> {
    create_policy(db).await?;
    let pool = pg::pool(
        db.config.clone(),
        &PoolOptions::with_max_size(args.pool_size),
    )?;
    // The server's CPU, an embedded cluster's or a `DATABASE_URL` one's
    // on this machine.
    let postgres = match &db.cluster {
        Some(cluster) => Some(Postgres::Cluster(cluster)),
        None => {
            let client = pool.get().await?;
            Postgres::of_connection(&client).await
        }
    };
    println!(
        "{} callers, pool of {}, {} rows under a row-level-security policy; \
         {} s runs after {} s warm-up, {} interleaved rounds per scope count\n",
        args.callers,
        args.pool_size,
        args.table.rows,
        args.runs.seconds,
        args.runs.warmup,
        args.runs.rounds
    );
    let mut table = Vec::new();
    for &count in &args.scopes {
        // Ratios below are against the second and fourth.
        let mut contenders = vec![
            Contender::Scoped,
            Contender::TransactionPerRequest,
            Contender::DataLoaderPerRequest,
            Contender::Unscoped,
        ];
        if count == 1 {
            contenders.push(Contender::ScopedOpen);
        } else if args.scopes_per_load != Some(1) {
            contenders.push(Contender::ScopedOnePerLoad);
        }
        let scopes = Arc::new(Scopes::new(count)?);
        let mut samples: Vec<Vec<ReadSample>> = vec![Vec::new(); contenders.len()];
        for round in 0..args.runs.rounds {
            for i in 0..contenders.len() {
                let c = (i + round) % contenders.len();
                samples[c].push(run(args, postgres, &pool, &scopes, contenders[c]).await);
            }
        }
        let ratio = |who: usize, of: usize, f: fn(&ReadSample) -> f64| -> String {
            let v: Vec<f64> = samples[who]
                .iter()
                .zip(&samples[of])
                .map(|(a, b)| f(a) / f(b))
                .collect();
            spread(&v, 2)
        };
        for (i, who) in contenders.iter().enumerate() {
            let column =
                |f: fn(&ReadSample) -> f64| -> Vec<f64> { samples[i].iter().map(f).collect() };
            table.push(vec![
                count.to_string(),
                who.name().to_owned(),
                spread(&column(|s| s.per_sec), 0),
                spread(&column(|s| s.p50_ms), 2),
                spread(&column(|s| s.p99_ms), 2),
                ratio(i, 1, |s| s.per_sec),
                ratio(i, 3, |s| s.per_sec),
                format!("{:.1}", median(&column(|s| s.mean_batch))),
                format!("{:.1}", median(&column(|s| s.client_us))),
                format!("{:.1}", median(&column(|s| s.postgres_us))),
            ]);
        }
    }
    println!("Medians (min-max) of interleaved rounds; ratios per round, then their median.\n");
    print_markdown(
        &[
            ("scopes", Align::Right),
            ("contender", Align::Left),
            ("reads/s", Align::Right),
            ("p50 ms", Align::Right),
            ("p99 ms", Align::Right),
            ("÷ one transaction per request", Align::Right),
            ("÷ unscoped", Align::Right),
            ("keys/load", Align::Right),
            ("client CPU µs/read", Align::Right),
            ("Postgres CPU µs/read", Align::Right),
        ],
        table,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_flags_keep_their_defaults() {
        let args = Args::try_parse_from(["scopes"]).expect("the defaults parse");
        let runs = &args.runs;
        assert_eq!((runs.rounds, runs.seconds, runs.warmup), (3, 3.0, 1.0));
        assert_eq!(args.scopes, [1, 10, 100, 1000]);
    }

    #[test]
    fn each_request_asks_for_a_key_its_scope_may_see() {
        let scopes = Scopes::new(10).unwrap();
        for k in [0, 999, 1000, 123_456, 9_999_999] {
            let (scope, key) = scopes.request(k, 10_000_000);
            let tenant: u64 = scope.label().unwrap()["tenant ".len()..].parse().unwrap();
            let row: u64 = key.parse().unwrap();
            assert_eq!(row % 1000, tenant, "k {k}");
            assert!((1..=10_000_000).contains(&row));
            let (open, same) = scopes.request_open(k, 10_000_000);
            assert_eq!(
                (open.label(), open.role()),
                (scope.label(), Some(OPEN_ROLE))
            );
            assert_eq!(same, key);
        }
    }
}
