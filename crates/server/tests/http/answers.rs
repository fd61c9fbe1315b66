//! Every answer reaches its client whole, over real sockets against real
//! Postgres: refusals under overload, errors while Postgres is down, early
//! answers to requests whose body is still arriving, and bodies that
//! arrive slowly. A connection reset or an early close instead of a
//! response fails these tests.

use crate::support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::http1::Outcome;
use crate::support::ADMIN_TOKEN;
use axum::Router;
use server::http::serve::{serve, EdgeSettings};
use server::settings::{AuthSettings, BatchSettings, Limits, ReadPath, ReadSettings, Settings};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_postgres::NoTls;

/// Longest any single wait may take: well above what each test expects,
/// well below a hang.
const PATIENCE: Duration = Duration::from_secs(10);

/// A server on an ephemeral port, serving `router` with `edge`.
struct Served {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

impl Served {
    async fn start(router: Router, edge: EdgeSettings) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(serve(listener, router, edge, async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            stop: Some(stop),
        }
    }

    async fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        s
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Reads one response from `stream`.
async fn read_response(stream: &mut TcpStream) -> Outcome {
    support::http1::read_response(stream, PATIENCE).await
}

/// After a response with `Connection: close`: the server ends the
/// connection gracefully (end of file), not with a reset.
async fn ends_gracefully(stream: &mut TcpStream) -> bool {
    let mut chunk = [0; 1024];
    loop {
        match tokio::time::timeout(PATIENCE, stream.read(&mut chunk)).await {
            Ok(Ok(0)) => return true,
            Ok(Ok(_)) => continue,
            Ok(Err(_)) | Err(_) => return false,
        }
    }
}

fn head(method: &str, uri: &str, body_len: usize) -> String {
    format!(
        "{method} {uri} HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ADMIN_TOKEN}\r\ncontent-type: application/json\r\ncontent-length: {body_len}\r\n\r\n"
    )
}

/// A `POST .../objects/stat` of `n` paths, whole.
fn batch_stat(n: u64) -> Vec<u8> {
    let paths: Vec<String> = (1..=n).map(server::db::seed::object_path).collect();
    let body = serde_json::json!({ "paths": paths }).to_string();
    let mut req = head("POST", "/api/v1/repositories/demo/objects/stat", body.len()).into_bytes();
    req.extend_from_slice(body.as_bytes());
    req
}

fn stat_get(n: u64) -> Vec<u8> {
    let uri = support::stat_uri("demo", &server::db::seed::object_path(n));
    format!("GET {uri} HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ADMIN_TOKEN}\r\n\r\n")
        .into_bytes()
}

/// Holds an exclusive lock on `objects` until dropped (its connection
/// ends, and the transaction with it).
async fn lock_objects(config: &tokio_postgres::Config) -> tokio_postgres::Client {
    let (client, conn) = config.connect(NoTls).await.unwrap();
    tokio::spawn(conn);
    client
        .batch_execute("BEGIN; LOCK TABLE objects IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    client
}

/// Defect: under overload, batch stats refused on keep-alive connections
/// saw a reset or a close instead of their 503 (the answer went out before
/// the body was read, and the connection was closed on the unread body).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_of_an_overloaded_batch_stat_arrives() {
    let config = support::database().await;
    let app = support::app_on(
        &config,
        &Settings {
            read: ReadSettings {
                path: ReadPath::Batched,
                // One batch stat of up to 1,000 paths at a time.
                batch: BatchSettings {
                    queue_capacity: 1_000,
                    ..BatchSettings::default()
                },
                admission_wait: Duration::from_millis(1),
                timeout: Duration::from_secs(3),
                ..ReadSettings::default()
            },
            ..Settings::default()
        },
    )
    .await;
    let served = Served::start(app.router.clone(), EdgeSettings::default()).await;
    // The first admitted batch stat waits on the lock, holding all the
    // room, for a second; after that, batch stats are admitted one at a
    // time, and the rest refused.
    let lock = lock_objects(&config).await;
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(lock);
    });
    let request = Arc::new(batch_stat(1_000));
    let mut clients = Vec::new();
    for _ in 0..40 {
        let mut stream = served.connect().await;
        let request = Arc::clone(&request);
        clients.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for _ in 0..10 {
                stream.write_all(&request).await.unwrap();
                let outcome = read_response(&mut stream).await;
                let over = !matches!(outcome, Outcome::Answered(..)) || outcome.closes();
                outcomes.push(outcome);
                if over {
                    break;
                }
            }
            // The connection is still open: it answers once more.
            if outcomes.last().is_some_and(|o| !o.closes()) {
                stream.write_all(&request).await.unwrap();
                outcomes.push(read_response(&mut stream).await);
            }
            outcomes
        }));
    }
    let (mut refused, mut ok, mut other) = (0, 0, Vec::new());
    for c in clients {
        for o in c.await.unwrap() {
            match o.status() {
                Some(503) => {
                    assert_eq!(o.json()["error"]["code"], "overloaded", "{o:?}");
                    refused += 1;
                }
                Some(200) => ok += 1,
                _ => other.push(o),
            }
        }
    }
    assert!(other.is_empty(), "not a whole 200 or 503: {other:?}");
    assert!(refused >= 100, "{refused} refusals");
    assert!(ok >= 1, "{ok} answered");
}

