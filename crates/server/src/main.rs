//! The object-metadata service: reads the configuration, opens the database
//! (embedded by default), applies migrations, seeds demo data into empty
//! tables, and serves HTTP until SIGINT or SIGTERM.

use std::path::Path;

use anyhow::Context as _;
use clap::Parser;
use server::cli::{Cli, Command, ServeArgs, TokenCommand, UserCommand};
use server::db::queries::kv::kv_pk;
use server::db::seed::{self, SeedReport};
use server::db::{self, Database, Postgres};
use server::domain::auth;
use server::{app, AppState};

/// mimalloc instead of glibc's malloc: per request, the server allocates
/// and frees many small buffers across threads (hyper, tokio-postgres,
/// JSON), and glibc spent 10-17% of the server's CPU on it
/// (BENCHMARKS.md, "Over HTTP").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Logs go to standard error, so standard output carries only what a
    // command prints for scripts (a token, a report): `TOKEN=$(server
    // token create alice)` captures the token alone.
    let _logs = server::logs::init(cli.log_format.into());
    let settings = cli.db.settings();
    // Admin commands use a running server's cluster instead of starting a
    // second postmaster on its directory; `serve` refuses to share one.
    let database = match cli.command {
        None | Some(Command::Serve(_)) => Database::open(&settings).await?,
        Some(_) => Database::open_or_attach(&settings).await?,
    };
    let result = run(&cli, &database).await;
    // Stop the embedded Postgres cleanly whether or not serving failed.
    database.close().await;
    result
}

async fn run(cli: &Cli, database: &Database) -> anyhow::Result<()> {
    // Through the direct URL when there is one; refinery's statements are
    // safe through a transaction-mode pooler too.
    db::migrate(session(database)).await?;
    match &cli.command {
        Some(Command::Seed(args)) => {
            let report = seed::seed(database, args.objects, args.kv_rows).await?;
            print_seed_report(&report);
            Ok(())
        }
        Some(Command::User(UserCommand::Create { name, read, write })) => {
            let mut client = connect(database).await?;
            auth::create_user(&mut client, name, read, write).await?;
            println!("created user `{name}`");
            Ok(())
        }
        Some(Command::User(UserCommand::List)) => {
            let client = connect(database).await?;
            for (name, grants) in db::queries::auth::list_users(&client).await? {
                let grants: Vec<String> = grants
                    .iter()
                    .map(|g| {
                        let what = if g.write { "write" } else { "read" };
                        format!("{what}:{}", g.repository)
                    })
                    .collect();
                println!("{name}\t{}", grants.join(","));
            }
            Ok(())
        }
        Some(Command::User(UserCommand::Delete { name })) => {
            let client = connect(database).await?;
            match db::queries::auth::delete_user(&client, name).await? {
                Some(tokens) => {
                    println!("deleted user `{name}` and its {} token(s)", tokens.len());
                    Ok(())
                }
                None => anyhow::bail!("no user named `{name}`"),
            }
        }
        Some(Command::Token(TokenCommand::List { user })) => {
            let client = connect(database).await?;
            for t in db::queries::auth::list_tokens(&client, user.as_deref()).await? {
                let expires = t
                    .expires_at
                    .map_or_else(|| "never".to_owned(), |e| e.to_string());
                println!(
                    "{}\t{}\t{}\t{expires}\t{}",
                    t.id, t.user, t.created_at, t.description
                );
            }
            Ok(())
        }
        Some(Command::Token(TokenCommand::Revoke { id })) => {
            server::domain::input::token_id(id)?;
            let client = connect(database).await?;
            let gone = db::queries::auth::delete_token(&client, id, None).await?;
            anyhow::ensure!(!gone.is_empty(), "no token with id `{id}`");
            println!("revoked token {id}");
            Ok(())
        }
        Some(Command::Token(TokenCommand::Create {
            user,
            description,
            expires_in,
        })) => {
            let client = connect(database).await?;
            let token = auth::new_token()?;
            auth::add_expiring_token(&client, user, &token, description, *expires_in).await?;
            println!("{token}");
            eprintln!("(stored only hashed: keep it now, it cannot be shown again)");
            eprintln!(
                "for lakeFS's clients (/lakefs): access key id {}, secret access key: the token",
                auth::token_id(&token)
            );
            Ok(())
        }
        Some(Command::Serve(args)) => serve(cli, args, database).await,
        None => serve(cli, &cli.serve, database).await,
    }
}

