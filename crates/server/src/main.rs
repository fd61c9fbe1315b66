//! The object-metadata service: reads the configuration, opens the database
//! (embedded by default), applies migrations, seeds demo data into empty
//! tables, and serves HTTP until SIGINT or SIGTERM.

use anyhow::Context as _;
use clap::Parser;
use server::config::{Cli, Command, ServeArgs};
use server::db::{self, Database};
use server::seed::{self, SeedReport};
use server::{app, AppState};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,tower_http=warn".into()),
        )
        .init();
    let cli = Cli::parse();
    let database = Database::open(&cli.db).await?;
    let result = run(&cli, &database).await;
    // Stop the embedded Postgres cleanly whether or not serving failed.
    database.close().await;
    result
}

async fn run(cli: &Cli, database: &Database) -> anyhow::Result<()> {
    db::migrate(&database.config).await?;
    match &cli.command {
        Some(Command::Seed(args)) => {
            let report = seed::seed(&database.config, args.objects, args.kv_rows).await?;
            print_seed_report(&report);
            Ok(())
        }
        Some(Command::Serve) | None => serve(cli, database).await,
    }
}

async fn serve(cli: &Cli, database: &Database) -> anyhow::Result<()> {
    let args: &ServeArgs = &cli.serve;
    if args.seed_objects > 0 || args.seed_kv_rows > 0 {
        let report = seed::seed(&database.config, args.seed_objects, args.seed_kv_rows).await?;
        if report.objects.rows + report.kv.rows > 0 {
            print_seed_report(&report);
        }
    }

    let pool = db::pool(&database.config, cli.db.pool_size, args.request_timeout())?;
    let state = AppState::new(pool.clone(), args)?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("could not listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, read_path = ?args.read_path, "serving");
    print_try_it(&addr.to_string());

    axum::serve(listener, app(state.clone()))
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("server failed")?;
    tracing::info!("in-flight requests finished; stopping");
    state.reader.shutdown().await;
    pool.close();
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await; // no handler: then only SIGTERM stops us
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutdown requested");
}

fn print_seed_report(r: &SeedReport) {
    for (name, t) in [("objects", r.objects), ("random_read_test", r.kv)] {
        if t.skipped {
            println!("seed: {name}: already has rows, left as is");
        } else if t.rows > 0 {
            println!(
                "seed: {name}: {} rows in {:.1} s ({:.0} rows/s)",
                t.rows,
                t.elapsed.as_secs_f64(),
                t.rows_per_sec()
            );
        }
    }
    println!(
        "seed: total {} rows in {:.1} s ({:.0} rows/s)",
        r.objects.rows + r.kv.rows,
        r.elapsed.as_secs_f64(),
        r.rows_per_sec()
    );
}

fn print_try_it(addr: &str) {
    let base = format!("http://{addr}");
    let path = seed::object_path(1);
    let repo = seed::DEMO_REPOSITORY;
    println!(
        r#"
Serving on {base}. Try:

  curl -s '{base}/api/v1/repositories/{repo}/objects/stat?path={path}'
  curl -s -X POST -H 'content-type: application/json' \
       -d '{{"paths": ["{path}", "{p2}", "no/such/object"]}}' \
       '{base}/api/v1/repositories/{repo}/objects/stat'
  curl -s '{base}/api/v1/kv/{pk}'
  curl -s '{base}/readyz'
  curl -s '{base}/metrics'

Stop with Ctrl-C.
"#,
        p2 = seed::object_path(2),
        pk = seed::kv_pk(42),
    );
}