/// Defect: with Postgres killed, some requests on keep-alive connections
/// saw a reset instead of their 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_arrives_while_postgres_crashes_and_comes_back() {
    let options = embedded_pg::testing::private_options().unwrap();
    let cluster = embedded_pg::Cluster::start(options.clone()).await.unwrap();
    let config = cluster.config("postgres");
    server::testing::prepare(&config, 300, 10, ADMIN_TOKEN)
        .await
        .unwrap();
    // Every request looks its token up, as an uncached token would: with
    // Postgres down, that fails before the request's body is read.
    let app = support::app_on(
        &config,
        &Settings {
            read: ReadSettings {
                timeout: Duration::from_millis(500),
                ..ReadSettings::default()
            },
            auth: AuthSettings { cache: None },
            ..Settings::default()
        },
    )
    .await;
    let served = Served::start(app.router.clone(), EdgeSettings::default()).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..20u64 {
        let mut stream = served.connect().await;
        let stop = Arc::clone(&stop);
        clients.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            let mut i = 0;
            while !stop.load(SeqCst) {
                i += 1;
                // A batch stat's body follows its head a moment later, as
                // from a client whose request spans packets: an answer
                // that does not wait for it goes out before it arrives.
                let request = if (c + i) % 2 == 0 {
                    stat_get(1 + (c * 7 + i) % 300)
                } else {
                    batch_stat(300)
                };
                let head_end = request
                    .windows(4)
                    .position(|w| w == b"\r\n\r\n")
                    .map_or(request.len(), |i| i + 4);
                let mut sent = stream.write_all(&request[..head_end]).await;
                if sent.is_ok() && head_end < request.len() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    sent = stream.write_all(&request[head_end..]).await;
                }
                if sent.is_err() {
                    outcomes.push(Outcome::Reset);
                    break;
                }
                let outcome = read_response(&mut stream).await;
                let over = !matches!(outcome, Outcome::Answered(..)) || outcome.closes();
                outcomes.push(outcome);
                if over {
                    break;
                }
            }
            outcomes
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.crash().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let cluster = embedded_pg::Cluster::start(options).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stop.store(true, SeqCst);
    let (mut ok, mut unavailable, mut bad) = (0, 0, Vec::new());
    for c in clients {
        for o in c.await.unwrap() {
            match o.status() {
                Some(200) => ok += 1,
                Some(503 | 504) => {
                    assert!(o.json()["error"]["code"].is_string(), "{o:?}");
                    unavailable += 1;
                }
                _ => bad.push(o),
            }
        }
    }
    assert!(bad.is_empty(), "{} not answered whole: {bad:?}", bad.len());
    assert!(unavailable > 0, "Postgres was down: some requests failed");
    assert!(ok > 0);
    cluster.stop().await;
}

