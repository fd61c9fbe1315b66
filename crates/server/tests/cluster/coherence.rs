//! Two instances on one database behave as one service: a change made
//! through either (or by hand) reaches the other's caches through
//! LISTEN/NOTIFY, and a lost listener never lets a cache serve a stale
//! value after it is back.

use crate::support;

use std::time::{Duration, Instant};

use crate::support::{
    client, get, get_as, physical_address, read_path, send, stat_uri, until, TestApp, ADMIN_TOKEN,
};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::Value;
use server::db::seed::object_path;
use server::settings::{InvalidationSettings, ReadPath, Settings};

/// Two instances, each with its object and token caches, on one database.
async fn two_instances() -> (TestApp, TestApp) {
    two_instances_with(read_path(ReadPath::Cached)).await
}

async fn two_instances_with(settings: Settings) -> (TestApp, TestApp) {
    let db = support::database().await;
    let a = support::app_on(&db, &settings).await;
    let b = support::app_on(&db, &settings).await;
    for app in [&a, &b] {
        until("the listener is up", || listening(app, 1)).await;
    }
    (a, b)
}

/// The change reached `app` as notifications, not through a bypassed
/// cache or a flush for an unreadable payload.
fn delivered(app: &TestApp) {
    let c = &app.state.coherence;
    assert!(c.received() >= 1, "no notification applied");
    assert_eq!(c.failures(), 0, "the listener failed");
    assert_eq!(c.unreadable(), 0, "an unreadable notification");
    assert!(c.caches_usable());
}

fn listening(app: &TestApp, connects: u64) -> bool {
    app.state.coherence.caches_usable() && app.state.coherence.connects() >= connects
}

async fn sql(app: &TestApp, statement: &str) -> u64 {
    client(&app.config)
        .await
        .execute(statement, &[])
        .await
        .unwrap()
}

#[tokio::test]
async fn a_write_through_one_instance_is_read_through_the_others_cache() {
    let (a, b) = two_instances().await;
    let path = object_path(5);
    let before = physical_address(&a.router, &path).await; // now cached in a
    assert_eq!(physical_address(&a.router, &path).await, before);

    let (status, body) = send(&b.router, support::put_object(&path, "s3://moved/by-b")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let acked = Instant::now();
    let mut stale = 0;
    while physical_address(&a.router, &path).await != "s3://moved/by-b" {
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
    delivered(&a);
    // And the other way round, for a delete.
    let delete = Request::delete(format!("/api/v1/repositories/demo/objects?path={path}"))
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(physical_address(&b.router, &path).await, "s3://moved/by-b");
    assert_eq!(send(&a.router, delete).await.0, StatusCode::NO_CONTENT);
    let uri = stat_uri("demo", &path);
    until_status(&b, &uri, ADMIN_TOKEN, StatusCode::NOT_FOUND).await;
    delivered(&b);
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
    let token = support::user_with_token(&a.config, "carol").await;
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
    // Revoking a token nobody has touches no row: nothing is sent.
    let nothing = Request::delete("/api/v1/user/tokens/0123456789abcdef")
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&b.router, nothing).await.0, StatusCode::NOT_FOUND);

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
    delivered(&a);
}

