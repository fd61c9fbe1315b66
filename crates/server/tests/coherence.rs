//! Two instances on one database behave as one service: a change made
//! through either (or by hand) reaches the other's caches through
//! LISTEN/NOTIFY, and a lost listener never lets a cache serve a stale
//! value after it is back.

mod support;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::Value;
use server::seed::object_path;
use server::settings::ReadPath;
use support::{get, get_as, read_path, send, stat_uri, TestApp, ADMIN_TOKEN};

/// Two instances, each with its object and token caches, on one database.
async fn two_instances() -> (TestApp, TestApp) {
    let db = support::database().await;
    let settings = read_path(ReadPath::Cached);
    let a = support::app_on(&db, &settings).await;
    let b = support::app_on(&db, &settings).await;
    for app in [&a, &b] {
        until("the listener is up", || listening(app, 1)).await;
    }
    (a, b)
}

fn listening(app: &TestApp, connects: u64) -> bool {
    app.state.coherence.caches_usable() && app.state.coherence.connects() >= connects
}

/// Polls `done` every millisecond; panics after 10 s.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "never: {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn address_of(app: &TestApp, path: &str) -> String {
    let (status, body) = send(&app.router, get(&stat_uri("demo", path))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["physical_address"].as_str().unwrap().to_owned()
}

fn put(path: &str, address: &str) -> Request<Body> {
    let body = serde_json::json!({
        "physical_address": address,
        "size_bytes": 1,
        "checksum": "c",
    });
    Request::put(format!("/api/v1/repositories/demo/objects?path={path}"))
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn sql(app: &TestApp, statement: &str) -> u64 {
    let (client, conn) = app.config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client.execute(statement, &[]).await.unwrap()
}

#[tokio::test]
async fn a_write_through_one_instance_is_read_through_the_others_cache() {
    let (a, b) = two_instances().await;
    let path = object_path(5);
    let before = address_of(&a, &path).await; // now cached in a
    assert_eq!(address_of(&a, &path).await, before);

    let (status, body) = send(&b.router, put(&path, "s3://moved/by-b")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let acked = Instant::now();
    let mut stale = 0;
    while address_of(&a, &path).await != "s3://moved/by-b" {
        stale += 1;
        assert!(
            acked.elapsed() < Duration::from_secs(10),
            "a never saw b's write"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    eprintln!(
        "seen through a's cache {:?} after b's ack ({stale} stale reads)",
        acked.elapsed()
    );
    assert!(a.state.coherence.received() >= 1);
    // And the other way round, for a delete.
    let delete = Request::delete(format!("/api/v1/repositories/demo/objects?path={path}"))
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(address_of(&b, &path).await, "s3://moved/by-b");
    assert_eq!(send(&a.router, delete).await.0, StatusCode::NO_CONTENT);
    let uri = stat_uri("demo", &path);
    until_status(&b, &uri, ADMIN_TOKEN, StatusCode::NOT_FOUND).await;
}

async fn until_status(app: &TestApp, uri: &str, token: &str, want: StatusCode) -> Value {
    let start = Instant::now();
    loop {
        let (status, body) = send(&app.router, get_as(uri, Some(token))).await;
        if status == want {
            return body;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never {want}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test]
async fn a_token_revoked_on_one_instance_is_refused_by_the_other() {
    let (a, b) = two_instances().await;
    let c = {
        let (client, conn) = a.config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client
    };
    let mut c2 = {
        let (client, conn) = a.config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client
    };
    server::auth::create_user(&mut c2, "carol", &["demo".to_owned()], &[])
        .await
        .unwrap();
    let token = server::auth::new_token().unwrap();
    server::auth::add_token(&c, "carol", &token, "laptop")
        .await
        .unwrap();
    let uri = stat_uri("demo", &object_path(1));
    for app in [&a, &b] {
        until_status(app, &uri, &token, StatusCode::OK).await; // cached in both
    }
    let tokens = send(&b.router, get_as("/api/v1/user/tokens", Some(&token)))
        .await
        .1;
    let id = tokens["tokens"][0]["id"].as_str().unwrap().to_owned();
    let revoke = Request::delete(format!("/api/v1/user/tokens/{id}"))
        .header("authorization", format!("Bearer {token}"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&b.router, revoke).await.0, StatusCode::NO_CONTENT);
    let revoked = Instant::now();
    let body = until_status(&a, &uri, &token, StatusCode::UNAUTHORIZED).await;
    assert_eq!(body["error"]["code"], "unknown_token");
    eprintln!("refused by a {:?} after b revoked it", revoked.elapsed());

    // A policy change reaches the other instance's cached principal too.
    let granted = stat_uri("empty", "x");
    let (status, _) = send(&a.router, get(&granted)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "admin reads everything");
    sql(
        &b,
        "DELETE FROM policies WHERE user_id = (SELECT id FROM users WHERE name = 'admin')",
    )
    .await;
    until_status(&a, &granted, ADMIN_TOKEN, StatusCode::FORBIDDEN).await;
}

#[tokio::test]
async fn a_lost_listener_bypasses_the_caches_and_flushes_them_when_back() {
    let (a, _b) = two_instances().await;
    let path = object_path(9);
    let before = address_of(&a, &path).await; // cached
    assert_ne!(before, "s3://changed/while-deaf");

    let killed = sql(
        &a,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'pgbatch-listener' AND datname = current_database()",
    )
    .await;
    assert_eq!(killed, 2, "both instances' listeners");
    until("a notices its listener is gone", || {
        !a.state.coherence.caches_usable() || a.state.coherence.connects() >= 2
    })
    .await;
    // Nobody listens now: this change's notification is lost.
    let changed = sql(
        &a,
        &format!(
            "UPDATE objects SET physical_address = 's3://changed/while-deaf' \
             WHERE repository = 'demo' AND path = '{path}'"
        ),
    )
    .await;
    assert_eq!(changed, 1);
    // Read through while the listener is down, or flushed when it came back.
    assert_eq!(address_of(&a, &path).await, "s3://changed/while-deaf");
    until("a listens again", || listening(&a, 2)).await;
    assert_eq!(address_of(&a, &path).await, "s3://changed/while-deaf");
    assert_eq!(address_of(&a, &path).await, "s3://changed/while-deaf");
}

#[tokio::test]
async fn a_change_too_large_to_list_flushes_the_other_caches() {
    let (a, b) = two_instances().await;
    let path = object_path(11);
    let before = send(&a.router, get(&stat_uri("demo", &path))).await.1["size_bytes"]
        .as_i64()
        .unwrap();
    // 300 rows in one statement: more keys than a notification lists.
    let n = sql(
        &b,
        "UPDATE objects SET size_bytes = size_bytes + 1 WHERE repository = 'demo'",
    )
    .await;
    assert!(n > 100, "{n}");
    let start = Instant::now();
    loop {
        let now = send(&a.router, get(&stat_uri("demo", &path))).await.1["size_bytes"]
            .as_i64()
            .unwrap();
        if now == before + 1 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "never flushed");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
