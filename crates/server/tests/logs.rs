//! The server binary's logs (`server::logs`), run as operators run it:
//! every request's `served` line reaches standard error, and so do the
//! lines of its shutdown, and a standard error nobody reads (a stalled log
//! collector) costs log lines, counted, never requests.

mod support;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::{Duration, Instant};

use support::ADMIN_TOKEN;

/// A running `pgbatch-server serve`, killed if the test ends first.
struct Server {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `pgbatch-server serve` on a seeded database of its own, with none of
/// the test's own `PGBATCH_*` settings; and its standard error, read up to
/// the line that says where it serves.
///
/// It listens on a loopback port it binds itself and names in its
/// `serving` line. A port probed free by the test could be taken before
/// the server binds it (the kernel hands a free port to two callers
/// alike): the server then exits, and the test talks to whatever holds
/// the port (CI once saw a reset so).
async fn start() -> (Server, BufReader<ChildStderr>) {
    let config = support::database().await;
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_pgbatch-server"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("PGBATCH_") {
            command.env_remove(name);
        }
    }
    let mut child = command
        .arg("serve")
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--data-dir")
        .arg(dir.path())
        .arg("--admin-token-file")
        .arg(dir.path().join("admin-token"))
        .env("DATABASE_URL", support::key_values(&config))
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    // Read on a thread of its own, so that a server that neither serves
    // nor exits fails the test rather than hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(serving_addr(stderr));
    });
    let started = rx.recv_timeout(Duration::from_secs(60));
    let (addr, stderr) = match started {
        Ok(Ok(started)) => started,
        Ok(Err(logs)) => {
            let status = child.wait().unwrap();
            panic!("the server exited ({status}) before serving:\n{logs}");
        }
        Err(_) => {
            let _ = child.kill();
            panic!("the server did not serve within 60 s");
        }
    };
    let server = Server {
        child,
        addr,
        _dir: dir,
    };
    (server, stderr)
}

/// Reads `stderr` up to the server's `serving` line: the address it names,
/// and the rest of `stderr`; or, if it ends first, what it held.
fn serving_addr(
    mut stderr: BufReader<ChildStderr>,
) -> Result<(SocketAddr, BufReader<ChildStderr>), String> {
    let mut logs = String::new();
    loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap_or(0) == 0 {
            return Err(logs);
        }
        let addr = line
            .contains(" serving")
            .then(|| {
                line.split_whitespace()
                    .find_map(|field| field.strip_prefix("addr="))
                    .and_then(|addr| addr.parse().ok())
            })
            .flatten();
        if let Some(addr) = addr {
            return Ok((addr, stderr));
        }
        logs.push_str(&line);
    }
}

/// One keep-alive connection that sends requests and reads each answer
/// whole, each within a bound.
struct Client(BufReader<TcpStream>);

impl Client {
    fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_nodelay(true).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        stream
            .set_write_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        Self(BufReader::new(stream))
    }

    /// `GET path` with `id` as its `x-request-id`: the status and body.
    fn get(&mut self, path: &str, id: &str) -> (u16, String) {
        // One write: a request in pieces would wait on Nagle's algorithm.
        let request = format!(
            "GET {path} HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ADMIN_TOKEN}\r\n\
             x-request-id: {id}\r\n\r\n"
        );
        self.0.get_mut().write_all(request.as_bytes()).unwrap();
        let mut status = String::new();
        self.0
            .read_line(&mut status)
            .unwrap_or_else(|e| panic!("no answer to request {id}: {e}"));
        let code = status
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("not a status line: {status:?}"));
        let mut length = 0;
        loop {
            let mut line = String::new();
            self.0.read_line(&mut line).unwrap();
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap();
                }
            }
        }
        let mut body = vec![0; length];
        self.0.read_exact(&mut body).unwrap();
        (code, String::from_utf8(body).unwrap())
    }
}

/// Stops `child` as a service manager does, and waits for it (bounded).
fn terminate(child: &mut Child) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the server did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_and_the_shutdown_are_logged() {
    let (mut server, mut stderr) = start().await;
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stderr.read_to_string(&mut text).unwrap();
        text
    });
    let mut client = Client::connect(server.addr);
    for n in 0..300 {
        let (status, _) = client.get("/api/v1/user", &format!("logged-{n}"));
        assert_eq!(status, 200);
    }
    drop(client);
    terminate(&mut server.child);
    let logs = reader.join().unwrap();
    for n in 0..300 {
        let id = format!("request_id=\"logged-{n}\"");
        let line = logs
            .lines()
            .find(|l| l.contains(&id) && l.contains("served"))
            .unwrap_or_else(|| panic!("no served line for request {n}:\n{logs}"));
        assert!(line.contains("status=200"), "{line}");
        assert!(line.contains("route=\"/api/v1/user\""), "{line}");
        assert!(!line.contains(ADMIN_TOKEN), "a token was logged: {line}");
    }
    // Logged on the way out, after the last request. (That the guard
    // writes out what is still queued at exit is the writer's unit test:
    // here the writer keeps up, and the lines are out before the exit.)
    assert!(
        logs.contains("stopped serving HTTP; stopping"),
        "no line from the way out:\n{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_standard_error_drops_log_lines_not_requests() {
    let (mut server, stalled) = start().await;
    // Held open and never read: once the pipe is full, every write to it
    // blocks, as a log collector that stopped reading would make it. Its
    // size is set, so the lines it holds are known (about 350).
    nix::fcntl::fcntl(
        stalled.get_ref(),
        nix::fcntl::FcntlArg::F_SETPIPE_SZ(64 * 1024),
    )
    .unwrap();
    let mut client = Client::connect(server.addr);
    // Past the pipe, the writer thread's block (about 350 lines more) and
    // its queue.
    let requests = server::logs::QUEUED_LINES + 5_000;
    for n in 0..requests {
        let (status, _) = client.get("/api/v1/user", &format!("stalled-{n}"));
        assert_eq!(status, 200, "request {n}");
    }
    let (status, metrics) = client.get("/metrics", "scrape");
    assert_eq!(status, 200);
    let dropped = support::metric_value(&metrics, "log_lines_dropped_total");
    assert!(dropped > 0, "{requests} lines fit into a stalled pipe?");
    drop(client);
    // The writer is stuck on the pipe: the exit waits for it a second, no
    // longer.
    terminate(&mut server.child);
    drop(stalled);
}
