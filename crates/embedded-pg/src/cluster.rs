//! Starting and stopping one cluster.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::unistd::{Gid, Uid, User};
use tokio_postgres::NoTls;

use crate::Error;

/// Keeps postgres alive exactly as long as our standard input is open.
///
/// An asynchronous list in a non-interactive shell gets /dev/null as its
/// standard input, so the real one is saved on fd 3 first and handed to the
/// watcher explicitly. The wrapper exits when postgres does, with its status.
const SUPERVISOR: &str = r#"
exec 3<&0
"$@" </dev/null &
pg=$!
{ cat >/dev/null <&3; kill -INT "$pg" 2>/dev/null; } &
wait "$pg"
"#;

/// Unix socket paths are limited to 107 bytes; keep a margin.
const MAX_SOCKET_PATH: usize = 100;

/// How to start a [`Cluster`].
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    data_dir: PathBuf,
    port: u16,
    tcp: bool,
    durable: bool,
    settings: Vec<(String, String)>,
    ready_timeout: Duration,
    /// PEM certificate chain and key for `ssl=on`.
    tls: Option<(String, String)>,
    /// The primary a new data directory is copied from (a streaming
    /// replica), instead of `initdb`.
    primary: Option<PrimarySource>,
}

/// Where a replica's base backup and WAL stream come from: a primary's
/// socket.
#[derive(Debug, Clone)]
struct PrimarySource {
    socket_dir: PathBuf,
    port: u16,
}

impl ClusterOptions {
    /// A cluster in `data_dir`, created there by `initdb` if it does not
    /// exist yet, and reused (data and all) if it does.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            port: 5432,
            tcp: false,
            durable: true,
            settings: Vec::new(),
            ready_timeout: Duration::from_secs(60),
            tls: None,
            primary: None,
        }
    }

    /// Makes this cluster a hot-standby streaming replica of `primary`:
    /// a data directory that does not exist yet is copied from it by
    /// `pg_basebackup -R` (which writes `primary_conninfo` and
    /// `standby.signal`), and the server then replays the primary's WAL
    /// as it streams in, answering read-only queries meanwhile. The
    /// primary must allow replication (`wal_level=replica`, the default,
    /// and WAL senders); its socket's `trust` authentication covers
    /// replication connections. Add
    /// `.setting("recovery_min_apply_delay", "2s")` for a replica that
    /// lags by a known amount.
    pub fn replica_of(mut self, primary: &Cluster) -> Self {
        self.primary = Some(PrimarySource {
            socket_dir: primary.socket_dir.clone(),
            port: primary.port,
        });
        self
    }

    /// The port number. It names the socket file, and is the TCP port when
    /// [`listen_tcp`](Self::listen_tcp) is on. Default 5432.
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// With `true`, the server also listens on TCP at `127.0.0.1:port`
    /// (loopback only, `trust` authentication as on the socket), for
    /// clients that cannot use a Unix socket, such as a TCP proxy that
    /// injects latency. Default `false`.
    pub fn listen_tcp(mut self, on: bool) -> Self {
        self.tcp = on;
        self
    }

    /// With `false`, trade crash safety for speed (`fsync`,
    /// `synchronous_commit` and `full_page_writes` off): for throwaway test
    /// clusters only. Default `true`.
    pub fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// Adds a server setting, as `postgres -c name=value`.
    pub fn setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }

    /// Turns on TLS (`ssl=on`) with this PEM certificate (chain) and
    /// private key, written into the data directory for the server's user
    /// only, as Postgres requires of a key. Clients on TCP may then ask for
    /// TLS; the socket never uses it. For TLS tests.
    pub fn tls(mut self, cert_pem: impl Into<String>, key_pem: impl Into<String>) -> Self {
        self.tls = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// How long to wait for the server to accept connections. Default 60 s.
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }
}

/// The OS user the Postgres programs run as.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RunAs {
    CurrentUser,
    Postgres { uid: Uid, gid: Gid },
}

