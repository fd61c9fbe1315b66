//! lakeFS's own Python clients (`lakefs-sdk` 1.88.0 and `lakefs` 0.16.0,
//! from PyPI, in a private virtual environment that
//! `scripts/ensure-lakefs-clients.sh` makes) against a live server's
//! `/lakefs` API: a repository created, objects staged and linked, stat,
//! exists, listings paged with a delimiter, deletes, the current user, and
//! the errors for a missing object, a wrong ref and a bad credential. The
//! checks are in `tests/lakefs/clients.py`.

#[path = "../support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::time::Duration;

use server::settings::Settings;
use support::{LiveServer, ADMIN_TOKEN};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lakefs_clients_work_unchanged() {
    let python = tokio::task::spawn_blocking(|| support::venv_python("ensure-lakefs-clients.sh"))
        .await
        .unwrap();
    let app = support::setup(&Settings::default()).await;
    let live = LiveServer::start(app.router.clone()).await;
    let addr = live.addr;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/lakefs/clients.py");
    let run = tokio::process::Command::new(&python)
        .arg(&script)
        .env("LAKEFS_HOST", format!("http://{addr}/lakefs"))
        .env(
            "LAKEFS_ACCESS_KEY_ID",
            server::domain::auth::token_id(ADMIN_TOKEN),
        )
        .env("LAKEFS_SECRET_ACCESS_KEY", ADMIN_TOKEN)
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
