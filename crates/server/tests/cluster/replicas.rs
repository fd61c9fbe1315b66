//! Instances reading from a streaming replica behave as one service with
//! the primary: reads go to the replica while it keeps up, a stopped
//! replica fails no request, a lagging one never answers a read that
//! presented a newer position, and the caches never keep what the
//! replica has not replayed yet.
//!
//! Each test starts its own primary and replica (`pg_basebackup -R`,
//! through `embedded_pg`), and two instances on them.

use crate::support;

use std::time::{Duration, Instant};

use crate::support::{
    client, get, read_path, send, send_full, stat_uri, until, TestApp, ADMIN_TOKEN, SEEDED,
};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use embedded_pg::{Cluster, ClusterOptions};
use server::cluster::replicas::Fallback;
use server::db::seed::object_path;
use server::db::Postgres;
use server::http::position::HEADER;
use server::settings::{Pooler, ReadPath, ReplicaSettings, Settings};
use server::AppState;

const DB: &str = "pgbatch";

/// A primary with the service's schema and demo data, and a replica of it
/// (holding its changes back by `apply_delay`).
struct Deployment {
    primary: Cluster,
    replica: Cluster,
    /// How the replica was started, to start it again.
    replica_options: ClusterOptions,
}

async fn deployment(apply_delay: &str) -> Deployment {
    let primary = embedded_pg::testing::private_cluster().await.unwrap();
    let admin = client(&primary.config("postgres")).await;
    admin
        .batch_execute(&format!("CREATE DATABASE {DB}"))
        .await
        .unwrap();
    let config = primary.config(DB);
    server::testing::prepare(&config, SEEDED, 0, ADMIN_TOKEN)
        .await
        .unwrap();
    let replica_options = embedded_pg::testing::private_options()
        .unwrap()
        .replica_of(&primary)
        .setting("recovery_min_apply_delay", apply_delay);
    let replica = Cluster::start(replica_options.clone()).await.unwrap();
    Deployment {
        primary,
        replica,
        replica_options,
    }
}

impl Deployment {
    /// An instance on the primary reading from the replica, once its
    /// listener is up and the replica usable.
    async fn instance(&self, settings: &Settings) -> TestApp {
        let replica = Postgres::from(self.replica.config(DB));
        let state =
            AppState::connect_with_replicas(self.primary.config(DB), &[replica], 4, settings)
                .unwrap();
        until("the listener is up and the replica usable", || {
            state.coherence.caches_usable()
                && state.coherence.connects() >= 1
                && state.router.replicas()[0].usable
        })
        .await;
        TestApp {
            router: server::app(state.clone()),
            state,
            config: self.primary.config(DB),
        }
    }
}

/// `path` with replicas allowed to lag `max_lag`, polled every 20 ms.
fn settings(path: ReadPath, max_lag: Duration) -> Settings {
    Settings {
        replicas: ReplicaSettings {
            max_lag,
            poll_every: Duration::from_millis(20),
            ..ReplicaSettings::default()
        },
        ..read_path(path)
    }
}

/// Waits until `app` may use the replica again, then reads objects `keys`
/// and checks that the replica answered some.
async fn assert_replica_read_again(app: &TestApp, keys: std::ops::RangeInclusive<u64>) {
    until("the replica is usable again", || {
        app.state.router.replicas()[0].usable
    })
    .await;
    let before = replica_reads(app);
    for i in keys {
        assert!(address(app, &object_path(i), None).await.is_some());
    }
    assert!(replica_reads(app) > before, "the replica is read again");
}

fn replica_reads(app: &TestApp) -> u64 {
    app.state.router.replicas()[0].reads
}

fn fallbacks(app: &TestApp, why: Fallback) -> u64 {
    app.state
        .router
        .fallbacks()
        .iter()
        .find(|(f, _)| *f == why)
        .map_or(0, |(_, n)| *n)
}

/// Writes `address` at `path` through `app`; returns the position header.
async fn write(app: &TestApp, path: &str, address: &str) -> String {
    let (status, headers, body) = send_full(&app.router, support::put_object(path, address)).await;
    assert!(status.is_success(), "{status} {body}");
    headers
        .get(HEADER)
        .expect("a write's answer carries its position")
        .to_str()
        .unwrap()
        .to_owned()
}

/// The object's address as `app` reads it, presenting `position` if given
/// (`None` when there is no such object).
async fn address(app: &TestApp, path: &str, position: Option<&str>) -> Option<String> {
    let mut req = Request::get(stat_uri("demo", path))
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"));
    if let Some(lsn) = position {
        req = req.header(HEADER, lsn);
    }
    let (status, body) = send(&app.router, req.body(Body::empty()).unwrap()).await;
    match status {
        StatusCode::OK => Some(body["physical_address"].as_str().unwrap().to_owned()),
        StatusCode::NOT_FOUND => None,
        other => panic!("{other}: {body}"),
    }
}

