//! The service behind a real PgBouncer (Debian's package, started here in
//! front of a throwaway cluster), as managed Postgres offerings put one in
//! front of the database: every path works through a transaction-mode
//! pooler, two instances stay coherent with a direct URL for the listener,
//! without one the caches are bypassed and never stale, a listener through
//! the pooler is found deaf, and the wrong setting gets an error that says
//! so.

use crate::support;

use std::time::{Duration, Instant};

use crate::support::{
    get, get_as, physical_address, put_object, send, stat_uri, until, ADMIN_TOKEN,
};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use embedded_pg::pgbouncer::{PgBouncer, PoolMode};
use embedded_pg::Cluster;
use serde_json::json;
use server::db::seed::object_path;
use server::db::Database;
use server::settings::{DbSettings, Pooler, ReadPath, Settings};
use server::{app, AppState};

/// A seeded cluster with PgBouncer in front of it, in `mode`, with few
/// server connections so that clients really share them.
async fn behind(mode: PoolMode) -> (Cluster, PgBouncer) {
    let cluster = embedded_pg::testing::private_cluster()
        .await
        .expect("a private cluster");
    let config = cluster.config("postgres");
    server::testing::prepare(&config, 300, 300, ADMIN_TOKEN)
        .await
        .unwrap();
    let bouncer = PgBouncer::start(&cluster, mode, 3)
        .await
        .expect("PgBouncer (scripts/ensure-pgbouncer.sh installs it)");
    (cluster, bouncer)
}

/// An instance as `serve` builds it, over `database_url` (and
/// `direct_url`), with `pooler` and `settings`.
async fn instance(
    database_url: &str,
    direct_url: Option<&str>,
    pooler: Pooler,
    settings: &Settings,
) -> (Database, AppState, axum::Router) {
    let database = Database::open(&DbSettings {
        url: Some(database_url.to_owned()),
        direct_url: direct_url.map(str::to_owned),
        pooler,
        ..DbSettings::default()
    })
    .await
    .unwrap();
    let state = AppState::for_database(&database, 4, settings).unwrap();
    let router = app(state.clone());
    (database, state, router)
}

fn cached() -> Settings {
    support::read_path(ReadPath::Cached)
}

