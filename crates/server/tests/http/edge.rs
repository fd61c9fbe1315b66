//! The serving edge against slow and greedy clients, over raw TCP sockets:
//! header-read and idle timeouts, the head size limit, the connection cap,
//! and graceful shutdown. No database: a small router stands in for the
//! app.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::routing::get;
use axum::Router;
use clap::Parser as _;
use server::cli::Cli;
use server::http::serve::{serve, EdgeSettings};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// Longest any single wait in these tests may take: well above what each
/// expects, well below a hang.
const PATIENCE: Duration = Duration::from_secs(3);

/// Size of `/big`'s body: more than loopback socket buffers hold, so the
/// server is still writing it while the client does not read.
const BIG: usize = 16 << 20;

/// Handlers report here when they start, so a test knows a request is in
/// flight.
#[derive(Clone)]
struct Probe(mpsc::UnboundedSender<&'static str>);

async fn slow(State(probe): State<Probe>) -> &'static str {
    let _ = probe.0.send("slow");
    tokio::time::sleep(Duration::from_millis(200)).await;
    "slow done"
}

/// Longer than [`short_header_timeout`]'s 300 ms: the connection's timer
/// fires at 300 ms and 600 ms while it runs, and the wait for the next
/// head must count from its answer at 550 ms, not from the connection's
/// start (which would close it at 600 ms).
async fn sluggish() -> &'static str {
    tokio::time::sleep(Duration::from_millis(550)).await;
    "sluggish done"
}

/// The length of the request body, read whole.
async fn count(body: axum::body::Bytes) -> String {
    body.len().to_string()
}

async fn stuck(State(probe): State<Probe>) -> &'static str {
    let _ = probe.0.send("stuck");
    std::future::pending::<()>().await;
    "never"
}

fn router(probe: Probe) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/slow", get(slow))
        .route("/sluggish", get(sluggish))
        .route("/count", axum::routing::post(count))
        .route("/stuck", get(stuck))
        .route("/big", get(|| async { vec![b'x'; BIG] }))
        .with_state(probe)
}

/// A server on an ephemeral port.
struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<io::Result<()>>,
    started: mpsc::UnboundedReceiver<&'static str>,
}

impl Server {
    async fn start(settings: EdgeSettings) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (probe, started) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, router(Probe(probe)), settings, async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            stop: Some(stop),
            task,
            started,
        }
    }

    async fn connect(&self) -> TcpStream {
        TcpStream::connect(self.addr).await.unwrap()
    }

    /// Waits until a handler reports that it started, and returns which.
    async fn handler_started(&mut self) -> &'static str {
        tokio::time::timeout(PATIENCE, self.started.recv())
            .await
            .expect("a handler started")
            .expect("the server holds the probe")
    }

    fn shut_down(&mut self) {
        self.stop.take().unwrap().send(()).unwrap();
    }

    /// Waits for `serve` to return; panics past `limit`.
    async fn stopped_within(self, limit: Duration) {
        tokio::time::timeout(limit, self.task)
            .await
            .unwrap_or_else(|_| panic!("serve still running {limit:?} after shutdown"))
            .unwrap()
            .unwrap();
    }
}

/// Settings for tests that are not about the timeout: long enough not to
/// close anything while a test runs.
fn settings() -> EdgeSettings {
    EdgeSettings {
        header_read_timeout: Duration::from_secs(5),
        max_header_bytes: 16 * 1024,
        max_connections: 64,
        shutdown_grace: Duration::from_secs(2),
        ..EdgeSettings::default()
    }
}

fn short_header_timeout() -> EdgeSettings {
    EdgeSettings {
        header_read_timeout: Duration::from_millis(300),
        ..settings()
    }
}

fn request(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nhost: test\r\n\r\n")
}

/// Reads one whole response: its head (lower-cased) and body.
async fn read_response(stream: &mut TcpStream) -> (String, Vec<u8>) {
    crate::support::http1::read_response(stream, PATIENCE)
        .await
        .answered()
}