impl RunAs {
    pub(crate) fn detect() -> Result<Self, Error> {
        if !nix::unistd::geteuid().is_root() {
            return Ok(RunAs::CurrentUser);
        }
        match User::from_name("postgres") {
            Ok(Some(u)) => Ok(RunAs::Postgres {
                uid: u.uid,
                gid: u.gid,
            }),
            _ => Err(Error::NoUnprivilegedUser),
        }
    }

    pub(crate) fn apply(self, cmd: &mut Command) {
        if let RunAs::Postgres { uid, gid } = self {
            // std drops supplementary groups too when root changes uid.
            cmd.uid(uid.as_raw()).gid(gid.as_raw());
        }
    }

    /// Runs `cmd` (the program `name` at `path`) as this user to its end.
    ///
    /// # Errors
    ///
    /// When it cannot be started, or fails: with its output.
    fn run(self, mut cmd: Command, name: &'static str, path: &Path) -> Result<(), Error> {
        self.apply(&mut cmd);
        let out = cmd.output().map_err(|source| Error::Io {
            what: "could not run",
            path: path.to_owned(),
            source,
        })?;
        if out.status.success() {
            return Ok(());
        }
        Err(Error::Command {
            program: name,
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        })
    }

    /// Makes `path` owned by the run-as user, mode 0700.
    pub(crate) fn own(self, path: &Path) -> Result<(), Error> {
        if let RunAs::Postgres { uid, gid } = self {
            nix::unistd::chown(path, Some(uid), Some(gid)).map_err(|source| Error::Chown {
                path: path.to_owned(),
                source,
            })?;
        }
        fs::set_permissions(path, fs::Permissions::from_mode(0o700)).map_err(|source| Error::Io {
            what: "could not set permissions of",
            path: path.to_owned(),
            source,
        })
    }

    /// Checks that the run-as user can traverse every ancestor of `path`.
    fn check_reachable(self, path: &Path) -> Result<(), Error> {
        let RunAs::Postgres { uid, .. } = self else {
            return Ok(());
        };
        for dir in path.ancestors().skip(1) {
            let Ok(meta) = fs::metadata(dir) else {
                continue;
            };
            let searchable = meta.mode() & 0o001 != 0 || meta.uid() == uid.as_raw();
            if !searchable {
                return Err(Error::DataDirNotReachable {
                    path: dir.to_owned(),
                });
            }
        }
        Ok(())
    }
}

/// Finds the directory holding `initdb` and `postgres`.
fn find_bin_dir() -> Result<PathBuf, Error> {
    let has_both = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Some(dir) = std::env::var_os("PG_BIN_DIR").map(PathBuf::from) {
        return if has_both(&dir) {
            Ok(dir)
        } else {
            Err(Error::BinariesNotFound)
        };
    }
    // Debian: /usr/lib/postgresql/<major>/bin, newest major first.
    let mut versioned: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse().ok()?;
            Some((major, e.path().join("bin")))
        })
        .filter(|(_, bin)| has_both(bin))
        .collect();
    versioned.sort();
    if let Some((_, bin)) = versioned.pop() {
        return Ok(bin);
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .find(|dir| has_both(dir))
        .ok_or(Error::BinariesNotFound)
}

/// A server that some other process started on a data directory, found
/// through the directory's `postmaster.pid`: for tools that must use the
/// running server instead of starting a second one (which Postgres would
/// refuse, and which must never share the directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    /// The postmaster's PID.
    pub pid: i32,
    /// Its port (which also names its Unix socket).
    pub port: u16,
    /// The directory of its Unix socket.
    pub socket_dir: PathBuf,
}

