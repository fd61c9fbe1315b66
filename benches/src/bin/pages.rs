//! Pages of many parents' children, in one statement, against what
//! GraphQL services do without it, in one run.
//!
//! A table of `--parents` parents with `--children` children each (10,000
//! and 1,000: 10M rows), ordered by a position with ties (two children at
//! each) broken by id, indexed on `(parent_id, pos, id)`. `--callers`
//! concurrent callers (300) each ask for the first `--first` (10) children
//! of a random parent after a random cursor, one page at a time.
//! Contenders, each reading the same requests on one pool:
//!
//! - pgbatch pages: a `Batcher` at its defaults over `PgLoader::pages`:
//!   every waiting caller's page in one statement (a `LATERAL` index range
//!   scan per parent, starting at its cursor, `first + 1` rows);
//! - one statement per parent: each caller's page as a prepared statement
//!   of its own (`WHERE parent_id = $1 AND (pos, id) > ($2, $3) ORDER BY
//!   pos, id LIMIT 11`), on the same pool;
//! - async-graphql's `DataLoader` loading each parent's whole list
//!   (`WHERE parent_id = ANY($1) ORDER BY parent_id, pos, id`) and slicing
//!   the page in memory, the usual answer to pagination with a
//!   DataLoader, at a tuned setting (64 parents a batch, a 200 µs delay).
//!
//! Interleaved rounds; medians with their spread; ratios per round; and
//! the tuples Postgres fetched from the table per answer
//! (`pg_stat_user_tables`), which is what whole lists cost.
//!
//! ```text
//! cargo run --release -p benches --bin pages
//! cargo run --release -p benches --bin pages -- --smoke   # seconds, for CI
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_graphql::dataloader::{DataLoader, Loader as DataLoaderLoader};
use benches::cpu::CpuSnapshot;
use benches::reads::TableArgs;
use benches::rounds::{median, spread, WarmRoundArgs};
use benches::{closed_loop_warm, print_markdown, Align, ReadSample, RunReport};
use clap::Parser;
use pgbatch::pg::tokio_postgres::{Error as PgDriverError, Row};
use pgbatch::pg::{
    self, Cursor, Lease, PageQuery, PageSql, PgLoader, PoolOptions, Sql, Statements,
};
use pgbatch::Batcher;
use server::db::Database;
use tokio_postgres::NoTls;

/// Measures pages of many parents in one statement against one statement
/// per parent and whole lists sliced in memory.
#[derive(Debug, Parser)]
#[command(
    about,
    mut_arg("rounds", |a| a.default_value("3").help("Interleaved rounds of the contenders"))
)]
struct Args {
    #[command(flatten)]
    table: TableArgs,
    /// Parents in the children's table.
    #[arg(long, default_value_t = 10_000)]
    parents: u64,
    /// Children of each parent.
    #[arg(long, default_value_t = 1_000)]
    children: u64,
    /// Items per page.
    #[arg(long, default_value_t = 10)]
    first: u32,
    /// Concurrent callers, each asking for one page at a time.
    #[arg(long, default_value_t = 300)]
    callers: usize,
    #[command(flatten)]
    runs: WarmRoundArgs,
    /// Connections in the pool every contender uses.
    #[arg(long, default_value_t = 16)]
    pool_size: usize,
}

const TABLE: &str = "bench_children";

/// A child, as every contender reads it.
type Child = (i64, String);

/// The contenders.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Contender {
    Pages,
    StatementPerParent,
    WholeLists,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Pages => "pgbatch pages (one statement per load)",
            Contender::StatementPerParent => "one statement per parent",
            Contender::WholeLists => "DataLoader, whole lists sliced in memory",
        }
    }
}

/// Which page a request asks for: its parent, and the child it starts
/// after (`0..children - first`).
#[derive(Debug, Clone, Copy)]
struct Ask {
    parent: i64,
    after: i64,
}

/// What a request needs of the arguments: a `Copy` for the callers'
/// closures.
#[derive(Debug, Clone, Copy)]
struct Shape {
    children: u64,
    first: u32,
}

impl Ask {
    fn of(k: u64, shape: Shape) -> Self {
        let span = shape.children - u64::from(shape.first);
        Self {
            parent: (1 + k / span) as i64,
            after: (k % span) as i64,
        }
    }

    /// A child's id and position.
    fn child(&self, c: i64) -> (i64, i32) {
        (self.parent * 1_000_000 + c, (c / 2) as i32)
    }

    /// The cursor after child `after`.
    fn cursor(&self) -> Cursor {
        let (id, pos) = self.child(self.after);
        Cursor::new([pos.to_string().as_str(), id.to_string().as_str()])
    }

