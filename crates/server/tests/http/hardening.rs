//! The defects of the hardening review, each reproduced against a real
//! Postgres: imports longer than the read deadline, slow uploads starving
//! reads, a frozen database hanging requests, batch requests partly queued
//! under overload, lenient path decoding.

use crate::support;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{get, send, send_full, stat_uri, ADMIN_TOKEN};
use axum::body::{Body, Bytes};
use axum::http::{Method, Request, StatusCode};
use futures_util::StreamExt as _;
use serde_json::json;
use server::settings::{BatchSettings, ImportSettings, ReadSettings, Settings, WriteSettings};
use tokio::sync::Barrier;

/// One NDJSON object line for path `p`.
fn line(p: &str) -> String {
    format!(
        "{}\n",
        json!({"path": p, "physical_address": "s3://x", "size_bytes": 1, "checksum": "c"})
    )
}

/// An import request whose body sends `lines` one at a time, `gap` apart.
fn trickled_import(repo: &str, lines: Vec<String>, gap: Duration) -> Request<Body> {
    let chunks = futures_util::stream::unfold(lines.into_iter(), move |mut rest| async move {
        let next = rest.next()?;
        tokio::time::sleep(gap).await;
        Some((Ok::<_, Infallible>(Bytes::from(next)), rest))
    });
    Request::post(format!(
        "/api/v1/repositories/{repo}/objects/import?policy=skip"
    ))
    .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
    .body(Body::from_stream(chunks))
    .unwrap()
}

/// The default settings with a 150 ms read deadline: work that must not
/// run under it (imports, writes) is easy to catch outlasting it.
fn short_read_deadline() -> Settings {
    Settings {
        read: ReadSettings {
            timeout: Duration::from_millis(150),
            ..ReadSettings::default()
        },
        ..Settings::default()
    }
}

fn paths(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| line(&format!("{prefix}/{i:04}"))).collect()
}

/// Defect 1: the pool's statement_timeout (the read deadline) used to
/// cancel an import's COPY, reported as "database unavailable".
#[tokio::test]
async fn an_import_outlasting_the_read_deadline_commits() {
    let app = support::setup(&short_read_deadline()).await;
    // 40 lines over about a second: far past the read deadline.
    let req = trickled_import("empty", paths("slow", 40), Duration::from_millis(25));
    let (status, body) = send(&app.router, req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["rows"], 40, "{body}");
    assert_eq!(support::objects_in(&app.config, "empty").await, 40);
}