impl Running {
    /// The server running on `data_dir`, if any: its `postmaster.pid`
    /// names a live process and a socket that exists. A stale file (left by
    /// a crash) finds nothing.
    pub fn find(data_dir: &Path) -> Option<Self> {
        // The file's lines: PID, data directory, start time, port, socket
        // directory, listen address, shared memory key, status.
        let text = fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
        let lines: Vec<&str> = text.lines().collect();
        let pid: i32 = lines.first()?.trim().parse().ok()?;
        let port: u16 = lines.get(3)?.trim().parse().ok()?;
        let socket_dir = PathBuf::from(lines.get(4)?.trim());
        let alive = match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
            Ok(()) | Err(nix::errno::Errno::EPERM) => true,
            Err(_) => false,
        };
        let socket = socket_dir.join(format!(".s.PGSQL.{port}"));
        (pid > 0 && alive && socket.exists()).then_some(Self {
            pid,
            port,
            socket_dir,
        })
    }

    /// Connection settings for database `dbname` on it, over its socket,
    /// as the superuser `postgres` (as [`Cluster::config`]).
    pub fn config(&self, dbname: &str) -> tokio_postgres::Config {
        socket_config(&self.socket_dir, self.port, dbname)
    }
}

/// Settings to connect as `postgres` to `dbname` over the Unix socket in
/// `socket_dir` named by `port`.
fn socket_config(socket_dir: &Path, port: u16, dbname: &str) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    config
        .host_path(socket_dir)
        .port(port)
        .user("postgres")
        .dbname(dbname);
    config
}

/// A running Postgres server with its own data directory, stopped by
/// [`stop`](Cluster::stop) or when dropped.
#[derive(Debug)]
pub struct Cluster {
    data_dir: PathBuf,
    socket_dir: PathBuf,
    port: u16,
    tcp: bool,
    log_path: PathBuf,
    child: Mutex<Child>,
    /// Closing it stops the server (see the crate docs).
    lifeline: Mutex<Option<ChildStdin>>,
    /// Holds a temporary socket directory when the data directory's path is
    /// too long for a socket path.
    _socket_tmp: Option<tempfile::TempDir>,
}

