//! schemathesis (4.32.5 from PyPI, in a private virtual environment that
//! `scripts/ensure-schemathesis.sh` makes) pointed at a live server's
//! `/api/openapi.json` with an admin token, on a throwaway database: every
//! operation, every check it has (no 5xx; only documented statuses,
//! content types, headers and bodies; requests the document allows are not
//! refused, requests it forbids are; a missing or bad token is refused;
//! unsupported methods are 405 with `Allow`), with a fixed seed and a bound
//! on examples per operation, so a run takes about a minute. It fails on
//! anything schemathesis reports, and prints its report.

use crate::support;

use std::path::PathBuf;
use std::time::Duration;

use crate::support::{LiveServer, ADMIN_TOKEN};
use server::settings::Settings;

/// Examples per operation: 30 (about a minute), or
/// `PGBATCH_FUZZ_EXAMPLES` for a longer run by hand.
fn examples() -> String {
    std::env::var("PGBATCH_FUZZ_EXAMPLES").unwrap_or_else(|_| "30".to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing_against_the_document() {
    let python = tokio::task::spawn_blocking(|| support::venv_python("ensure-schemathesis.sh"))
        .await
        .unwrap();
    let app = support::setup(&Settings::default()).await;
    let live = LiveServer::start(app.router.clone()).await;
    let addr = live.addr;
    let hooks = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openapi");
    // Its working directory takes its report directory and nothing else.
    let scratch = tempfile::tempdir().unwrap();
    let run = tokio::process::Command::new(&python)
        .args(["-m", "schemathesis.cli", "run"])
        .arg(format!("http://{addr}/api/openapi.json"))
        .args(["--header", &format!("Authorization: Bearer {ADMIN_TOKEN}")])
        .args(["--checks", "all"])
        // Its stateful phase follows GET /user/tokens to DELETE
        // /user/tokens/{id} and revokes its own token, after which every
        // operation is 401 and nothing more is tested (tests/domain/auth.rs
        // covers revocation).
        .args(["--exclude-name", "DELETE /api/v1/user/tokens/{id}"])
        .args(["--max-examples", &examples()])
        .args(["--seed", "20261124"])
        .args(["--workers", "1"])
        .args(["--request-timeout", "10"])
        .args(["--generation-database", "none"])
        .arg("--no-color")
        .env("SCHEMATHESIS_HOOKS", "hooks")
        .env("PYTHONPATH", &hooks)
        .current_dir(scratch.path())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(600), run)
        .await
        .expect("schemathesis finishes within 10 minutes")
        .unwrap();
    live.stop().await;
    let report = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{report}");
    assert!(
        out.status.success(),
        "schemathesis reported problems:\n{report}"
    );
}