#[tokio::test]
async fn a_lost_listener_bypasses_the_caches_and_flushes_them_when_back() {
    // A long first backoff, so the change below surely lands while no one
    // listens.
    let mut settings = read_path(ReadPath::Cached);
    settings.invalidation = InvalidationSettings {
        reconnect_min: Duration::from_secs(3),
        ..InvalidationSettings::default()
    };
    let (a, _b) = two_instances_with(settings).await;
    let path = object_path(9);
    let before = physical_address(&a.router, &path).await; // cached
    assert_ne!(before, "s3://changed/while-deaf");

    let killed = sql(
        &a,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'pgbatch-listener' AND datname = current_database()",
    )
    .await;
    assert_eq!(killed, 2, "both instances' listeners");
    until("a notices its listener is gone", || {
        !a.state.coherence.caches_usable()
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
    assert!(!a.state.coherence.caches_usable(), "still deaf");
    // Read through to the database while the listener is down.
    assert_eq!(
        physical_address(&a.router, &path).await,
        "s3://changed/while-deaf"
    );
    // Not cached meanwhile, and flushed when it is back.
    until("a listens again", || listening(&a, 2)).await;
    assert_eq!(
        physical_address(&a.router, &path).await,
        "s3://changed/while-deaf"
    );
    assert_eq!(
        physical_address(&a.router, &path).await,
        "s3://changed/while-deaf"
    );
}

#[tokio::test]
async fn a_change_of_hundreds_of_rows_reaches_the_other_caches() {
    let (a, b) = two_instances().await;
    let path = object_path(11);
    let before = send(&a.router, get(&stat_uri("demo", &path))).await.1["size_bytes"]
        .as_i64()
        .unwrap();
    // 300 rows in one statement: more keys than one notification holds.
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
    delivered(&a);
}

/// Listens on the database of `app` with a connection of its own, runs
/// `statements`, and returns every payload sent up to a marker.
async fn payloads_of(app: &TestApp, statements: &str) -> Vec<String> {
    use futures_util::future::poll_fn;
    let (listener, mut conn) = app.config.connect(tokio_postgres::NoTls).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = poll_fn(|cx| conn.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    listener
        .batch_execute("LISTEN pgbatch_invalidate")
        .await
        .unwrap();
    let client = client(&app.config).await;
    client.batch_execute(statements).await.unwrap();
    client
        .batch_execute("NOTIFY pgbatch_invalidate, 'marker'")
        .await
        .unwrap();
    let mut out = Vec::new();
    loop {
        let payload = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("the marker arrives")
            .unwrap();
        if payload == "marker" {
            return out;
        }
        out.push(payload);
    }
}

#[tokio::test]
async fn the_triggers_send_every_key_in_payloads_under_the_limit_and_nothing_for_no_row() {
    let app = support::setup(&Settings::default()).await;
    let nothing = payloads_of(
        &app,
        "DELETE FROM tokens WHERE false; UPDATE objects SET size_bytes = 0 WHERE false; \
         DELETE FROM objects WHERE false;",
    )
    .await;
    assert!(nothing.is_empty(), "{nothing:?}");

    // 300 rows with long paths: several payloads, each under 8,000 bytes,
    // naming every key; no "drop everything".
    let long = "x".repeat(900);
    let payloads = payloads_of(
        &app,
        &format!("UPDATE objects SET path = path || '/{long}' WHERE repository = 'demo'"),
    )
    .await;
    assert!(payloads.len() > 1, "{}", payloads.len());
    let mut keys = std::collections::HashSet::new();
    for p in &payloads {
        assert!(p.len() < 8_000, "{} bytes", p.len());
        let v: Value = serde_json::from_str(p).unwrap();
        assert_eq!(v["c"], "objects", "{p}");
        for k in v["k"].as_array().unwrap() {
            keys.insert(k[1].as_str().unwrap().to_owned());
        }
    }
    // The keys before and after the update: both may be cached.
    assert_eq!(keys.len(), 2 * support::SEEDED as usize);
    assert!(keys.contains(&object_path(1)));
    assert!(keys.contains(&format!("{}/{long}", object_path(1))));

    // Past 10,000 rows (an import): one "drop everything".
    let bulk = payloads_of(
        &app,
        "INSERT INTO objects (repository, path, physical_address, size_bytes, checksum) \
         SELECT 'demo', 'bulk/' || n, 's3://b', 1, 'c' FROM generate_series(1, 10001) AS n",
    )
    .await;
    assert_eq!(bulk, [r#"{"c":"objects","all":true}"#]);
}

#[tokio::test]
async fn with_second_miss_admission_a_stored_value_is_still_invalidated_by_the_other_instance() {
    let mut settings = read_path(ReadPath::Cached);
    settings.read.cache.admission = pgbatch::cache::Admission::SecondMiss;
    let (a, b) = two_instances_with(settings).await;
    let path = object_path(6);
    let stats = |app: &TestApp| {
        let caches = app.state.reads.cache_stats();
        let (_, s) = caches
            .iter()
            .find(|(name, _)| *name == "object_stat")
            .unwrap();
        s.clone()
    };
    let before = physical_address(&a.router, &path).await;
    assert_eq!(stats(&a).not_admitted, 1, "the first miss is not stored");
    assert_eq!(physical_address(&a.router, &path).await, before); // stored now
    assert_eq!(physical_address(&a.router, &path).await, before);
    assert!(stats(&a).hits >= 1, "{:?}", stats(&a));

    let (status, body) = send(&b.router, support::put_object(&path, "s3://moved/again")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let acked = Instant::now();
    while physical_address(&a.router, &path).await != "s3://moved/again" {
        assert!(
            acked.elapsed() < Duration::from_secs(10),
            "a never saw b's write"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    delivered(&a);
}

#[tokio::test]
async fn a_busy_read_pool_neither_delays_invalidations_nor_takes_the_listener_down() {
    // Pings every 100 ms, each allowed 300 ms: a ping that waited for a
    // read connection would hold the caches' proof up, and one that timed
    // out would bring the listener down. Pings have a connection of their
    // own.
    let mut settings = read_path(ReadPath::Cached);
    settings.invalidation = InvalidationSettings {
        ping_every: Duration::from_millis(100),
        ping_timeout: Duration::from_millis(300),
        ..InvalidationSettings::default()
    };
    let (a, b) = two_instances_with(settings).await;
    let path = object_path(13);
    let before = physical_address(&a.router, &path).await; // cached in a
    let hold = |pool: &pgbatch::pg::Pool| {
        let pool = pool.clone();
        async move {
            let mut held = Vec::new();
            for _ in 0..pool.status().max_size {
                held.push(pool.get().await.expect("an idle connection"));
            }
            held
        }
    };

    // Every read connection is taken, for 600 ms (six pings; the listener
    // is given up after three intervals and the timeout without a proof).
    let held = hold(&a.state.pool).await;
    let held_at = Instant::now();
    let received = a.state.coherence.received();
    let (status, body) = send(
        &b.router,
        support::put_object(&path, "s3://moved/while-busy"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let acked = Instant::now();
    until("a applies b's change", || {
        a.state.coherence.received() > received
    })
    .await;
    eprintln!("applied {:?} after b's ack", acked.elapsed());
    tokio::time::sleep(Duration::from_millis(600).saturating_sub(held_at.elapsed())).await;
    assert_eq!(a.state.coherence.failures(), 0, "the listener was given up");
    assert!(a.state.coherence.caches_usable());
    drop(held);
    assert_ne!(before, "s3://moved/while-busy");
    assert_eq!(
        physical_address(&a.router, &path).await,
        "s3://moved/while-busy"
    );

    // No ping can be sent: the caches are bypassed once no proof has come
    // for the timeout, the listener is given up after three intervals and
    // the timeout, and it comes back once pings go through again.
    let held = hold(&a.state.notify).await;
    until("a bypasses its caches", || {
        !a.state.coherence.caches_usable()
    })
    .await;
    until("a gives its listener up", || {
        a.state.coherence.failures() >= 1
    })
    .await;
    drop(held);
    until("a listens again", || listening(&a, 2)).await;
}
