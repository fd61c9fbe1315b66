//! Several instances and a read replica, measured, and
//! the local deployment they run on.
//!
//! It starts a primary (with the service's schema and demo objects) and a
//! streaming replica of it (`pg_basebackup -R`, through `embedded_pg`),
//! then, in interleaved rounds, drives `GET .../objects/stat` for random
//! objects through the service's whole HTTP stack (router, token check,
//! lookup, batcher), spread evenly over the instances of each setup:
//!
//! - 1 instance, primary only (the baseline every ratio is against),
//! - 1 instance reading from the replica,
//! - 3 instances reading from the replica,
//! - 3 instances, primary only.
//!
//! It reports reads/s, p50 and p99, each against the baseline, and the
//! share of the database reads the replica served. Everything runs on one
//! machine: with 2 cores the total cannot grow with instances or a replica;
//! the runs show what they cost and that reads move to the replica.
//!
//! With `--hold N` it serves N instances on ports from `--port` instead,
//! prints how to reach them, and runs until Ctrl-C: a primary, a replica
//! and N servers to try the consistency model by hand.
//!
//! ```text
//! cargo run --release -p benches --bin replicas
//! cargo run --release -p benches --bin replicas -- --smoke
//! cargo run --release -p benches --bin replicas -- --hold 3
//! ```

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use benches::rounds::RoundArgs;
use benches::{closed_loop, print_markdown, Align, RunReport, ADMIN_TOKEN};
use clap::Parser;
use embedded_pg::Cluster;
use server::db::seed::object_path;
use server::db::Postgres;
use server::settings::{ReadPath, ReadSettings, Settings};
use server::AppState;
use tower::ServiceExt as _;

/// Measures reads across instances with a read replica.
#[derive(Debug, Parser)]
#[command(
    about,
    mut_arg("seconds", |a| a.default_value("5")),
    mut_arg("rounds", |a| a.help("Interleaved rounds; the median round is reported"))
)]
struct Args {
    /// Objects seeded in repository `demo`.
    #[arg(long, default_value_t = 200_000)]
    objects: u64,
    /// Concurrent callers, spread evenly over the instances.
    #[arg(long, default_value_t = 64)]
    callers: usize,
    #[command(flatten)]
    runs: RoundArgs,
    /// Read connections per instance (and per instance to the replica).
    #[arg(long, default_value_t = 8)]
    pool_size: usize,
    /// Serve this many instances on their own ports until Ctrl-C instead
    /// of measuring.
    #[arg(long)]
    hold: Option<usize>,
    /// The first instance's port with `--hold`.
    #[arg(long, default_value_t = 8081)]
    port: u16,
    /// A few seconds in all, for CI: proves the tool runs.
    #[arg(long)]
    smoke: bool,
}

const DB: &str = "pgbatch";

/// The primary and its replica.
struct Deployment {
    primary: Cluster,
    replica: Cluster,
}

async fn deployment(objects: u64) -> anyhow::Result<Deployment> {
    let roomy = |o: embedded_pg::ClusterOptions| {
        o.setting("shared_buffers", "256MB")
            .setting("max_connections", "300")
    };
    let primary = Cluster::start(roomy(embedded_pg::testing::private_options()?)).await?;
    let admin = Postgres::from(primary.config("postgres")).connect().await?;
    admin
        .batch_execute(&format!("CREATE DATABASE {DB}"))
        .await?;
    let config = primary.config(DB);
    eprintln!("migrating and seeding {objects} objects");
    server::testing::prepare(&config, objects, 0, ADMIN_TOKEN).await?;
    let replica = Cluster::start(roomy(
        embedded_pg::testing::private_options()?.replica_of(&primary),
    ))
    .await?;
    Ok(Deployment { primary, replica })
}