/// Defect 2: an upload held a connection of the read pool for its whole
/// body, so a few slow uploaders denied reads to everyone.
#[tokio::test]
async fn slow_uploads_neither_starve_reads_nor_queue() {
    let app = support::setup(&Settings {
        import: ImportSettings {
            concurrency: 2,
            ..ImportSettings::default()
        },
        ..Settings::default()
    })
    .await;
    // The read pool has 4 connections; 6 uploaders would have held them
    // all.
    let uploads: Vec<_> = (0..6)
        .map(|i| {
            let router = app.router.clone();
            tokio::spawn(async move {
                let req = trickled_import(
                    "empty",
                    paths(&format!("u{i}"), 15),
                    Duration::from_millis(60),
                );
                send_full(&router, req).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut reads = Vec::new();
    for n in 1..=30u64 {
        let uri = stat_uri("demo", &server::db::seed::object_path(n));
        reads.push(send(&app.router, get(&uri)).await.0);
    }
    assert!(
        reads.iter().all(|s| *s == StatusCode::OK),
        "reads during slow uploads: {reads:?}"
    );
    let mut ok = 0;
    let mut refused = 0;
    for upload in uploads {
        let (status, headers, body) = upload.await.unwrap();
        match status {
            StatusCode::OK => ok += 1,
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(body["error"]["code"], "overloaded", "{body}");
                assert!(headers.contains_key("retry-after"));
                refused += 1;
            }
            other => panic!("upload: {other} {body}"),
        }
    }
    assert!(ok >= 2 && refused >= 1, "ok {ok}, refused {refused}");
}

/// An upload that stops sending is abandoned after the idle timeout, with
/// nothing committed, and frees its slot.
#[tokio::test]
async fn a_stalled_import_body_is_408_and_frees_its_slot() {
    let app = support::setup(&Settings {
        import: ImportSettings {
            concurrency: 1,
            idle_timeout: Duration::from_millis(200),
            ..ImportSettings::default()
        },
        ..Settings::default()
    })
    .await;
    let lines = paths("stall", 2);
    let chunks =
        futures_util::stream::iter(lines.into_iter().enumerate()).then(|(i, l)| async move {
            if i == 1 {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Ok::<_, Infallible>(Bytes::from(l))
        });
    let req = Request::post("/api/v1/repositories/empty/objects/import")
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .body(Body::from_stream(chunks))
        .unwrap();
    let start = Instant::now();
    let (status, body) = send(&app.router, req).await;
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT, "{body}");
    assert_eq!(body["error"]["code"], "body_timeout");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(support::objects_in(&app.config, "empty").await, 0);
    // The one import slot is free again.
    let req = trickled_import("empty", paths("after", 2), Duration::ZERO);
    assert_eq!(send(&app.router, req).await.0, StatusCode::OK);
}

/// Defect 3: with Postgres frozen (SIGSTOP: connections open, nothing
/// answers), writes, repository operations, imports and token lookups
/// hung until it came back, then answered 2xx.
#[tokio::test]
async fn a_frozen_database_bounds_every_request() {
    let cluster = embedded_pg::testing::private_cluster()
        .await
        .expect("a private cluster");
    let config = cluster.config("postgres");
    server::testing::prepare(&config, 10, 10, ADMIN_TOKEN)
        .await
        .unwrap();
    let (mut client, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    server::domain::auth::create_user(&mut client, "late", &["*".to_owned()], &[])
        .await
        .unwrap();
    server::domain::auth::add_token(&client, "late", "not-yet-cached", "test")
        .await
        .unwrap();
    drop(client);

    let deadline = Duration::from_millis(400);
    let app = support::app_on(
        &config,
        &Settings {
            read: ReadSettings {
                timeout: deadline,
                ..ReadSettings::default()
            },
            write: WriteSettings {
                timeout: deadline,
                ..WriteSettings::default()
            },
            import: ImportSettings {
                timeout: deadline,
                ..ImportSettings::default()
            },
            ..Settings::default()
        },
    )
    .await;
    // Warm the pool and the admin token's cache entry.
    let stat = stat_uri("demo", &server::db::seed::object_path(1));
    assert_eq!(send(&app.router, get(&stat)).await.0, StatusCode::OK);

    let frozen = cluster.freeze().expect("freeze");
    let authed = |method: Method, uri: &str, body: Body| {
        Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
            .header("content-type", "application/json")
            .body(body)
            .unwrap()
    };
    let object = format!(
        "/api/v1/repositories/demo/objects?path={}",
        server::db::seed::object_path(2)
    );
    let cases = vec![
        (
            "delete object",
            authed(Method::DELETE, &object, Body::empty()),
        ),
        (
            "list repositories",
            authed(Method::GET, "/api/v1/repositories", Body::empty()),
        ),
        (
            "create repository",
            authed(
                Method::POST,
                "/api/v1/repositories",
                Body::from(json!({"name": "frozen", "storage_namespace": "s3://f/"}).to_string()),
            ),
        ),
        (
            "delete repository",
            authed(Method::DELETE, "/api/v1/repositories/demo", Body::empty()),
        ),
        (
            "import",
            authed(
                Method::POST,
                "/api/v1/repositories/demo/objects/import",
                Body::from(line("frozen/1")),
            ),
        ),
        (
            "put",
            authed(
                Method::PUT,
                "/api/v1/repositories/demo/objects?path=frozen/2",
                Body::from(
                    json!({"physical_address": "x", "size_bytes": 1, "checksum": "c"}).to_string(),
                ),
            ),
        ),
        ("stat", get(&stat)),
        (
            "uncached token",
            support::get_as("/api/v1/user", Some("not-yet-cached")),
        ),
    ];
    let tasks: Vec<_> = cases
        .into_iter()
        .map(|(what, req)| {
            let router = app.router.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                // Far shorter than the freeze: a hang fails here.
                let answer = tokio::time::timeout(Duration::from_secs(5), send(&router, req)).await;
                (what, answer, start.elapsed())
            })
        })
        .collect();
    for task in tasks {
        let (what, answer, took) = task.await.unwrap();
        let (status, body) = answer.unwrap_or_else(|_| panic!("{what}: no answer within 5 s"));
        assert!(
            status == StatusCode::GATEWAY_TIMEOUT || status == StatusCode::SERVICE_UNAVAILABLE,
            "{what}: {status} {body}"
        );
        assert!(body["error"]["code"].is_string(), "{what}: {body}");
        assert!(took < Duration::from_secs(3), "{what}: {took:?}");
    }
    drop(frozen);
    // Back at once: the next read is served.
    let mut status = StatusCode::INTERNAL_SERVER_ERROR;
    for _ in 0..50 {
        status = send(&app.router, get(&stat)).await.0;
        if status == StatusCode::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, StatusCode::OK, "after thawing");
}

/// Defect 4: under overload a batch request was partly queued, then
/// failed for the keys that found the queue full, throwing away the work
/// done for the others. Now it is admitted whole or refused whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_requests_are_admitted_whole_or_refused_whole() {
    let app = support::setup(&Settings {
        read: ReadSettings {
            batch: BatchSettings {
                queue_capacity: 1500,
                ..BatchSettings::default()
            },
            ..ReadSettings::default()
        },
        ..Settings::default()
    })
    .await;
    let body = json!({
        "paths": (0..1000).map(server::db::seed::object_path).collect::<Vec<_>>()
    })
    .to_string();
    let clients = 24;
    let start = Arc::new(Barrier::new(clients));
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (router, body, start) = (app.router.clone(), body.clone(), Arc::clone(&start));
            tokio::spawn(async move {
                start.wait().await;
                let mut statuses = Vec::new();
                for _ in 0..5 {
                    let req =
                        support::post_json("/api/v1/repositories/demo/objects/stat", body.clone());
                    let (status, body) = send(&router, req).await;
                    if status == StatusCode::OK {
                        assert_eq!(body["results"].as_array().map(Vec::len), Some(1000));
                    } else {
                        assert_eq!(body["error"]["code"], "overloaded", "{status} {body}");
                    }
                    statuses.push(status);
                }
                statuses
            })
        })
        .collect();
    let mut ok = 0;
    let mut shed = 0;
    for task in tasks {
        for status in task.await.unwrap() {
            match status {
                StatusCode::OK => ok += 1,
                StatusCode::SERVICE_UNAVAILABLE => shed += 1,
                other => panic!("only 200 or 503 expected, got {other}"),
            }
        }
    }
    assert!(ok > 0, "some requests are served");
    assert!(shed > 0, "the test overloads the service");
    let stats = app.state.reads.object_stat.batcher_stats().unwrap();
    assert_eq!(
        stats.overloaded, 0,
        "no key was refused by the batcher after its request was admitted"
    );
    assert_eq!(stats.timed_out, 0);
}

