//! The server binary's logs (`server::logs`), run as operators run it:
//! every request's `served` line reaches standard error, and so do the
//! lines of its shutdown, and a standard error nobody reads (a stalled log
//! collector) costs log lines, counted, never requests.

mod support;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
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

/// `pgbatch-server serve` on a seeded database of its own, on a free
/// loopback port, with standard error piped to the test and none of the
/// test's own `PGBATCH_*` settings.
async fn start() -> Server {
    let config = support::database().await;
    let dir = tempfile::tempdir().unwrap();
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_pgbatch-server"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("PGBATCH_") {
            command.env_remove(name);
        }
    }
    let child = command
        .arg("serve")
        .arg("--listen")
        .arg(addr.to_string())
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
    let mut server = Server {
        child,
        addr,
        _dir: dir,
    };
    let start = Instant::now();
    while TcpStream::connect(addr).is_err() {
        if let Some(status) = server.child.try_wait().unwrap() {
            let mut logs = String::new();
            let _ = server
                .child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut logs);
            panic!("the server exited ({status}) before listening:\n{logs}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the server never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    server
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
    let mut server = start().await;
    let stderr = server.child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        BufReader::new(stderr).read_to_string(&mut text).unwrap();
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
    let mut server = start().await;
    // Held open and never read: once the pipe is full, every write to it
    // blocks, as a log collector that stopped reading would make it. Its
    // size is set, so the lines it holds are known (about 350).
    let stalled = server.child.stderr.take().unwrap();
    nix::fcntl::fcntl(&stalled, nix::fcntl::FcntlArg::F_SETPIPE_SZ(64 * 1024)).unwrap();
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
