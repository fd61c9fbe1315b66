//! A toxiproxy server (Shopify's TCP fault-injection proxy, installed by
//! `scripts/ensure-bench-tools.sh`) driven through its own CLI, to add
//! round-trip time between the load generator and Postgres. This kernel has
//! no `netem`, so latency has to come from a proxy in user space.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use tokio::process::{Child, Command};

/// Where `scripts/ensure-bench-tools.sh` installs the toxiproxy binaries.
pub const TOOLS_DIR: &str = "target/tools/bin";

/// A running toxiproxy server; killed when dropped.
#[derive(Debug)]
pub struct Toxiproxy {
    cli: PathBuf,
    api: SocketAddr,
    _server: Child,
}

/// A free loopback port: bound by the OS, then released for the caller.
///
/// # Errors
///
/// When no port can be bound.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Finds `name` in `dir`, else on `PATH`.
fn find(dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let local = dir.join(name);
    if local.is_file() {
        return Ok(local);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "`{name}` is neither in {} nor on PATH; run ./scripts/ensure-bench-tools.sh",
                dir.display()
            )
        })
}

impl Toxiproxy {
    /// Starts `toxiproxy-server` (from `tools_dir` or `PATH`) with its API
    /// on a free loopback port and waits until the API answers.
    ///
    /// # Errors
    ///
    /// When the binaries are missing or the server does not come up.
    pub async fn start(tools_dir: &Path) -> anyhow::Result<Self> {
        let server = find(tools_dir, "toxiproxy-server")?;
        let cli = find(tools_dir, "toxiproxy-cli")?;
        let api = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let child = Command::new(&server)
            .args(["-host", "127.0.0.1", "-port", &api.port().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("could not start {}", server.display()))?;
        let proxy = Self {
            cli,
            api,
            _server: child,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while proxy.run(&["list"]).await.is_err() {
            if Instant::now() > deadline {
                bail!("toxiproxy's API did not answer on {api} within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(proxy)
    }

    async fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(&self.cli)
            .arg("--host")
            .arg(format!("http://{}", self.api))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .with_context(|| format!("could not run {}", self.cli.display()))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            bail!("toxiproxy-cli {}: {}", args.join(" "), text.trim());
        }
        Ok(text)
    }

    /// A proxy named `name` from a free loopback port to `upstream` that
    /// adds `rtt` of round-trip time, returning the address it listens on.
    ///
    /// toxiproxy's latency is whole milliseconds, each way, so the delay is
    /// put on the downstream (server to client) direction. A half
    /// millisecond is a 1 ms latency with 1 ms of jitter: each chunk is
    /// delayed 0 or 1 ms, 0.5 ms on average. Measure the result rather than
    /// trust it ([`crate::reads::round_trip`]).
    ///
    /// # Errors
    ///
    /// When `rtt` is not a multiple of 0.5 ms, or toxiproxy refuses.
    pub async fn proxy(
        &self,
        name: &str,
        upstream: SocketAddr,
        rtt: Duration,
    ) -> anyhow::Result<SocketAddr> {
        let half_ms = rtt.as_micros() / 500;
        if half_ms * 500 != rtt.as_micros() {
            bail!("toxiproxy adds whole or half milliseconds, not {rtt:?}");
        }
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        self.run(&[
            "create",
            "--listen",
            &listen.to_string(),
            "--upstream",
            &upstream.to_string(),
            name,
        ])
        .await?;
        if half_ms > 0 {
            let (latency, jitter) = (half_ms.div_ceil(2), half_ms % 2);
            self.run(&[
                "toxic",
                "add",
                "--type",
                "latency",
                "--downstream",
                "--toxicity",
                "1.0",
                "--toxicName",
                "rtt",
                "--attribute",
                &format!("latency={latency}"),
                "--attribute",
                &format!("jitter={jitter}"),
                name,
            ])
            .await?;
        }
        Ok(listen)
    }
}