#[tokio::test]
async fn reads_go_to_the_replica_and_a_stopped_replica_fails_no_request() {
    let mut d = deployment("0").await;
    let a = d
        .instance(&settings(ReadPath::Batched, Duration::from_secs(5)))
        .await;
    for i in 1..=20 {
        assert!(address(&a, &object_path(i), None).await.is_some());
    }
    assert!(replica_reads(&a) >= 1, "no read reached the replica");

    // Readers run on while the replica stops, and after.
    let stop_readers = tokio_util::sync::CancellationToken::new();
    let readers: Vec<_> = (0..8)
        .map(|r| {
            let app = a.router.clone();
            let stop = stop_readers.clone();
            tokio::spawn(async move {
                let mut served = 0_u64;
                let mut i = r;
                while !stop.is_cancelled() {
                    let uri = stat_uri("demo", &object_path(1 + i % SEEDED));
                    let (status, body) = send(&app, get(&uri)).await;
                    assert_eq!(status, StatusCode::OK, "{body}");
                    served += 1;
                    i += 8;
                }
                served
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    d.replica.stop().await;
    until("the replica is skipped", || {
        !a.state.router.replicas()[0].usable
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_readers.cancel();
    let mut served = 0;
    for reader in readers {
        served += reader.await.expect("every read was answered 200");
    }
    assert!(served > 0);
    let fell_back = fallbacks(&a, Fallback::NoneUsable) + fallbacks(&a, Fallback::ReplicaFailed);
    assert!(fell_back >= 1, "reads went to the primary meanwhile");

    // Started again, the replica is used again.
    d.replica = Cluster::start(d.replica_options.clone()).await.unwrap();
    assert_replica_read_again(&a, 1..=20).await;
}

/// Behind a transaction-mode pooler with no direct URL there is no
/// listener (and no cache), but the replicas are still polled and read:
/// the poller starts with the state, not with the listener.
#[tokio::test]
async fn without_a_listener_the_replica_is_still_polled_and_read() {
    let d = deployment("0").await;
    let mut primary = Postgres::from(d.primary.config(DB));
    primary.pooler = Pooler::Transaction;
    let replica = Postgres::from(d.replica.config(DB));
    let settings = settings(ReadPath::Batched, Duration::from_secs(5));
    let state = AppState::connect_with_replicas(primary, &[replica], 4, &settings).unwrap();
    until("the replica is usable", || {
        state.router.replicas()[0].usable
    })
    .await;
    assert!(!state.coherence.caches_usable(), "no listener, so no cache");
    let app = TestApp {
        router: server::app(state.clone()),
        state,
        config: d.primary.config(DB),
    };
    for i in 1..=20 {
        assert!(address(&app, &object_path(i), None).await.is_some());
    }
    assert!(replica_reads(&app) >= 1, "no read reached the replica");
}

#[tokio::test]
async fn a_lagging_replica_never_answers_a_read_that_presents_a_newer_position() {
    // Ten seconds of delay, allowed: the replica stays in use, and every
    // change below is still held back on it when it is read.
    let d = deployment("10s").await;
    let relaxed = settings(ReadPath::Batched, Duration::from_secs(60));
    let a = d.instance(&relaxed).await;
    let b = d.instance(&relaxed).await;

    let path = "new/after-the-replica.txt";
    let position = write(&a, path, "s3://new").await;
    // Without the position, b reads the replica, which has not replayed
    // the write: the consistency model's "may lag" case, seen for real.
    assert_eq!(address(&b, path, None).await, None);
    // With it, b answers from the primary.
    let before = fallbacks(&b, Fallback::PositionNotReplayed);
    assert_eq!(
        address(&b, path, Some(&position)).await.as_deref(),
        Some("s3://new")
    );
    assert!(fallbacks(&b, Fallback::PositionNotReplayed) > before);

    // A batch stat presenting the position sees it too.
    let req = Request::post("/api/v1/repositories/demo/objects/stat")
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .header("content-type", "application/json")
        .header(HEADER, &position)
        .body(Body::from(
            serde_json::json!({ "paths": [path, path] }).to_string(),
        ))
        .unwrap();
    let (status, headers, body) = send_full(&b.router, req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(headers.get(HEADER).is_none(), "a batch stat is a read");
    for result in body["results"].as_array().unwrap() {
        assert_eq!(result["object"]["physical_address"], "s3://new", "{body}");
    }

    // A position that is not one is refused, naming the header.
    let req = Request::get(stat_uri("demo", path))
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .header(HEADER, "yesterday")
        .body(Body::empty())
        .unwrap();
    let (status, body) = send(&b.router, req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "invalid_lsn");
}

#[tokio::test]
async fn caches_never_refill_from_a_replica_behind_an_invalidation() {
    let d = deployment("10s").await;
    let cached = settings(ReadPath::Cached, Duration::from_secs(60));
    let a = d.instance(&cached).await;
    let b = d.instance(&cached).await;
    // A listener that starts listening puts the floor of cache fills at
    // the primary's position then, which the listeners' own pings (each a
    // commit) keep ahead of a replica delayed 10 s: until the replica has
    // replayed that far, b fills its cache from the primary.
    // Objects 9 and up, each read once (7 and 8 are the test's).
    let mut unread = 9..=SEEDED;
    while replica_reads(&b) == 0 {
        let i = unread
            .next()
            .expect("b never filled its cache from the replica");
        assert!(address(&b, &object_path(i), None).await.is_some());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let path = object_path(7);
    let before = replica_reads(&b);
    let old = address(&b, &path, None).await.expect("seeded");
    assert!(
        replica_reads(&b) > before,
        "b's cache was filled from the replica"
    );
    assert_eq!(
        address(&b, &path, None).await.as_deref(),
        Some(old.as_str())
    );

    let received = b.state.coherence.received();
    write(&a, &path, "s3://changed").await;
    until("b received the change", || {
        b.state.coherence.received() > received
    })
    .await;
    // The replica still holds the old value for seconds; b's cache must
    // not be refilled from it.
    for _ in 0..20 {
        assert_eq!(
            address(&b, &path, None).await.as_deref(),
            Some("s3://changed")
        );
    }
    assert!(fallbacks(&b, Fallback::CacheFill) >= 1);

    // b's listener killed: a change made meanwhile is never notified to
    // b. After b reconnects it flushes, and its cache must not refill from
    // the replica, which is still seconds behind that change.
    let path = object_path(8);
    assert!(address(&b, &path, None).await.is_some()); // cached in b
    let admin = client(&d.primary.config(DB)).await;
    let connects = b.state.coherence.connects();
    let killed = admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = 'pgbatch-listener' AND datname = current_database()",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(killed, 2, "both instances' listeners");
    until("b notices its listener is gone", || {
        !b.state.coherence.caches_usable()
    })
    .await;
    admin
        .execute(
            "UPDATE objects SET physical_address = 's3://while-deaf' \
             WHERE path = $1",
            &[&path],
        )
        .await
        .unwrap();
    until("b listens again", || {
        b.state.coherence.caches_usable() && b.state.coherence.connects() > connects
    })
    .await;
    for _ in 0..10 {
        assert_eq!(
            address(&b, &path, None).await.as_deref(),
            Some("s3://while-deaf")
        );
    }
}

#[tokio::test]
async fn a_frozen_replica_costs_reads_time_but_fails_none() {
    let d = deployment("0").await;
    let a = d
        .instance(&settings(ReadPath::Batched, Duration::from_secs(5)))
        .await;
    for i in 1..=10 {
        assert!(address(&a, &object_path(i), None).await.is_some());
    }
    assert!(replica_reads(&a) >= 1);
    // SIGSTOP: the replica's connections stay open and nothing answers.
    let frozen = d.replica.freeze().unwrap();
    for i in 11..=30 {
        assert!(address(&a, &object_path(i), None).await.is_some());
    }
    assert!(
        fallbacks(&a, Fallback::ReplicaFailed) >= 1,
        "a read timed out on it and ran again"
    );
    assert!(!a.state.router.replicas()[0].usable);
    drop(frozen);
    assert_replica_read_again(&a, 31..=40).await;
}

#[tokio::test]
async fn a_revoked_token_is_refused_though_the_replica_still_has_it() {
    // The replica holds every change back 2 s: long enough for the checks
    // below to run while it still has the revoked token.
    let d = deployment("2s").await;
    let cached = settings(ReadPath::Cached, Duration::from_secs(60));
    let a = d.instance(&cached).await;
    let b = d.instance(&cached).await;
    let token = support::user_with_token(&d.primary.config(DB), "dave").await;
    let uri = stat_uri("demo", &object_path(1));
    // Not on the replica yet: found on the primary after the replica
    // does not know it.
    let (status, body) = send(&b.router, support::get_as(&uri, Some(&token))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Now wait until the replica has it, so it would answer for it.
    let on_replica = client(&d.replica.config(DB)).await;
    let start = Instant::now();
    loop {
        let n: i64 = on_replica
            .query_one(
                "SELECT count(*) FROM tokens t JOIN users u ON u.id = t.user_id \
                 WHERE u.name = 'dave'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if n == 1 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the replica never got the token"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tokens = send(
        &a.router,
        support::get_as("/api/v1/user/tokens", Some(&token)),
    )
    .await
    .1;
    let id = tokens["tokens"][0]["id"].as_str().unwrap().to_owned();
    let received = b.state.coherence.received();
    let revoke = Request::delete(format!("/api/v1/user/tokens/{id}"))
        .header("authorization", format!("Bearer {token}"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&a.router, revoke).await.0, StatusCode::NO_CONTENT);
    until("b received the revocation", || {
        b.state.coherence.received() > received
    })
    .await;
    let (status, body) = send(&b.router, support::get_as(&uri, Some(&token))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    // Nor does an old position let the lagging replica answer for it,
    // on either instance.
    for app in [&a, &b] {
        let req = Request::get(&uri)
            .header("authorization", format!("Bearer {token}"))
            .header(HEADER, "0/0")
            .body(Body::empty())
            .unwrap();
        let (status, body) = send(&app.router, req).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    }
}