/// Where the admin commands and migrations connect: the direct URL when
/// there is one, else the database itself (their statements are unnamed or
/// inside transactions, so a pooler in between does no harm).
fn session(database: &Database) -> Postgres {
    database
        .direct
        .clone()
        .unwrap_or_else(|| Postgres::from(database))
}

async fn connect(database: &Database) -> anyhow::Result<tokio_postgres::Client> {
    Ok(session(database).connect().await?)
}

async fn serve(cli: &Cli, args: &ServeArgs, database: &Database) -> anyhow::Result<()> {
    // An operator's own database gets demo rows and an admin only when
    // asked; the embedded cluster is the demo's, and gets both.
    let embedded = database.cluster.is_some();
    let (objects, kv_rows) = args.seed_rows(embedded);
    if objects > 0 || kv_rows > 0 {
        let report = seed::seed(database, objects, kv_rows).await?;
        if report.objects.rows + report.kv.rows > 0 {
            print_seed_report(&report);
        }
    }

    let token_file = &cli.db.admin_token_file;
    let new_admin_token = if args.creates_admin(embedded) {
        auth::bootstrap_admin(database, args.admin_token.as_deref()).await?
    } else {
        None
    };
    if let Some(token) = &new_admin_token {
        write_secret(token_file, token)?;
    }

    let settings = args.settings();
    let state = AppState::for_database(database, cli.db.pool_size, &settings)?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("could not listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let edge = args.edge();
    tracing::info!(%addr, read_path = ?settings.read.path, pooler = ?database.pooler, ?edge, "serving");
    print_try_it(&addr.to_string(), new_admin_token.as_deref(), token_file);

    server::http::serve::serve(listener, app(state.clone()), edge, shutdown_signal())
        .await
        .context("server failed")?;
    tracing::info!("stopped serving HTTP; stopping");
    // Commit and acknowledge queued writes, answer queued reads.
    state.shutdown().await;
    Ok(())
}

/// Writes `secret` to `path` (creating its directory) readable by its owner
/// only.
fn write_secret(path: &Path, secret: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("could not create {}", dir.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("could not write {}", path.display()))?;
    writeln!(f, "{secret}")?;
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

fn print_try_it(addr: &str, new_admin_token: Option<&str>, token_file: &Path) {
    let base = format!("http://{addr}");
    let path = seed::object_path(1);
    let repo = seed::DEMO_REPOSITORY;
    let file = token_file.display();
    if let Some(token) = new_admin_token {
        println!(
            "\nCreated user `admin` with token (shown once, stored only hashed):\n\n  {token}\n\n\
             It was also written to {file}."
        );
    }
    println!(
        r#"
Serving on {base}. Every /api request needs the token. Try:

  {token_line}
  curl -s -H "Authorization: Bearer $TOKEN" '{base}/api/v1/repositories/{repo}/objects/stat?path={path}'
  curl -s -H "Authorization: Bearer $TOKEN" -X POST -H 'content-type: application/json' \
       -d '{{"paths": ["{path}", "{p2}", "no/such/object"]}}' \
       '{base}/api/v1/repositories/{repo}/objects/stat'
  curl -s -H "Authorization: Bearer $TOKEN" '{base}/api/v1/kv/{pk}'
  curl -s '{base}/readyz'
  curl -s '{base}/metrics'

Stop with Ctrl-C.
"#,
        p2 = seed::object_path(2),
        pk = kv_pk(42),
        token_line = if token_file.exists() {
            format!("TOKEN=$(cat {file})")
        } else {
            "TOKEN=...   # an admin token; `server token create admin` makes one".to_owned()
        },
    );
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn the_token_file_is_written_for_its_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sub/admin-token");
        write_secret(&file, "pgb_secret").unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), "pgb_secret");
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