/// Defect 6: path parameters were decoded leniently (`%ZZ` kept as text)
/// while query strings were strict.
#[tokio::test]
async fn malformed_escapes_in_path_parameters_are_400() {
    let app = support::setup(&Settings::default()).await;
    support::assert_error_cases(
        &app.router,
        vec![
            (
                get("/api/v1/kv/%ZZ"),
                StatusCode::BAD_REQUEST,
                "invalid_path_parameter",
                "percent-encoding",
            ),
            (
                get("/api/v1/repositories/de%G0mo/objects/stat?path=a"),
                StatusCode::BAD_REQUEST,
                "invalid_path_parameter",
                "percent-encoding",
            ),
        ],
    )
    .await;
    // A well-formed escape still decodes.
    let (status, _) = send(
        &app.router,
        get("/api/v1/kv/%30%30%30%30%30%30%30%30%30%30%30%30%30%30%30%30%30%30%34%32"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

/// Defect 1's misreport: a COPY that Postgres cancels at its statement
/// timeout was answered "database unavailable"; it is a timeout.
#[tokio::test]
async fn an_import_cancelled_by_its_statement_timeout_is_a_timeout() {
    use pgbatch::pg::copy::{self, ConflictPolicy};
    use server::domain::failure::{Failure, Work};

    let config = support::database().await;
    let (mut client, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
        .batch_execute("SET statement_timeout = 150")
        .await
        .unwrap();
    // Cancelled while waiting for a slow body, and while rows stream in
    // faster than the server takes them.
    let slow = trickled_import("empty", paths("cut", 20), Duration::from_millis(30)).into_body();
    let big: String = paths("big", 100_000).concat();
    let chunks: Vec<Result<Bytes, Infallible>> = big
        .as_bytes()
        .chunks(64 * 1024)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    let fast = Body::from_stream(futures_util::stream::iter(chunks));
    for (what, body) in [("slow", slow), ("fast", fast)] {
        let source =
            server::domain::import::NdjsonObjects::new(body, "empty", &ImportSettings::default());
        let err = copy::import(
            &mut client,
            &server::db::queries::objects::OBJECT_TABLE,
            source,
            ConflictPolicy::Skip,
        )
        .await
        .unwrap_err();
        let failure = Failure::from(err);
        assert!(
            matches!(failure, Failure::Timeout(Work::Write)),
            "{what}: {failure:?}"
        );
    }
}

/// Writes used to run on the read pool, whose statement timeout is the
/// read deadline: Postgres cut any write waiting longer than that, far
/// inside the write deadline.
#[tokio::test]
async fn a_write_waiting_past_the_read_deadline_commits() {
    let app = support::setup(&short_read_deadline()).await;
    let path = server::db::seed::object_path(3);
    // Another session holds the row for 400 ms.
    let locker = support::client(&app.config).await;
    locker
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM objects WHERE repository = 'demo' AND path = '{path}' FOR UPDATE"
        ))
        .await
        .unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        locker.batch_execute("COMMIT").await.unwrap();
    });
    let body = json!({"physical_address": "s3://new", "size_bytes": 2, "checksum": "c2"});
    let req = Request::put(format!("/api/v1/repositories/demo/objects?path={path}"))
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let (status, body) = send(&app.router, req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    release.await.unwrap();
}
