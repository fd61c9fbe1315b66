//! A PgBouncer in front of a [`Cluster`], for tests of a service behind a
//! connection pooler, as managed Postgres offerings put one in front of
//! the database.
//!
//! It runs the installed `pgbouncer` (Debian's package:
//! `scripts/ensure-pgbouncer.sh` installs it), in the foreground, as the same
//! OS user as the cluster (PgBouncer refuses to run as root), under the
//! same supervisor as the cluster: it stops when its owner drops it or
//! dies.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio_postgres::NoTls;

use crate::cluster::RunAs;
use crate::{Cluster, Error};

/// How PgBouncer assigns server connections to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// A client keeps its server connection for its whole session.
    Session,
    /// A client gets a server connection per transaction (or per statement
    /// outside one), possibly a different one each time: the default of
    /// most managed offerings' pooled endpoints.
    Transaction,
}

impl PoolMode {
    fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        }
    }
}

/// A running PgBouncer, stopped when dropped.
#[derive(Debug)]
pub struct PgBouncer {
    port: u16,
    dir: PathBuf,
    child: Mutex<Child>,
    lifeline: Mutex<Option<ChildStdin>>,
}

/// Runs its arguments as a child and stops it (SIGTERM: PgBouncer's
/// immediate shutdown) once its own stdin closes: when the `PgBouncer` is
/// dropped, or its owner dies.
const SUPERVISOR: &str = r#"
exec 3<&0
"$@" </dev/null &
child=$!
{ cat >/dev/null <&3; kill -TERM "$child" 2>/dev/null; } &
wait "$child"
"#;

/// Whether `binary` is PgBouncer 1.21 or later, which has
/// `max_prepared_statements`.
fn tracks_prepared_statements(binary: &Path) -> bool {
    let Ok(out) = Command::new(binary).arg("--version").output() else {
        return false;
    };
    // "PgBouncer 1.18.0" on its first line.
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_default();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (1, 21)
}

/// Where Debian's package puts the binary.
const BINARY: &str = "/usr/sbin/pgbouncer";

impl PgBouncer {
    /// Starts PgBouncer in `mode` in front of `cluster`, listening on a free
    /// loopback port, with `server_connections` server connections per
    /// database and user: few, so that clients really share them.
    ///
    /// # Errors
    ///
    /// When PgBouncer is not installed (the message says how to install
    /// it), or does not start accepting connections within 10 s.
    pub async fn start(
        cluster: &Cluster,
        mode: PoolMode,
        server_connections: usize,
    ) -> Result<Self, Error> {
        let binary = find_binary()?;
        let run_as = RunAs::detect()?;
        // Beside the data directory, named after it (not `with_extension`:
        // a directory named `1234.private-5` has an "extension").
        let mut name = cluster.data_dir().as_os_str().to_owned();
        name.push(format!(".pgbouncer-{}", mode.as_str()));
        let dir = PathBuf::from(name);
        fs::create_dir_all(&dir).map_err(|source| Error::Io {
            what: "could not create",
            path: dir.clone(),
            source,
        })?;
        run_as.own(&dir)?;
        let port = crate::cluster::fresh_port(&dir)?;
        let users = dir.join("userlist.txt");
        // Trust on loopback, as the cluster trusts its socket; a user must
        // still be listed.
        write_owned(&users, "\"postgres\" \"\"\n", run_as)?;
        let ini = dir.join("pgbouncer.ini");
        let config = format!(
            "[databases]\n\
             * = host={socket} port={cluster_port}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {users}\n\
             pool_mode = {mode}\n\
             max_client_conn = 1000\n\
             default_pool_size = {server_connections}\n\
             ignore_startup_parameters = extra_float_digits\n\
             {prepared}",
            // From 1.21 PgBouncer can carry named statements across server
            // connections, and from 1.24 does by default: these tests want
            // a pooler that does not, as the ones managed Postgres fronts
            // with mostly do (1.18 refuses the setting it does not know).
            prepared = if tracks_prepared_statements(&binary) {
                "max_prepared_statements = 0\n"
            } else {
                ""
            },
            socket = cluster.socket_dir().display(),
            cluster_port = cluster.port(),
            users = users.display(),
            mode = mode.as_str(),
        );
        write_owned(&ini, &config, run_as)?;
        let log_path = dir.join("pgbouncer.log");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|source| Error::Io {
                what: "could not open",
                path: log_path.clone(),
                source,
            })?;
        let log_err = log.try_clone().map_err(|source| Error::Io {
            what: "could not open",
            path: log_path.clone(),
            source,
        })?;
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(SUPERVISOR)
            .arg("pgbouncer-supervisor")
            .arg(&binary)
            .arg(&ini)
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        run_as.apply(&mut cmd);
        let mut child = cmd.spawn().map_err(|source| Error::Io {
            what: "could not start",
            path: binary.clone(),
            source,
        })?;
        let lifeline = child.stdin.take();
        let bouncer = Self {
            port,
            dir,
            child: Mutex::new(child),
            lifeline: Mutex::new(lifeline),
        };
        bouncer.wait_ready(&log_path).await?;
        Ok(bouncer)
    }

    async fn wait_ready(&self, log_path: &Path) -> Result<(), Error> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let exited = self
                .child
                .lock()
                .expect("child lock")
                .try_wait()
                .ok()
                .flatten();
            if let Some(status) = exited {
                return Err(Error::Command {
                    program: "pgbouncer",
                    output: format!(
                        "exited with {status}: {}",
                        fs::read_to_string(log_path).unwrap_or_default()
                    ),
                });
            }
            let mut config = self.config("postgres");
            config.connect_timeout(Duration::from_secs(2));
            if let Ok((client, conn)) = config.connect(NoTls).await {
                let conn = tokio::spawn(conn);
                let answered = client.simple_query("SELECT 1").await.is_ok();
                drop(client);
                let _ = conn.await; // ends as the client is dropped
                if answered {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(Error::Command {
                    program: "pgbouncer",
                    output: format!(
                        "not accepting connections after 10 s: {}",
                        fs::read_to_string(log_path).unwrap_or_default()
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Connection settings for database `dbname` through the pooler, as
    /// the superuser `postgres`, over loopback TCP.
    pub fn config(&self, dbname: &str) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname(dbname);
        config
    }

    /// The `postgres://` URL of database `dbname` through the pooler.
    pub fn url(&self, dbname: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{dbname}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops it and waits for it to exit.
    pub fn stop(&self) {
        // Closing its stdin makes the supervisor stop it.
        self.lifeline.lock().expect("lifeline lock").take();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut child = self.child.lock().expect("child lock");
        while matches!(child.try_wait(), Ok(None)) {
            if Instant::now() >= deadline {
                let _ = child.kill(); // best effort; it may have just exited
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.stop();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn write_owned(path: &Path, text: &str, run_as: RunAs) -> Result<(), Error> {
    fs::write(path, text).map_err(|source| Error::Io {
        what: "could not write",
        path: path.to_owned(),
        source,
    })?;
    run_as.own(path)
}

fn find_binary() -> Result<PathBuf, Error> {
    if let Some(path) = std::env::var_os("PGBOUNCER").map(PathBuf::from) {
        if path.is_file() {
            return Ok(path);
        }
    }
    let path = PathBuf::from(BINARY);
    if path.is_file() {
        return Ok(path);
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("pgbouncer"))
        .find(|p| p.is_file())
        .ok_or(Error::PgBouncerNotFound)
}