impl Cluster {
    /// Initializes the data directory if needed, starts the server and
    /// waits until it accepts connections.
    ///
    /// # Errors
    ///
    /// Names what is missing (binaries, an OS user to run as, access to the
    /// directory) or includes the end of the server's log.
    pub async fn start(options: ClusterOptions) -> Result<Self, Error> {
        let bin_dir = find_bin_dir()?;
        let run_as = RunAs::detect()?;
        let data_dir = absolute(&options.data_dir)?;
        if let Some(running) = Running::find(&data_dir) {
            return Err(Error::AlreadyRunning {
                data_dir,
                pid: running.pid,
            });
        }
        let log_path = data_dir.with_extension("log");
        run_as.check_reachable(&data_dir)?;
        match &options.primary {
            Some(primary) => base_backup(&bin_dir, run_as, &data_dir, primary)?,
            None => prepare_data_dir(&bin_dir, run_as, &data_dir, options.durable)?,
        }
        let mut settings = options.settings.clone();
        if let Some((cert, key)) = &options.tls {
            for (file, pem, setting) in [
                ("server.crt", cert, "ssl_cert_file"),
                ("server.key", key, "ssl_key_file"),
            ] {
                let path = data_dir.join(file);
                fs::write(&path, pem).map_err(|source| Error::Io {
                    what: "could not write",
                    path: path.clone(),
                    source,
                })?;
                run_as.own(&path)?;
                settings.push((setting.to_owned(), path.display().to_string()));
            }
            settings.push(("ssl".to_owned(), "on".to_owned()));
        }

        let (socket_dir, socket_tmp) = socket_dir(run_as, &data_dir, options.port)?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|source| Error::Io {
                what: "could not open the server log",
                path: log_path.clone(),
                source,
            })?;
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);

        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(SUPERVISOR)
            .arg("pg-supervisor")
            .arg(bin_dir.join("postgres"))
            .arg("-D")
            .arg(&data_dir)
            .arg("-k")
            .arg(&socket_dir)
            .arg("-p")
            .arg(options.port.to_string())
            .arg("-c")
            .arg(if options.tcp {
                "listen_addresses=127.0.0.1"
            } else {
                "listen_addresses="
            });
        if !options.durable {
            for s in [
                "fsync=off",
                "synchronous_commit=off",
                "full_page_writes=off",
            ] {
                cmd.args(["-c", s]);
            }
        }
        for (name, value) in &settings {
            cmd.arg("-c").arg(format!("{name}={value}"));
        }
        cmd.current_dir(&data_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::from(clone_file(&log, &log_path)?))
            .stderr(Stdio::from(log));
        run_as.apply(&mut cmd);
        let mut child = cmd.spawn().map_err(|source| Error::Io {
            what: "could not start",
            path: bin_dir.join("postgres"),
            source,
        })?;
        let lifeline = child.stdin.take();

        let cluster = Cluster {
            data_dir,
            socket_dir,
            port: options.port,
            tcp: options.tcp,
            log_path,
            child: Mutex::new(child),
            lifeline: Mutex::new(lifeline),
            _socket_tmp: socket_tmp,
        };
        cluster.wait_ready(options.ready_timeout, log_start).await?;
        tracing::info!(
            data_dir = %cluster.data_dir.display(),
            socket_dir = %cluster.socket_dir.display(),
            "embedded postgres ready"
        );
        Ok(cluster)
    }

    async fn wait_ready(&self, timeout: Duration, log_start: u64) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
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
                    program: "postgres",
                    output: format!("exited with {status}: {}", self.log_since(log_start)),
                });
            }
            let mut config = self.config("postgres");
            config.connect_timeout(Duration::from_secs(2));
            if let Ok((client, conn)) = config.connect(NoTls).await {
                drop(client);
                let _ = conn.await; // ends as the client is dropped; nothing to report
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::NotReady {
                    seconds: timeout.as_secs(),
                    log: self.log_since(log_start),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_since(&self, start: u64) -> String {
        let mut out = String::new();
        if let Ok(mut f) = File::open(&self.log_path) {
            let _ = f.seek(SeekFrom::Start(start));
            let _ = f.take(16 * 1024).read_to_string(&mut out);
        }
        out.trim().to_owned()
    }

    /// Connection settings for database `dbname` as the `postgres`
    /// superuser, over the cluster's Unix socket.
    pub fn config(&self, dbname: &str) -> tokio_postgres::Config {
        socket_config(&self.socket_dir, self.port, dbname)
    }

    /// Like [`config`](Self::config), but over TCP to `127.0.0.1`, when the
    /// cluster was started with [`ClusterOptions::listen_tcp`].
    pub fn tcp_config(&self, dbname: &str) -> Option<tokio_postgres::Config> {
        if !self.tcp {
            return None;
        }
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname(dbname);
        Some(config)
    }

    /// The TCP address the server listens on, if it does.
    pub fn tcp_addr(&self) -> Option<std::net::SocketAddr> {
        self.tcp
            .then(|| std::net::SocketAddr::from(([127, 0, 0, 1], self.port)))
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The directory holding the server's Unix socket.
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// The port it listens on (TCP if enabled, and the socket's name).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server log file (beside the data directory).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Kills the server abruptly, as a power cut or an OOM kill would
    /// (SIGKILL to the postmaster, no checkpoint), and waits for it to be
    /// gone. The next [`start`](Self::start) on the same directory runs crash
    /// recovery. For durability tests.
    ///
    /// # Errors
    ///
    /// When the postmaster's PID cannot be read from `postmaster.pid`.
    pub async fn crash(&self) -> Result<(), Error> {
        let pid = self.postmaster_pid()?;
        // The postmaster may have exited on its own meanwhile; that is fine.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        // The supervisor exits once the postmaster is gone.
        self.stop().await;
        Ok(())
    }

    /// Freezes the server as a network partition or a stalled host would:
    /// SIGSTOP to the postmaster and every process it started. Connections
    /// stay open and nothing answers, not even a statement timeout, until
    /// the returned guard is dropped (SIGCONT). For fault tests.
    ///
    /// # Errors
    ///
    /// When the postmaster's PID cannot be read from `postmaster.pid`.
    pub fn freeze(&self) -> Result<Frozen, Error> {
        // Children first (as `processes` lists them), so none sees its
        // parent stop while it runs on.
        let frozen = Frozen {
            pids: self.processes()?,
        };
        frozen.signal(nix::sys::signal::Signal::SIGSTOP);
        Ok(frozen)
    }

    /// The PIDs of the postmaster and of its children at this moment:
    /// every process of the cluster, as the postmaster starts them all
    /// itself (backends, background workers, autovacuum). A benchmark
    /// reads their CPU times to charge Postgres's share to a run.
    ///
    /// # Errors
    ///
    /// When the postmaster's PID cannot be read from `postmaster.pid`.
    pub fn processes(&self) -> Result<Vec<i32>, Error> {
        Ok(processes_of(self.postmaster_pid()?))
    }

    fn postmaster_pid(&self) -> Result<i32, Error> {
        let pid_file = self.data_dir.join("postmaster.pid");
        let text = fs::read_to_string(&pid_file).map_err(|source| Error::Io {
            what: "could not read",
            path: pid_file.clone(),
            source,
        })?;
        text.lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| Error::Command {
                program: "postgres",
                output: format!("no PID in {}", pid_file.display()),
            })
    }

    /// Stops the server (fast shutdown: open transactions are rolled back,
    /// committed data is flushed) and waits for it to exit.
    pub async fn stop(&self) {
        self.lifeline.lock().expect("lifeline lock").take();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let done = {
                let mut child = self.child.lock().expect("child lock");
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => true,
                    Ok(None) if Instant::now() >= deadline => {
                        // Only reachable if postgres ignores SIGINT for 30 s.
                        let _ = child.kill(); // best effort; it may have just exited
                        true
                    }
                    Ok(None) => false,
                }
            };
            if done {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Closing stdin makes the supervisor stop postgres. Wait briefly so
        // the data directory is consistent before the owner moves on; a
        // blocking wait is acceptable here, as Drop cannot await.
        let Ok(mut lifeline) = self.lifeline.lock() else {
            return;
        };
        if lifeline.take().is_none() {
            return; // already stopped
        }
        if let Ok(mut child) = self.child.lock() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn absolute(path: &Path) -> Result<PathBuf, Error> {
    std::path::absolute(path).map_err(|source| Error::Io {
        what: "could not resolve",
        path: path.to_owned(),
        source,
    })
}

fn clone_file(file: &File, path: &Path) -> Result<File, Error> {
    file.try_clone().map_err(|source| Error::Io {
        what: "could not reopen",
        path: path.to_owned(),
        source,
    })
}

/// Creates the data directory and runs `initdb` unless it holds a cluster.
fn prepare_data_dir(bin_dir: &Path, run_as: RunAs, dir: &Path, durable: bool) -> Result<(), Error> {
    if dir.join("PG_VERSION").is_file() {
        return Ok(());
    }
    let empty = match fs::read_dir(dir) {
        Ok(mut entries) => entries.next().is_none(),
        Err(_) => true,
    };
    if !empty {
        return Err(Error::NotADataDir {
            path: dir.to_owned(),
        });
    }
    fs::create_dir_all(dir).map_err(|source| Error::Io {
        what: "could not create",
        path: dir.to_owned(),
        source,
    })?;
    run_as.own(dir)?;

    let mut cmd = Command::new(bin_dir.join("initdb"));
    cmd.arg("-D")
        .arg(dir)
        .args([
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
        ])
        .current_dir(dir);
    if !durable {
        cmd.arg("--no-sync");
    }
    run_as.run(cmd, "initdb", &bin_dir.join("initdb"))?;
    tracing::info!(data_dir = %dir.display(), "initialized a new postgres cluster");
    Ok(())
}

/// Copies `primary` into `dir` with `pg_basebackup -R`, unless `dir`
/// already holds a cluster (a replica started before).
fn base_backup(
    bin_dir: &Path,
    run_as: RunAs,
    dir: &Path,
    primary: &PrimarySource,
) -> Result<(), Error> {
    if dir.join("PG_VERSION").is_file() {
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(|source| Error::Io {
        what: "could not create",
        path: dir.to_owned(),
        source,
    })?;
    run_as.own(dir)?;
    let program = bin_dir.join("pg_basebackup");
    let mut cmd = Command::new(&program);
    cmd.arg("-D")
        .arg(dir)
        .arg("-h")
        .arg(&primary.socket_dir)
        .args(["-p", &primary.port.to_string(), "-U", "postgres"])
        // Streams the WAL written during the copy, and writes the
        // settings that make the copy a standby of the primary.
        .args(["-X", "stream", "-R", "--checkpoint=fast", "--no-sync"])
        .current_dir(dir);
    run_as.run(cmd, "pg_basebackup", &program)?;
    // The copy holds the primary's socket lock files (its socket lives in
    // its data directory). They name the primary's live postmaster, so one
    // that matched the replica's port would stop it from starting.
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(".s.PGSQL.") && name.ends_with(".lock") {
                let _ = fs::remove_file(entry.path()); // a leftover is harmless but for a port clash
            }
        }
    }
    tracing::info!(data_dir = %dir.display(), "copied a replica from its primary");
    Ok(())
}

/// A loopback TCP port that was free a moment before and that this process
/// has not handed out yet.
///
/// The kernel may give the same ephemeral port twice, since nothing holds
/// it between the probe and the server's bind. Two clusters of one test on
/// one port then collide on their socket's lock file: a replica's base
/// backup copies the primary's, and the primary is alive (CI once failed so).
pub(crate) fn fresh_port(dir: &Path) -> Result<u16, Error> {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    // A handful of probes: the kernel's choice is random, so a repeat of a
    // port already given is rare and two in a row rarer still.
    for _ in 0..16 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|source| Error::Io {
                what: "could not find a free port for",
                path: dir.to_owned(),
                source,
            })?
            .port();
        let mut given = GIVEN.lock().expect("port list lock");
        if !given.contains(&port) {
            given.push(port);
            return Ok(port);
        }
    }
    Err(Error::Io {
        what: "could not find a port not already given out for",
        path: dir.to_owned(),
        source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
    })
}