fn authed(method: Method, uri: &str, body: Body) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .header("content-type", "application/json")
        .body(body)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_path_works_through_a_transaction_mode_pooler() {
    let (cluster, bouncer) = behind(PoolMode::Transaction).await;
    let direct = support::key_values(&cluster.config("postgres"));
    let (database, state, router) = instance(
        &support::key_values(&bouncer.config("postgres")),
        Some(&direct),
        Pooler::Auto,
        &cached(),
    )
    .await;
    assert_eq!(database.pooler, Pooler::Transaction, "found out at start");
    until("the listener proved delivery", || {
        state.coherence.caches_usable()
    })
    .await;

    // Concurrent single stats and batch stats: batched loads and cache
    // fills, on server connections that change under them.
    let mut tasks = Vec::new();
    for i in 0..40u64 {
        let router = router.clone();
        tasks.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            for j in 0..10 {
                let n = 1 + (i * 10 + j) % 300;
                let (status, body) = send(&router, get(&stat_uri("demo", &object_path(n)))).await;
                if status != StatusCode::OK {
                    failures.push(body);
                }
                let paths: Vec<String> = (n..n + 5).map(object_path).collect();
                let req = authed(
                    Method::POST,
                    "/api/v1/repositories/demo/objects/stat",
                    Body::from(json!({ "paths": paths }).to_string()),
                );
                let (status, body) = send(&router, req).await;
                if status != StatusCode::OK {
                    failures.push(body);
                }
            }
            failures
        }));
    }
    for t in tasks {
        let failures = t.await.unwrap();
        assert!(failures.is_empty(), "{failures:?}");
    }

    // Micro-batched writes, read back at once.
    let mut writes = Vec::new();
    for i in 0..30 {
        let router = router.clone();
        writes.push(tokio::spawn(async move {
            send(
                &router,
                put_object(&format!("pooled/{i}"), &format!("s3://p/{i}")),
            )
            .await
        }));
    }
    for w in writes {
        let (status, body) = w.await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    assert_eq!(physical_address(&router, "pooled/7").await, "s3://p/7");

    // An import: COPY through a temporary table in one transaction.
    let lines: String = (0..100)
        .map(|i| {
            json!({"path": format!("imported/{i}"), "physical_address": "s3://i/", "size_bytes": 1, "checksum": "c"})
                .to_string()
                + "\n"
        })
        .collect();
    let req = Request::post("/api/v1/repositories/demo/objects/import?policy=overwrite")
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .header("content-type", "application/x-ndjson")
        .body(Body::from(lines))
        .unwrap();
    let (status, body) = send(&router, req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["inserted"], 100);

    // Repositories: create, list, delete.
    let create = authed(
        Method::POST,
        "/api/v1/repositories",
        Body::from(json!({"name": "pooled", "storage_namespace": "s3://pooled/"}).to_string()),
    );
    let (status, body) = send(&router, create).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = send(&router, get("/api/v1/repositories")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let delete = authed(Method::DELETE, "/api/v1/repositories/pooled", Body::empty());
    assert_eq!(send(&router, delete).await.0, StatusCode::NO_CONTENT);

    // Auth: a new user's token, then its revocation, refused at once.
    let token = support::user_with_token(&cluster.config("postgres"), "pooled_user").await;
    let uri = stat_uri("demo", &object_path(1));
    let (status, body) = send(&router, get_as(&uri, Some(&token))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = send(&router, get_as("/api/v1/user/tokens", Some(&token))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let id = body["tokens"][0]["id"].as_str().unwrap().to_owned();
    let revoke = Request::delete(format!("/api/v1/user/tokens/{id}"))
        .header("authorization", format!("Bearer {token}"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, revoke).await.0, StatusCode::NO_CONTENT);
    assert_eq!(
        send(&router, get_as(&uri, Some(&token))).await.0,
        StatusCode::UNAUTHORIZED
    );
    state.shutdown().await;
    drop(bouncer);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_behind_the_pooler_stay_coherent_with_a_direct_url() {
    let (cluster, bouncer) = behind(PoolMode::Transaction).await;
    let pooled = support::key_values(&bouncer.config("postgres"));
    let direct = support::key_values(&cluster.config("postgres"));
    let (_, a, a_router) = instance(&pooled, Some(&direct), Pooler::Transaction, &cached()).await;
    let (_, b, b_router) = instance(&pooled, Some(&direct), Pooler::Transaction, &cached()).await;
    for s in [&a, &b] {
        until("the listener proved delivery", || {
            s.coherence.caches_usable()
        })
        .await;
    }
    let path = object_path(9);
    let before = physical_address(&b_router, &path).await; // now cached in b
    assert_eq!(physical_address(&b_router, &path).await, before);
    let (status, body) = send(&a_router, put_object(&path, "s3://moved/by-a")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let start = Instant::now();
    while physical_address(&b_router, &path).await != "s3://moved/by-a" {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "b still serves the old object"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(b.coherence.received() >= 1, "it came as a notification");
    a.shutdown().await;
    b.shutdown().await;
    drop(bouncer);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_direct_url_the_caches_are_bypassed_and_never_stale() {
    let (cluster, bouncer) = behind(PoolMode::Transaction).await;
    let pooled = support::key_values(&bouncer.config("postgres"));
    let (_, a, a_router) = instance(&pooled, None, Pooler::Auto, &cached()).await;
    let (_, b, b_router) = instance(&pooled, None, Pooler::Auto, &cached()).await;
    let path = object_path(11);
    for round in 0..5 {
        let _ = physical_address(&b_router, &path).await;
        let address = format!("s3://moved/{round}");
        let (status, body) = send(&a_router, put_object(&path, &address)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            physical_address(&b_router, &path).await,
            address,
            "b is never stale"
        );
    }
    assert!(!b.coherence.caches_usable(), "nothing can invalidate them");
    let metrics = support::metrics_text(&b_router).await;
    assert!(
        metrics.contains("cache_coherent 0"),
        "cache_coherent says so: {metrics}"
    );
    a.shutdown().await;
    b.shutdown().await;
    drop(bouncer);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_through_the_pooler_is_found_deaf() {
    let (cluster, bouncer) = behind(PoolMode::Transaction).await;
    let pooled = support::key_values(&bouncer.config("postgres"));
    // Made to listen through the pooler, as a server told the URL is direct
    // would: LISTEN is accepted, then nothing arrives.
    let (_, state, _) = instance(&pooled, None, Pooler::Transaction, &cached()).await;
    state.listen(server::db::Postgres::from(&bouncer.config("postgres")));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        !state.coherence.caches_usable(),
        "a listener that hears nothing never lets the caches be used"
    );
    assert!(state.coherence.failures() >= 1, "its pings went unheard");
    assert_eq!(state.coherence.connects(), 0, "it never proved delivery");
    state.shutdown().await;
    drop(bouncer);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wrong_pooler_setting_is_named_not_called_an_outage() {
    let (cluster, bouncer) = behind(PoolMode::Transaction).await;
    let pooled = support::key_values(&bouncer.config("postgres"));
    let (database, state, router) = instance(
        &pooled,
        Some(&support::key_values(&cluster.config("postgres"))),
        Pooler::None,
        &Settings::default(),
    )
    .await;
    assert_eq!(database.pooler, Pooler::None, "as told");
    let (status, body) = send(&router, get(&stat_uri("demo", &object_path(1)))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "pooler_session_state", "{body}");
    state.shutdown().await;
    drop(bouncer);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_mode_pooler_is_found_and_works() {
    let (cluster, bouncer) = behind(PoolMode::Session).await;
    let pooled = support::key_values(&bouncer.config("postgres"));
    let (database, state, router) = instance(&pooled, None, Pooler::Auto, &cached()).await;
    assert_eq!(database.pooler, Pooler::Session);
    until("the listener proved delivery", || {
        state.coherence.caches_usable()
    })
    .await;
    assert_eq!(
        physical_address(&router, &object_path(2)).await,
        physical_address(&router, &object_path(2)).await
    );
    let (status, body) = send(&router, put_object("session/1", "s3://s/1")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(physical_address(&router, "session/1").await, "s3://s/1");
    state.shutdown().await;
    drop(bouncer);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_the_pooler_a_write_gives_up_in_postgres_too() {
    let (cluster, bouncer) = behind(PoolMode::Transaction).await;
    let settings = Settings {
        write: server::settings::WriteSettings {
            timeout: Duration::from_millis(300),
            ..Default::default()
        },
        ..Settings::default()
    };
    let direct = support::key_values(&cluster.config("postgres"));
    let (_db, state, router) = instance(
        &support::key_values(&bouncer.config("postgres")),
        Some(&direct),
        Pooler::Transaction,
        &settings,
    )
    .await;
    let create = authed(
        Method::POST,
        "/api/v1/repositories",
        Body::from(json!({"name": "locked", "storage_namespace": "s3://l/"}).to_string()),
    );
    assert_eq!(send(&router, create).await.0, StatusCode::CREATED);

    // Another session holds the repository's row, so its delete waits.
    let (mut locker, conn) = cluster
        .config("postgres")
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let tx = locker.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM repositories WHERE name = 'locked' FOR UPDATE",
        &[],
    )
    .await
    .unwrap();
    let delete = authed(Method::DELETE, "/api/v1/repositories/locked", Body::empty());
    let (status, body) = send(&router, delete).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");

    // The pooler's connections carry no statement timeout: the one set in
    // the delete's transaction makes Postgres give up as well, instead of
    // waiting for the lock (and holding a server connection) for good.
    let watcher = support::client(&cluster.config("postgres")).await;
    let waiting = || async {
        watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND query LIKE 'DELETE FROM repositories%'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    let start = Instant::now();
    while waiting().await > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the delete still waits in Postgres after its request's deadline"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tx.rollback().await.unwrap();
    state.shutdown().await;
    drop(bouncer);
    cluster.stop().await;
}