    /// The id the page must start with.
    fn first_id(&self) -> i64 {
        self.child(self.after + 1).0
    }
}

/// Pages of each parent's children.
struct ChildPages(PageSql);

impl PageQuery for ChildPages {
    type Parent = i64;
    type Value = Child;

    fn page_sql(&self) -> &PageSql {
        &self.0
    }
    fn map_row(&self, row: &Row) -> Result<Child, PgDriverError> {
        Ok((row.try_get(0)?, row.try_get(1)?))
    }
}

/// One parent's page as its own statement.
static ONE_PAGE: std::sync::LazyLock<Sql> = std::sync::LazyLock::new(|| {
    Sql::new(&format!(
        "SELECT id, payload FROM {TABLE} WHERE parent_id = $1 AND (pos, id) > ($2, $3) \
         ORDER BY pos, id LIMIT $4"
    ))
});

/// Whole lists, by parent, for the `DataLoader`.
struct WholeLists {
    pool: pg::Pool,
    sql: Sql,
}

type List = Arc<Vec<(i32, i64, String)>>;

impl DataLoaderLoader<i64> for WholeLists {
    type Value = List;
    type Error = Arc<pg::PgError>;

    async fn load(&self, parents: &[i64]) -> Result<HashMap<i64, List>, Self::Error> {
        let mut lease = Lease::get(&self.pool)
            .await
            .map_err(|e| Arc::new(pg::PgError::from(e)))?;
        let rows = Statements::default()
            .query(&mut lease, &self.sql, &[&parents])
            .await;
        lease.settle(&rows);
        let rows = rows.map_err(|e| Arc::new(pg::PgError::from(e)))?;
        let mut lists: HashMap<i64, Vec<(i32, i64, String)>> = HashMap::new();
        for row in &rows {
            lists
                .entry(row.get(0))
                .or_default()
                .push((row.get(1), row.get(2), row.get(3)));
        }
        Ok(lists.into_iter().map(|(p, l)| (p, Arc::new(l))).collect())
    }
}

/// The children's table, made once (kept with the cluster) at `parents`
/// times `children` rows, indexed for pages, and prewarmed.
async fn ensure_children(db: &Database, args: &Args) -> anyhow::Result<()> {
    let (client, conn) = db.config.connect(NoTls).await?;
    tokio::spawn(conn);
    client
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {TABLE} (
                 id bigint PRIMARY KEY, parent_id bigint NOT NULL, pos int NOT NULL,
                 payload text NOT NULL)"
        ))
        .await?;
    let want = (args.parents * args.children) as i64;
    let have: i64 = client
        .query_one(&format!("SELECT count(*) FROM {TABLE}"), &[])
        .await?
        .get(0);
    if have != want {
        eprintln!("loading {want} children into {TABLE}");
        let start = Instant::now();
        client
            .batch_execute(&format!(
                "DROP INDEX IF EXISTS {TABLE}_page;
                 TRUNCATE {TABLE};
                 INSERT INTO {TABLE} (id, parent_id, pos, payload)
                     SELECT p * 1000000 + c, p, c / 2, 'child ' || (p * 1000000 + c)
                     FROM generate_series(1, {parents}::bigint) p,
                          generate_series(0, {children}::bigint - 1) c;
                 CREATE INDEX {TABLE}_page ON {TABLE} (parent_id, pos, id);",
                parents = args.parents,
                children = args.children,
            ))
            .await?;
        // Its own statement: VACUUM cannot run inside the implicit
        // transaction of several.
        client
            .batch_execute(&format!("VACUUM (FREEZE, ANALYZE) {TABLE}"))
            .await?;
        eprintln!("loaded in {:.0} s", start.elapsed().as_secs_f64());
    }
    if client
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
        .await
        .is_ok()
    {
        client
            .batch_execute(&format!(
                "SELECT pg_prewarm('{TABLE}'), pg_prewarm('{TABLE}_page')"
            ))
            .await?;
    }
    Ok(())
}

/// The table's tuples fetched so far (by index scans and sequential
/// scans), as the statistics say.
async fn tuples_read(client: &tokio_postgres::Client) -> anyhow::Result<i64> {
    Ok(client
        .query_one(
            "SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) \
             FROM pg_stat_user_tables WHERE relname = $1",
            &[&TABLE],
        )
        .await?
        .get(0))
}

/// A run's figures, and the table's tuples fetched per answer.
struct Sample {
    read: ReadSample,
    tuples_per_answer: f64,
}