/// The data directory itself holds the socket unless its path is too long.
fn socket_dir(
    run_as: RunAs,
    data_dir: &Path,
    port: u16,
) -> Result<(PathBuf, Option<tempfile::TempDir>), Error> {
    let socket = data_dir.join(format!(".s.PGSQL.{port}"));
    if socket.as_os_str().len() <= MAX_SOCKET_PATH {
        return Ok((data_dir.to_owned(), None));
    }
    let tmp = tempfile::Builder::new()
        .prefix("pgsock-")
        .tempdir_in("/tmp")
        .map_err(|source| Error::Io {
            what: "could not create a socket directory in",
            path: "/tmp".into(),
            source,
        })?;
    run_as.own(tmp.path())?;
    Ok((tmp.path().to_owned(), Some(tmp)))
}

/// A cluster frozen by [`Cluster::freeze`]; thawed (SIGCONT) when dropped,
/// so a failing test cannot leave a stopped server behind.
#[derive(Debug)]
#[must_use = "the cluster thaws as soon as this guard is dropped"]
pub struct Frozen {
    pids: Vec<i32>,
}

impl Frozen {
    fn signal(&self, signal: nix::sys::signal::Signal) {
        for &pid in &self.pids {
            // A backend may have exited meanwhile; nothing to do then.
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }
}

/// The processes of the server whose postmaster is `postmaster` (one of
/// this machine's, a cluster's or not): its children, then itself.
pub fn processes_of(postmaster: i32) -> Vec<i32> {
    // Children first: `freeze` relies on the order.
    let mut pids = children_of(postmaster);
    pids.push(postmaster);
    pids
}

/// The processes whose parent is `parent`, from `/proc` (Linux only; the
/// project's machines are).
fn children_of(parent: i32) -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            // The fields after the parenthesised command: state, then ppid.
            fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok())
                    == Some(parent)
            })
        })
        .collect()
}
