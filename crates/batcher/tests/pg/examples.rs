//! Every Postgres example, run as its user would run it: the built binary,
//! `DATABASE_URL` naming a database of its own, exits 0 and prints its
//! result. (`cargo test` builds the examples before it runs the tests.)

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use tokio_postgres::config::Host;

/// The example binary `name`, beside this test's binary's folder.
fn example(name: &str) -> PathBuf {
    let test = std::env::current_exe().expect("the test binary's path");
    let path = test
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples").join(name))
        .expect("target/<profile>/examples");
    assert!(
        path.exists(),
        "{} is not built: run the tests with `cargo test` (which builds the examples), \
         or `cargo build -p pgbatch --examples --all-features` first",
        path.display()
    );
    path
}

/// A URL both drivers read for `config`: user, host (a socket directory
/// percent-encoded, as libpq writes it), port and database.
fn url(config: &tokio_postgres::Config) -> String {
    let host = match &config.get_hosts()[0] {
        Host::Tcp(host) => host.clone(),
        Host::Unix(dir) => {
            utf8_percent_encode(&dir.to_string_lossy(), NON_ALPHANUMERIC).to_string()
        }
    };
    let user = config.get_user().unwrap_or("postgres");
    let password = config
        .get_password()
        .map(|p| format!(":{}", String::from_utf8_lossy(p)))
        .unwrap_or_default();
    format!(
        "postgresql://{user}{password}@{host}:{}/{}",
        config.get_ports().first().copied().unwrap_or(5432),
        config.get_dbname().expect("a database")
    )
}

/// Runs example `name` with `args` against a fresh database; its stdout.
async fn run(name: &str, args: &[&str]) -> String {
    let (success, stdout, stderr) = run_to_end(name, args).await;
    assert!(success, "{name} failed:\n{stdout}\n{stderr}");
    stdout
}

/// Runs example `name` with `args` against a fresh database: whether it
/// exited 0, its stdout and its stderr.
async fn run_to_end(name: &str, args: &[&str]) -> (bool, String, String) {
    let binary = example(name);
    let db = embedded_pg::testing::database()
        .await
        .expect("test database");
    let url = url(&db.config);
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let run = tokio::task::spawn_blocking(move || {
        Command::new(&binary)
            .args(&args)
            .env("DATABASE_URL", &url)
            .output()
            .expect("the example starts")
    });
    let output = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the example exits within 2 minutes")
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn pg_loader_runs_against_the_database_and_exits() {
    let out = run("pg_loader", &[]).await;
    assert!(out.contains("1428 of 2000 found with"), "{out}");
}

#[tokio::test]
async fn sqlx_loader_runs_against_the_database_and_exits() {
    let out = run("sqlx_loader", &[]).await;
    assert!(out.contains("1428 of 2000 found with"), "{out}");
}

#[tokio::test]
async fn graphql_once_answers_each_tenant_and_exits() {
    let out = run("graphql", &["--once"]).await;
    for tenant in 0..3 {
        assert!(
            out.contains(&format!("tenant {tenant}: 200 books, each with its author")),
            "{out}"
        );
    }
    assert!(out.contains("author lookups:"), "{out}");
    for tenant in 0..3 {
        assert!(
            out.contains(&format!(
                "tenant {tenant}: authors, their books and reviews in statements: 1 for authors, \
                 1 for books, 1 for reviews"
            )),
            "{out}"
        );
    }
}

/// The `N` numbers of the line of `out` that starts with `start`.
fn numbers<const N: usize>(out: &str, start: &str) -> [u64; N] {
    let line = out
        .lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("a line starting {start:?}: {out}"));
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|part| !part.is_empty())
        .map(|part| part.parse().unwrap())
        .collect();
    numbers
        .try_into()
        .unwrap_or_else(|n| panic!("{N} numbers in {line}: {n:?}"))
}

/// The `tenants` example's summary, "scopes S, reads N, loads M, found F
/// of E expected, leaks L".
fn tenants_summary(out: &str) -> [u64; 6] {
    numbers(out, "scopes ")
}

#[tokio::test]
async fn tenants_reads_each_tenants_view_with_no_leak() {
    let out = run("tenants", &[]).await;
    let [scopes, reads, loads, found, expected, leaks] = tenants_summary(&out);
    assert!(scopes >= 10, "{out}");
    assert!(reads >= 10_000, "{out}");
    assert_eq!(leaks, 0, "{out}");
    assert!(found > 0 && found == expected, "{out}");
    assert!(expected < reads, "some reads are of others' notes: {out}");
    assert!(reads >= 10 * loads, "at least 10 reads per load: {out}");
    // "public notes: R reads of N notes from T tenants, L loads, wrong W"
    let [reads, notes, _, loads, wrong] = numbers(&out, "public notes: ");
    assert_eq!(wrong, 0, "{out}");
    // One scope for every tenant's public reads: a load carries many of
    // them, and the cache answers the rest (a note is loaded at most
    // twice: the cache's admission may pass over its first value).
    assert!(loads <= 2 * notes && reads >= 80 * loads, "{out}");
}

#[tokio::test]
async fn tenants_reports_the_leak_of_a_loader_that_ignores_the_scope() {
    let (success, out, err) = run_to_end("tenants", &["--unscoped"]).await;
    assert!(!success, "a leaky loader must fail the example: {out}");
    let [.., found, expected, leaks] = tenants_summary(&out);
    assert!(leaks > 0 && found > expected, "{out}");
    assert!(err.contains("answers were another tenant's"), "{err}");
}
