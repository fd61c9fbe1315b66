//! Under overload the service sheds load at once (503 with Retry-After),
//! and a lookup past its deadline is a 504, on both read paths. A table
//! lock held by another session makes the database "slow" on demand.

use crate::support;

use std::time::{Duration, Instant};

use crate::support::{get, send, send_full};
use axum::http::StatusCode;
use server::db::queries::kv::kv_pk;
use server::settings::{BatchSettings, ReadPath, ReadSettings, Settings};
use tokio_postgres::NoTls;

/// Holds an exclusive lock on `random_read_test` until `release`.
struct TableLock(tokio_postgres::Client);

impl TableLock {
    async fn take(config: &tokio_postgres::Config) -> Self {
        let (client, conn) = config.connect(NoTls).await.unwrap();
        tokio::spawn(conn);
        client
            .batch_execute("BEGIN; LOCK TABLE random_read_test IN ACCESS EXCLUSIVE MODE")
            .await
            .unwrap();
        Self(client)
    }

    async fn release(self) {
        self.0.batch_execute("COMMIT").await.unwrap();
    }
}

fn kv(n: u64) -> axum::http::Request<axum::body::Body> {
    get(&format!("/api/v1/kv/{}", kv_pk(n)))
}

#[tokio::test]
async fn a_lookup_past_its_deadline_is_504_and_the_database_gives_up_too() {
    let config = support::database().await;
    for read_path in [ReadPath::Naive, ReadPath::Batched] {
        let app = support::app_on(
            &config,
            &Settings {
                read: ReadSettings {
                    path: read_path,
                    timeout: Duration::from_millis(200),
                    ..ReadSettings::default()
                },
                ..Settings::default()
            },
        )
        .await;
        let lock = TableLock::take(&config).await;
        let start = Instant::now();
        let (status, body) = send(&app.router, kv(1)).await;
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{read_path:?}: {body}");
        assert_eq!(body["error"]["code"], "timeout");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{read_path:?}: {:?}",
            start.elapsed()
        );

        // statement_timeout ended the blocked statement on the server, so
        // the pool's connections are free again even while the lock holds.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (client, conn) = config.connect(NoTls).await.unwrap();
        tokio::spawn(conn);
        let waiting: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND datname = current_database()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            waiting, 0,
            "{read_path:?}: statements still waiting on the lock"
        );

        lock.release().await;
        assert_eq!(
            send(&app.router, kv(1)).await.0,
            StatusCode::OK,
            "{read_path:?}"
        );
    }
}

#[tokio::test]
async fn a_full_queue_sheds_load_at_once_with_503_and_retry_after() {
    let config = support::database().await;
    let app = support::app_on(
        &config,
        &Settings {
            read: ReadSettings {
                path: ReadPath::Batched,
                batch: BatchSettings {
                    max_batch_size: 1,
                    concurrency: pgbatch::Concurrency::Fixed(1),
                    queue_capacity: 2,
                    ..BatchSettings::default()
                },
                timeout: Duration::from_secs(10),
                ..ReadSettings::default()
            },
            ..Settings::default()
        },
    )
    .await;
    let lock = TableLock::take(&config).await;

    // One lookup runs (blocked on the lock) and one waits in the batcher:
    // the two keys `queue_capacity` lets in flight.
    let mut blocked = Vec::new();
    for n in 1..=2 {
        let router = app.router.clone();
        blocked.push(tokio::spawn(async move { send(&router, kv(n)).await }));
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (_, s) = &app.state.reads.batcher_stats()[0];
            let held = s.in_flight_batches + s.pending_keys + s.queued;
            if held >= n {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "lookup {n} never reached the batcher: {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    let start = Instant::now();
    let (status, headers, body) = send_full(&app.router, kv(3)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "overloaded");
    assert_eq!(headers["retry-after"], "1");
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "shedding waits no longer than the admission wait"
    );
    let (_, s) = &app.state.reads.batcher_stats()[0];
    assert_eq!(
        s.requests, 2,
        "the refused lookup never reached the batcher"
    );

    lock.release().await;
    for b in blocked {
        let (status, body) = b.await.unwrap();
        assert_eq!(
            status,
            StatusCode::OK,
            "queued lookups are answered: {body}"
        );
    }
}