/// Defect: a batch stat whose body took 2 s to arrive (20 pieces) failed
/// with a broken pipe: the 500 ms read deadline counted the upload.
#[tokio::test]
async fn a_batch_stat_uploaded_over_two_seconds_is_answered() {
    let app = support::setup(&Settings::default()).await;
    let served = Served::start(app.router.clone(), EdgeSettings::default()).await;
    let paths: Vec<String> = (1..=50).map(server::db::seed::object_path).collect();
    let body = serde_json::json!({ "paths": paths }).to_string();
    let mut stream = served.connect().await;
    let uri = "/api/v1/repositories/demo/objects/stat";
    stream
        .write_all(head("POST", uri, body.len()).as_bytes())
        .await
        .unwrap();
    let start = Instant::now();
    for piece in body.as_bytes().chunks(body.len().div_ceil(20)) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        stream.write_all(piece).await.unwrap();
    }
    assert!(start.elapsed() >= Duration::from_secs(2));
    let o = read_response(&mut stream).await;
    assert_eq!(o.status(), Some(200), "{o:?}");
    assert_eq!(o.json()["results"].as_array().map(Vec::len), Some(50));
    // The same goes for a PUT.
    let object =
        serde_json::json!({"physical_address": "s3://x/1", "size_bytes": 1, "checksum": "c"})
            .to_string();
    let uri = "/api/v1/repositories/demo/objects?path=slow/1";
    stream
        .write_all(head("PUT", uri, object.len()).as_bytes())
        .await
        .unwrap();
    for piece in object.as_bytes().chunks(object.len().div_ceil(10)) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        stream.write_all(piece).await.unwrap();
    }
    let o = read_response(&mut stream).await;
    assert_eq!(o.status(), Some(201), "{o:?}");
}

/// A body that stops arriving is answered 408 `body_timeout` after the
/// idle timeout, not held until the header or request deadlines.
#[tokio::test]
async fn a_stalled_body_is_408() {
    let app = support::setup(&Settings {
        limits: Limits {
            body_idle_timeout: Duration::from_millis(300),
            ..Limits::default()
        },
        ..Settings::default()
    })
    .await;
    let served = Served::start(app.router.clone(), EdgeSettings::default()).await;
    let mut stream = served.connect().await;
    let uri = "/api/v1/repositories/demo/objects/stat";
    stream
        .write_all(head("POST", uri, 100).as_bytes())
        .await
        .unwrap();
    stream.write_all(br#"{"paths": ["#).await.unwrap();
    let start = Instant::now();
    let o = read_response(&mut stream).await;
    assert_eq!(o.status(), Some(408), "{o:?}");
    assert_eq!(o.json()["error"]["code"], "body_timeout");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

/// A body over the limit is answered 413 before it is read. The client,
/// still sending, reads the whole answer, and the connection then ends
/// with a close, not a reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_large_body_still_gets_its_answer_and_a_graceful_close() {
    let app = support::setup(&Settings::default()).await;
    let served = Served::start(app.router.clone(), EdgeSettings::default()).await;
    let stream = served.connect().await;
    let (read, mut write) = stream.into_split();
    let uri = "/api/v1/repositories/demo/objects/stat";
    let total = 64 << 20;
    write
        .write_all(head("POST", uri, total).as_bytes())
        .await
        .unwrap();
    // Keeps sending for a while, as a client uploading a large body does.
    let writer = tokio::spawn(async move {
        let chunk = vec![b' '; 64 * 1024];
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(500) {
            if write.write_all(&chunk).await.is_err() {
                break;
            }
        }
        write
    });
    let mut stream = read.reunite(writer.await.unwrap()).unwrap();
    let o = read_response(&mut stream).await;
    assert_eq!(o.status(), Some(413), "{o:?}");
    assert_eq!(o.json()["error"]["code"], "payload_too_large");
    assert!(o.closes(), "the unread body ends the connection: {o:?}");
    assert!(ends_gracefully(&mut stream).await, "a reset after the 413");
}

/// An answer that leaves a small body unread (no such route, a refused
/// import) drains it, so the connection carries the next request.
#[tokio::test]
async fn an_unread_small_body_is_drained_and_the_connection_kept() {
    let app = support::setup(&Settings::default()).await;
    let served = Served::start(app.router.clone(), EdgeSettings::default()).await;
    let mut stream = served.connect().await;
    let body = vec![b'x'; 200 * 1024];
    let mut req = head("POST", "/no/such/route", body.len()).into_bytes();
    req.extend_from_slice(&body);
    stream.write_all(&req).await.unwrap();
    let o = read_response(&mut stream).await;
    assert_eq!(o.status(), Some(404), "{o:?}");
    assert!(!o.closes(), "drained, so kept: {o:?}");
    stream.write_all(&stat_get(1)).await.unwrap();
    assert_eq!(read_response(&mut stream).await.status(), Some(200));
}
