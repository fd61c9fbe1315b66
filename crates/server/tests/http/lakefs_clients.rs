//! lakeFS's own Python clients (`lakefs-sdk` 1.88.0 and `lakefs` 0.16.0,
//! from PyPI, in a private virtual environment that
//! `scripts/ensure-lakefs-clients.sh` makes) against a live server's
//! `/lakefs` API: a repository created, objects staged and linked, stat,
//! exists, listings paged with a delimiter, deletes, the current user, and
//! the errors for a missing object, a wrong ref and a bad credential. The
//! checks are in `tests/lakefs/clients.py`; where the answers follow
//! lakeFS's own where they once differed (501 for what is not served, 401
//! for a missing permission, mtime kept, deleteObjects per path, a head
//! commit id, limits and flags), in `tests/lakefs/fidelity.py`.

use crate::support;

use std::path::PathBuf;
use std::time::Duration;

use crate::support::{LiveServer, ADMIN_TOKEN};
use server::settings::Settings;

/// Runs `script` (in `tests/lakefs/`) with lakeFS's clients against a
/// live server over `app`, as the admin, with `extra` in its environment.
async fn run_clients(script: &str, app: support::TestApp, extra: Vec<(&str, String)>) {
    let python = tokio::task::spawn_blocking(|| support::venv_python("ensure-lakefs-clients.sh"))
        .await
        .unwrap();
    let live = LiveServer::start(app.router.clone()).await;
    let addr = live.addr;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/lakefs")
        .join(script);
    let run = tokio::process::Command::new(&python)
        .arg(&script)
        .env("LAKEFS_HOST", format!("http://{addr}/lakefs"))
        .env(
            "LAKEFS_ACCESS_KEY_ID",
            server::domain::auth::token_id(ADMIN_TOKEN),
        )
        .env("LAKEFS_SECRET_ACCESS_KEY", ADMIN_TOKEN)
        .envs(extra)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the client script finishes within 2 minutes")
        .unwrap();
    live.stop().await;
    assert!(
        out.status.success(),
        "lakeFS's clients failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lakefs_clients_work_unchanged() {
    let app = support::setup(&Settings::default()).await;
    run_clients("clients.py", app, Vec::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lakefs_clients_get_lakefs_answers() {
    let app = support::setup(&Settings::default()).await;
    // A user who may read repository `demo` only.
    let reader = support::user_with_token(&app.config, "reader").await;
    let extra = vec![
        (
            "LAKEFS_READER_KEY_ID",
            server::domain::auth::token_id(&reader),
        ),
        ("LAKEFS_READER_SECRET", reader),
    ];
    run_clients("fidelity.py", app, extra).await;
}