/// Runs `who` on a pool of its own, closed after the run: a backend
/// reports the tuples it read when it goes idle, at most every ten
/// seconds, or when it exits, so only closing the pool makes the count
/// whole. The count covers the warm-up too, and so do the answers it is
/// divided by.
async fn run(args: &Args, db: &Database, who: Contender) -> anyhow::Result<Sample> {
    let (warmup, seconds) = (
        Duration::from_secs_f64(args.runs.warmup),
        Duration::from_secs_f64(args.runs.seconds),
    );
    let (stats, conn) = db.config.connect(NoTls).await?;
    tokio::spawn(conn);
    let tuples_before = tuples_read(&stats).await?;
    let pool = &pg::pool(
        db.config.clone(),
        &PoolOptions::with_max_size(args.pool_size),
    )?;
    let answers = Arc::new(AtomicU64::new(0));
    let span = args.parents * (args.children - u64::from(args.first));
    let first = args.first;
    let shape = Shape {
        children: args.children,
        first,
    };
    let cpu_at_start = async {
        tokio::time::sleep(warmup).await;
        CpuSnapshot::take(db.cluster.as_ref())
    };
    let (report, before, mean_batch): (RunReport, _, f64) = match who {
        Contender::Pages => {
            let answers = Arc::clone(&answers);
            let sql = page_sql(first)?;
            let batcher = Batcher::new(PgLoader::pages(pool.clone(), ChildPages(sql.clone())));
            let (b, sql2) = (batcher.clone(), sql.clone());
            let (report, before) = tokio::join!(
                closed_loop_warm(args.callers, warmup, seconds, span, move |k| {
                    let (b, sql, answers) = (b.clone(), sql2.clone(), Arc::clone(&answers));
                    async move {
                        let ask = Ask::of(k, shape);
                        let key = sql
                            .key(ask.parent, first, Some(ask.cursor().as_str()))
                            .expect("a valid page");
                        let page = b
                            .load(key)
                            .await
                            .expect("a page")
                            .expect("every key answered");
                        assert_eq!(page.items.first().map(|c| c.0), Some(ask.first_id()));
                        answers.fetch_add(1, Relaxed);
                    }
                }),
                cpu_at_start
            );
            let mean = batcher.stats().batch_size.mean().unwrap_or(f64::NAN);
            batcher.shutdown().await;
            (report, before, mean)
        }
        Contender::StatementPerParent => {
            let answers = Arc::clone(&answers);
            let pool = pool.clone();
            let (report, before) = tokio::join!(
                closed_loop_warm(args.callers, warmup, seconds, span, move |k| {
                    let (pool, answers) = (pool.clone(), Arc::clone(&answers));
                    async move {
                        let ask = Ask::of(k, shape);
                        let (id, pos) = ask.child(ask.after);
                        let limit = i64::from(first) + 1;
                        let mut lease = Lease::get(&pool).await.expect("a connection");
                        let rows = Statements::default()
                            .query(&mut lease, &ONE_PAGE, &[&ask.parent, &pos, &id, &limit])
                            .await;
                        lease.settle(&rows);
                        let rows = rows.expect("a page");
                        assert_eq!(
                            rows.first().map(|r| r.get::<_, i64>(0)),
                            Some(ask.first_id())
                        );
                        answers.fetch_add(1, Relaxed);
                    }
                }),
                cpu_at_start
            );
            (report, before, 1.0)
        }
        Contender::WholeLists => {
            let answers = Arc::clone(&answers);
            let loader = WholeLists {
                pool: pool.clone(),
                sql: Sql::new(&format!(
                    "SELECT parent_id, pos, id, payload FROM {TABLE} \
                     WHERE parent_id = ANY($1) ORDER BY parent_id, pos, id"
                )),
            };
            let dl = Arc::new(
                DataLoader::new(loader, tokio::spawn)
                    .delay(Duration::from_micros(200))
                    .max_batch_size(64),
            );
            let (report, before) = tokio::join!(
                closed_loop_warm(args.callers, warmup, seconds, span, move |k| {
                    let (dl, answers) = (Arc::clone(&dl), Arc::clone(&answers));
                    async move {
                        let ask = Ask::of(k, shape);
                        let list = dl
                            .load_one(ask.parent)
                            .await
                            .expect("a list")
                            .expect("a list");
                        // The page, sliced: the children after the cursor.
                        let (id, pos) = ask.child(ask.after);
                        let from = list.partition_point(|c| (c.0, c.1) <= (pos, id));
                        let page: Vec<Child> = list
                            .iter()
                            .skip(from)
                            .take(first as usize + 1)
                            .map(|c| (c.1, c.2.clone()))
                            .collect();
                        assert_eq!(page.first().map(|c| c.0), Some(ask.first_id()));
                        answers.fetch_add(1, Relaxed);
                    }
                }),
                cpu_at_start
            );
            (report, before, f64::NAN)
        }
    };
    let cpu = CpuSnapshot::take(db.cluster.as_ref()).since(&before);
    pool.close();
    // The backends exit, reporting what they read.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tuples = (tuples_read(&stats).await? - tuples_before) as f64;
    Ok(Sample {
        read: ReadSample::new(&report, mean_batch, &cpu),
        tuples_per_answer: tuples / answers.load(Relaxed).max(1) as f64,
    })
}