impl Deployment {
    /// `n` instances, reading from the replica or not, each with its
    /// listener up (and the replica usable).
    async fn instances(
        &self,
        n: usize,
        with_replica: bool,
        pool_size: usize,
    ) -> anyhow::Result<Vec<AppState>> {
        let settings = Settings {
            read: ReadSettings {
                path: ReadPath::Batched,
                timeout: Duration::from_secs(5),
                ..ReadSettings::default()
            },
            ..Settings::default()
        };
        let replicas: Vec<Postgres> = if with_replica {
            vec![self.replica.config(DB).into()]
        } else {
            Vec::new()
        };
        let mut states = Vec::new();
        for _ in 0..n {
            let state = AppState::connect_with_replicas(
                self.primary.config(DB),
                &replicas,
                pool_size,
                &settings,
            )?;
            let start = std::time::Instant::now();
            while !(state.coherence.connects() >= 1
                && state.router.replicas().iter().all(|r| r.usable))
            {
                anyhow::ensure!(
                    start.elapsed() < Duration::from_secs(30),
                    "an instance did not come up (listener or replica)"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            states.push(state);
        }
        Ok(states)
    }
}

/// One setup's run: what it measured and where its reads went.
struct Run {
    report: RunReport,
    replica_share: f64,
}

async fn run(
    d: &Deployment,
    args: &Args,
    instances: usize,
    with_replica: bool,
) -> anyhow::Result<Run> {
    let states = d.instances(instances, with_replica, args.pool_size).await?;
    let routers: Vec<_> = states.iter().map(|s| server::app(s.clone())).collect();
    let routers = std::sync::Arc::new(routers);
    let request = move |key: u64| {
        let routers = std::sync::Arc::clone(&routers);
        async move {
            let router = &routers[(key % routers.len() as u64) as usize];
            let uri = format!(
                "/api/v1/repositories/demo/objects/stat?path={}",
                object_path(1 + key)
            );
            let req = Request::get(uri)
                .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
                .body(Body::empty())
                .expect("a valid request");
            let res = router.clone().oneshot(req).await.expect("infallible");
            assert_eq!(res.status(), StatusCode::OK, "every read is answered");
            let _ = axum::body::to_bytes(res.into_body(), usize::MAX).await;
        }
    };
    // Warm: pools, the batchers, Postgres's buffers.
    closed_loop(
        args.callers,
        Duration::from_millis(500),
        args.objects,
        request.clone(),
    )
    .await;
    let before: Vec<_> = states.iter().map(reads_of).collect();
    let report = closed_loop(
        args.callers,
        Duration::from_secs_f64(args.runs.seconds),
        args.objects,
        request,
    )
    .await;
    let (mut replica, mut primary) = (0, 0);
    for (state, (r0, p0)) in states.iter().zip(before) {
        let (r, p) = reads_of(state);
        replica += r - r0;
        primary += p - p0;
    }
    for state in &states {
        state.shutdown().await;
    }
    let total = (replica + primary).max(1);
    Ok(Run {
        report,
        replica_share: replica as f64 / total as f64,
    })
}

/// Database reads (batches and single lookups) the replica and the primary
/// served.
fn reads_of(state: &AppState) -> (u64, u64) {
    let replica = state.router.replicas().iter().map(|r| r.reads).sum();
    (replica, state.router.primary_reads())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.objects = 2_000;
        args.runs.seconds = 0.5;
        args.runs.rounds = 1;
        args.callers = 16;
    }
    let d = deployment(args.objects).await?;
    let version = {
        let c = Postgres::from(d.primary.config(DB)).connect().await?;
        let row = c.query_one("SHOW server_version", &[]).await?;
        row.get::<_, String>(0)
    };
    if let Some(n) = args.hold {
        return hold(&d, &args, n).await;
    }
    let setups: [(&str, usize, bool); 4] = [
        ("1 instance, primary only", 1, false),
        ("1 instance + replica", 1, true),
        ("3 instances + replica", 3, true),
        ("3 instances, primary only", 3, false),
    ];
    let mut rounds: Vec<Vec<Run>> = setups.iter().map(|_| Vec::new()).collect();
    for round in 0..args.runs.rounds.max(1) {
        for (i, &(name, n, with_replica)) in setups.iter().enumerate() {
            eprintln!("round {}/{}: {name}", round + 1, args.runs.rounds.max(1));
            rounds[i].push(run(&d, &args, n, with_replica).await?);
        }
    }
    let medians: Vec<Run> = rounds
        .into_iter()
        .map(|mut runs| {
            runs.sort_by(|a, b| a.report.per_sec().total_cmp(&b.report.per_sec()));
            let spread = (
                runs[0].report.per_sec(),
                runs[runs.len() - 1].report.per_sec(),
            );
            (runs.swap_remove(runs.len() / 2), spread)
        })
        .map(|(m, spread)| {
            eprintln!("  rounds ranged {:.0}..{:.0} reads/s", spread.0, spread.1);
            m
        })
        .collect();
    let base = &medians[0].report;
    println!(
        "\nPostgreSQL {version}; {} objects; {} callers spread over the instances; \
         batched read path; median of {} rounds of {:.1} s\n",
        args.objects,
        args.callers,
        args.runs.rounds.max(1),
        args.runs.seconds
    );
    print_markdown(
        &[
            ("setup", Align::Left),
            ("reads/s", Align::Right),
            ("vs baseline", Align::Right),
            ("p50", Align::Right),
            ("p99", Align::Right),
            ("vs baseline p99", Align::Right),
            ("reads served by the replica", Align::Right),
        ],
        setups.iter().zip(&medians).map(|((name, _, _), run)| {
            let r = &run.report;
            vec![
                (*name).to_owned(),
                format!("{:.0}", r.per_sec()),
                format!("{:.2}x", r.per_sec() / base.per_sec()),
                format!("{:.2} ms", r.quantile(0.5).as_secs_f64() * 1e3),
                format!("{:.2} ms", r.quantile(0.99).as_secs_f64() * 1e3),
                format!(
                    "{:.2}x",
                    r.quantile(0.99).as_secs_f64() / base.quantile(0.99).as_secs_f64()
                ),
                format!("{:.0}%", run.replica_share * 100.0),
            ]
        }),
    );
    d.replica.stop().await;
    d.primary.stop().await;
    Ok(())
}

/// Serves `n` instances on their own ports until Ctrl-C.
async fn hold(d: &Deployment, args: &Args, n: usize) -> anyhow::Result<()> {
    let states = d.instances(n, true, args.pool_size).await?;
    let mut servers = Vec::new();
    for (i, state) in states.iter().enumerate() {
        let port = args.port + u16::try_from(i)?;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        let router = server::app(state.clone());
        servers.push(tokio::spawn(
            async move { axum::serve(listener, router).await },
        ));
        println!("instance {i}: http://127.0.0.1:{port}");
    }
    println!(
        "primary: {:?}\nreplica: {:?}\nadmin token: {ADMIN_TOKEN}\n\
         try: curl -si -X PUT -H 'authorization: Bearer {ADMIN_TOKEN}' -H 'content-type: application/json' \
         -d '{{\"physical_address\":\"s3://x\",\"size_bytes\":1,\"checksum\":\"c\"}}' \
         'http://127.0.0.1:{}/api/v1/repositories/demo/objects?path=new' \
         (note its x-pgbatch-lsn), then read it from another port with that header.\n\
         Ctrl-C stops everything.",
        d.primary.config(DB).get_hosts(),
        d.replica.config(DB).get_hosts(),
        args.port
    );
    tokio::signal::ctrl_c().await?;
    for server in servers {
        server.abort();
    }
    for state in &states {
        state.shutdown().await;
    }
    d.replica.stop().await;
    d.primary.stop().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_flags_keep_their_defaults() {
        let args = Args::try_parse_from(["replicas"]).expect("the defaults parse");
        let (seconds, rounds): (f64, usize) = (args.runs.seconds, args.runs.rounds);
        assert_eq!((seconds, rounds), (5.0, 3));
    }
}