/// Sends a GET and reads its response.
async fn get_on(stream: &mut TcpStream, path: &str) -> (String, Vec<u8>) {
    stream.write_all(request(path).as_bytes()).await.unwrap();
    read_response(stream).await
}

/// Sends a GET, expects a 200 with `body`, and returns the head.
async fn get_ok(stream: &mut TcpStream, path: &str, body: &[u8]) -> String {
    let (head, received) = get_on(stream, path).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert_eq!(received, body);
    head
}

/// Expects the server to close `stream` without sending anything, no
/// sooner than about the 300 ms header timeout after `since`.
async fn closed_silently_after_the_timeout(stream: &mut TcpStream, since: Instant) {
    let received = read_to_close(stream, PATIENCE).await;
    assert!(received.is_empty(), "no response expected: {received:?}");
    assert!(
        since.elapsed() >= Duration::from_millis(250),
        "closed too early"
    );
}

/// Reads until the server closes the connection (a reset counts) and
/// returns what came before; panics if it is still open after `limit`.
async fn read_to_close(stream: &mut (impl AsyncRead + Unpin), limit: Duration) -> Vec<u8> {
    let mut received = Vec::new();
    let mut chunk = [0; 16 * 1024];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) => break,
                Ok(n) => received.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("read failed: {e}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("connection still open after {limit:?}"));
    received
}