fn page_sql(first: u32) -> anyhow::Result<PageSql> {
    Ok(PageSql::builder(TABLE)
        .parent("parent_id", "bigint")
        .columns(["id", "payload"])
        .order_by("pos", "int")
        .order_by("id", "bigint")
        .max_first(first.max(1))
        .build()?)
}

async fn measure(args: &Args, db: &Database) -> anyhow::Result<()> {
    ensure_children(db, args).await?;
    println!(
        "{} callers, pool of {}, {} parents of {} children, pages of {} after a random cursor; \
         {} s runs after {} s warm-up, {} interleaved rounds\n",
        args.callers,
        args.pool_size,
        args.parents,
        args.children,
        args.first,
        args.runs.seconds,
        args.runs.warmup,
        args.runs.rounds
    );
    let contenders = [
        Contender::Pages,
        Contender::StatementPerParent,
        Contender::WholeLists,
    ];
    let mut samples: Vec<Vec<Sample>> = contenders.iter().map(|_| Vec::new()).collect();
    for round in 0..args.runs.rounds {
        for i in 0..contenders.len() {
            let c = (i + round) % contenders.len();
            samples[c].push(run(args, db, contenders[c]).await?);
        }
    }
    let ratio = |who: usize, of: usize, f: fn(&Sample) -> f64| -> String {
        let v: Vec<f64> = samples[who]
            .iter()
            .zip(&samples[of])
            .map(|(a, b)| f(a) / f(b))
            .collect();
        spread(&v, 2)
    };
    let mut table = Vec::new();
    for (i, who) in contenders.iter().enumerate() {
        let column = |f: fn(&Sample) -> f64| -> Vec<f64> { samples[i].iter().map(f).collect() };
        table.push(vec![
            who.name().to_owned(),
            spread(&column(|s| s.read.per_sec), 0),
            spread(&column(|s| s.read.p50_ms), 2),
            spread(&column(|s| s.read.p99_ms), 2),
            ratio(i, 1, |s| s.read.per_sec),
            ratio(i, 2, |s| s.read.per_sec),
            format!("{:.1}", median(&column(|s| s.tuples_per_answer))),
            format!("{:.1}", median(&column(|s| s.read.mean_batch))),
            format!("{:.1}", median(&column(|s| s.read.client_us))),
            format!("{:.1}", median(&column(|s| s.read.postgres_us))),
        ]);
    }
    println!("Medians (min-max) of interleaved rounds; ratios per round, then their median.\n");
    print_markdown(
        &[
            ("contender", Align::Left),
            ("pages/s", Align::Right),
            ("p50 ms", Align::Right),
            ("p99 ms", Align::Right),
            ("÷ one statement per parent", Align::Right),
            ("÷ DataLoader, whole lists", Align::Right),
            ("tuples fetched per page", Align::Right),
            ("pages per load", Align::Right),
            ("client CPU µs/page", Align::Right),
            ("Postgres CPU µs/page", Align::Right),
        ],
        table,
    );
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    args.table.apply_smoke("pages");
    if args.table.smoke {
        args.runs.smoke();
        args.callers = 32;
        args.parents = 100;
        args.children = 50;
    }
    // The key-value table the other tools read is not needed here.
    args.table.rows = 0;
    anyhow::ensure!(
        args.first >= 1 && u64::from(args.first) + 2 <= args.children,
        "--first is at least 1 and below --children minus 1"
    );
    args.table
        .with_table(|o| o, async |db| measure(&args, db).await)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_asks_for_the_page_after_a_child_of_its_parent() {
        let args = Args::try_parse_from(["pages"]).unwrap();
        assert_eq!(
            (args.parents, args.children, args.first),
            (10_000, 1_000, 10)
        );
        let shape = Shape {
            children: args.children,
            first: args.first,
        };
        let ask = Ask::of(0, shape);
        assert_eq!((ask.parent, ask.after), (1, 0));
        let last = Ask::of(args.parents * 990 - 1, shape);
        assert_eq!((last.parent, last.after), (10_000, 989));
        assert_eq!(last.first_id(), 10_000 * 1_000_000 + 990);
        assert_eq!(last.child(989).1, 494, "two children at each position");
    }
}