#[tokio::test]
async fn a_client_trickling_its_head_is_closed_after_the_header_timeout() {
    let server = Server::start(short_header_timeout()).await;
    let (mut reader, mut writer) = server.connect().await.into_split();
    let started = Instant::now();
    // A byte every 50 ms: each arrives well within the timeout, the head
    // never completes.
    let trickle = tokio::spawn(async move {
        let head = b"GET / HTTP/1.1\r\nx-slow: ".iter().copied();
        for byte in head.chain(std::iter::repeat_n(b'a', 100)) {
            if writer.write_all(&[byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let received = read_to_close(&mut reader, PATIENCE).await;
    let elapsed = started.elapsed();
    trickle.abort();
    assert!(received.is_empty(), "no response expected: {received:?}");
    assert!(
        elapsed >= Duration::from_millis(250),
        "closed too early: {elapsed:?}"
    );
}

#[tokio::test]
async fn a_silent_connection_is_closed_after_the_header_timeout() {
    let server = Server::start(short_header_timeout()).await;
    let mut silent = server.connect().await;
    closed_silently_after_the_timeout(&mut silent, Instant::now()).await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_header_timeout() {
    let server = Server::start(short_header_timeout()).await;
    let mut client = server.connect().await;
    let head = get_ok(&mut client, "/", b"ok").await;
    assert!(!head.contains("connection: close"), "{head}");
    closed_silently_after_the_timeout(&mut client, Instant::now()).await;
}

#[tokio::test]
async fn a_request_handled_past_the_header_timeout_is_answered_and_its_connection_kept() {
    let server = Server::start(short_header_timeout()).await;
    let mut client = server.connect().await;
    get_ok(&mut client, "/sluggish", b"sluggish done").await;
    // The wait for this head started with the response, not the request
    // or the connection: 150 ms later it is still well within it.
    tokio::time::sleep(Duration::from_millis(150)).await;
    get_ok(&mut client, "/", b"ok").await;
}

#[tokio::test]
async fn a_body_uploaded_for_longer_than_the_header_timeout_is_answered() {
    let server = Server::start(short_header_timeout()).await;
    let mut client = server.connect().await;
    let body = [b'x'; 100];
    let head = format!(
        "POST /count HTTP/1.1\r\nhost: test\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    client.write_all(head.as_bytes()).await.unwrap();
    // Ten pieces 80 ms apart: 720 ms, over twice the 300 ms timeout, which
    // counts only the wait for a head.
    for piece in body.chunks(10) {
        tokio::time::sleep(Duration::from_millis(80)).await;
        client.write_all(piece).await.unwrap();
    }
    let (head, received) = read_response(&mut client).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert_eq!(received, b"100");
}

#[tokio::test]
async fn a_keep_alive_connection_in_use_outlives_the_header_timeout() {
    let server = Server::start(short_header_timeout()).await;
    let mut client = server.connect().await;
    let started = Instant::now();
    // A request every 100 ms for four times the 300 ms timeout: each head
    // comes well within it, counted from the response before.
    loop {
        get_ok(&mut client, "/", b"ok").await;
        if started.elapsed() >= Duration::from_millis(1200) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Then idle: closed after the timeout, counted from the last response.
    closed_silently_after_the_timeout(&mut client, Instant::now()).await;
}

#[tokio::test]
async fn a_head_over_the_limit_is_refused_while_a_normal_one_is_served() {
    let settings = settings();
    let server = Server::start(settings).await;

    let mut normal = server.connect().await;
    let pad = "a".repeat(settings.max_header_bytes / 2);
    let head = format!("GET / HTTP/1.1\r\nhost: test\r\nx-pad: {pad}\r\n\r\n");
    normal.write_all(head.as_bytes()).await.unwrap();
    let (head, body) = read_response(&mut normal).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert_eq!(body, b"ok");

    let mut greedy = server.connect().await;
    let pad = "a".repeat(settings.max_header_bytes * 3);
    let head = format!("GET / HTTP/1.1\r\nhost: test\r\nx-pad: {pad}\r\n\r\n");
    // The server may close before taking it all.
    let _ = greedy.write_all(head.as_bytes()).await;
    let received = read_to_close(&mut greedy, PATIENCE).await;
    // Usually hyper's 431; a reset may overtake it, as the server closes
    // with the rest of the head unread.
    assert!(
        received.is_empty() || received.starts_with(b"HTTP/1.1 431"),
        "{}",
        String::from_utf8_lossy(&received)
    );
}

#[tokio::test]
async fn beyond_the_connection_cap_new_connections_are_refused_at_once_until_some_close() {
    let server = Server::start(EdgeSettings {
        max_connections: 2,
        ..settings()
    })
    .await;
    let mut first = server.connect().await;
    let mut second = server.connect().await;
    for client in [&mut first, &mut second] {
        let (head, _) = get_on(client, "/").await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
    }

    let mut third = server.connect().await;
    let started = Instant::now();
    let (head, body) = read_response(&mut third).await;
    assert!(head.starts_with("http/1.1 503"), "{head}");
    assert!(head.contains("retry-after: 1"), "{head}");
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"]["code"], "overloaded");
    read_to_close(&mut third, Duration::from_secs(1)).await;
    assert!(started.elapsed() < Duration::from_secs(1));

    // The connections being served are not disturbed.
    let (head, _) = get_on(&mut first, "/").await;
    assert!(head.starts_with("http/1.1 200"), "{head}");

    drop(first);
    drop(second);
    // The server notices the closes on its own time. A refused connection
    // hears its 503 at once; an accepted one hears nothing until it asks.
    let deadline = Instant::now() + PATIENCE;
    let mut client = loop {
        let mut client = server.connect().await;
        let mut first = [0; 64];
        let heard = tokio::time::timeout(Duration::from_millis(200), client.read(&mut first)).await;
        if heard.is_err() {
            break client;
        }
        assert!(
            Instant::now() < deadline,
            "still refused after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (head, _) = get_on(&mut client, "/").await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
}

#[tokio::test]
async fn shutdown_finishes_in_flight_requests_and_closes_idle_and_half_sent_connections() {
    let settings = settings();
    let mut server = Server::start(settings).await;
    let mut half_sent = server.connect().await;
    half_sent
        .write_all(b"GET / HTTP/1.1\r\nhost: test\r\n")
        .await
        .unwrap();
    let mut silent = server.connect().await;
    // Served after the two above were accepted (the backlog is in order).
    let mut idle = server.connect().await;
    let (head, _) = get_on(&mut idle, "/").await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let mut in_flight = server.connect().await;
    in_flight
        .write_all(request("/slow").as_bytes())
        .await
        .unwrap();
    assert_eq!(server.handler_started().await, "slow");

    let addr = server.addr;
    server.shut_down();
    let started = Instant::now();
    // Long before the header timeout and the grace period would.
    for client in [&mut half_sent, &mut silent, &mut idle] {
        let received = read_to_close(client, Duration::from_millis(150)).await;
        assert!(received.is_empty(), "no response expected: {received:?}");
    }
    let (head, body) = read_response(&mut in_flight).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    assert_eq!(body, b"slow done");
    read_to_close(&mut in_flight, Duration::from_millis(500)).await;
    // Nothing left to wait for: no need for the grace period.
    server.stopped_within(settings.shutdown_grace / 2).await;
    assert!(started.elapsed() < settings.shutdown_grace / 2);
    assert!(TcpStream::connect(addr).await.is_err(), "still accepting");
}

#[tokio::test]
async fn shutdown_lets_a_slow_reader_receive_the_whole_response() {
    let mut server = Server::start(settings()).await;
    let mut reader = server.connect().await;
    reader.write_all(request("/big").as_bytes()).await.unwrap();
    // Not reading: the socket buffers fill and the server's writes block
    // with the whole body handed to hyper.
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.shut_down();
    // Long enough for the server to drop the connection if it wrongly
    // thought there was nothing left to send.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (head, body) = read_response(&mut reader).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert_eq!(body.len(), BIG);
    read_to_close(&mut reader, Duration::from_millis(500)).await;
    server.stopped_within(PATIENCE).await;
}

#[tokio::test]
async fn shutdown_drops_what_is_still_busy_after_the_grace_period() {
    let grace = Duration::from_millis(500);
    let mut server = Server::start(EdgeSettings {
        shutdown_grace: grace,
        ..settings()
    })
    .await;
    let mut stuck = server.connect().await;
    stuck.write_all(request("/stuck").as_bytes()).await.unwrap();
    assert_eq!(server.handler_started().await, "stuck");

    server.shut_down();
    let started = Instant::now();
    server.stopped_within(PATIENCE).await;
    let elapsed = started.elapsed();
    assert!(
        elapsed >= grace - Duration::from_millis(50),
        "gave up early: {elapsed:?}"
    );
    let received = read_to_close(&mut stuck, Duration::from_millis(500)).await;
    assert!(received.is_empty(), "no response expected: {received:?}");
}

#[tokio::test]
async fn settings_that_would_refuse_everything_are_an_error() {
    for settings in [
        EdgeSettings {
            max_connections: 0,
            ..settings()
        },
        EdgeSettings {
            max_header_bytes: 0,
            ..settings()
        },
        EdgeSettings {
            header_read_timeout: Duration::ZERO,
            ..settings()
        },
    ] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let error = serve(listener, Router::new(), settings, std::future::pending())
            .await
            .unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{settings:?}");
    }
}

#[test]
fn flags_map_to_edge_settings() {
    let parse = |args: &[&str]| {
        Cli::try_parse_from(std::iter::once("server").chain(args.iter().copied()))
            .expect("valid flags")
            .serve
            .edge()
    };
    assert_eq!(parse(&[]), EdgeSettings::default());
    assert_eq!(
        parse(&[
            "--header-read-timeout-ms",
            "1500",
            "--max-header-bytes",
            "9000",
            "--max-connections",
            "7",
            "--shutdown-grace-ms",
            "250",
        ]),
        EdgeSettings {
            header_read_timeout: Duration::from_millis(1500),
            max_header_bytes: 9000,
            max_connections: 7,
            shutdown_grace: Duration::from_millis(250),
            ..EdgeSettings::default()
        }
    );
}
