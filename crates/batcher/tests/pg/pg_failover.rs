//! The pool's connections across nodes: a hung host is passed over within
//! its deadline, a statement abandoned at its deadline takes its connection
//! out of the pool, and `target_session_attrs` picks the node, on real
//! clusters (frozen with SIGSTOP, or streaming replicas).

use std::time::{Duration, Instant};

use embedded_pg::Cluster;
use pgbatch::pg::{parse_config, pool, Connector, Lease, PoolOptions, TargetSessionAttrs};

/// `key=value` settings naming `clusters` in order.
fn hosts(clusters: &[&Cluster], extra: &str) -> String {
    let sockets: Vec<String> = clusters
        .iter()
        .map(|c| c.socket_dir().display().to_string())
        .collect();
    let ports: Vec<String> = clusters.iter().map(|c| c.port().to_string()).collect();
    format!(
        "host={} port={} user=postgres dbname=postgres {extra}",
        sockets.join(","),
        ports.join(",")
    )
}

async fn in_recovery(lease: &Lease) -> bool {
    lease
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_hung_first_host_is_passed_over_within_its_deadline() {
    let hung = embedded_pg::testing::private_cluster().await.unwrap();
    let live = embedded_pg::testing::private_cluster().await.unwrap();
    let _frozen = hung.freeze().unwrap();
    let (config, attrs) = parse_config(&hosts(&[&hung, &live], "")).unwrap();
    let options = PoolOptions::with_max_size(2)
        .host_timeout(Duration::from_millis(300))
        .target_session_attrs(attrs);
    let pool = pool(config, &options).unwrap();

    let started = Instant::now();
    let first = Lease::get(&pool)
        .await
        .expect("the live host, after the hung one");
    let row = first.query_one("SELECT 1", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 1);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "{took:?}");
    // The hung host is now tried last: the next connection does not wait
    // for it.
    let started = Instant::now();
    let second = Lease::get(&pool).await.unwrap();
    second.query_one("SELECT 1", &[]).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    first.release();
    second.release();
}

#[tokio::test]
async fn a_connect_abandoned_on_the_next_host_leaves_it_before_the_hung_one() {
    // A caller whose deadline is one host's (a health check, a ping)
    // gives up just as the live host's turn begins: that says nothing of
    // the live host, which must still be tried before the hung one.
    let hung = embedded_pg::testing::private_cluster().await.unwrap();
    let live = embedded_pg::testing::private_cluster().await.unwrap();
    let _frozen = hung.freeze().unwrap();
    let (config, attrs) = parse_config(&hosts(&[&hung, &live], "")).unwrap();
    let host_timeout = Duration::from_millis(400);
    // The caller's deadline falls 1 ms into the live host's turn; on a
    // loaded machine the attempt can end on the tick that deadline
    // passes, which proves nothing, so that case starts over with a new
    // connector (no marks).
    let mut tries = 0;
    let connector = loop {
        tries += 1;
        let connector = Connector::new(config.clone(), tokio_postgres::NoTls)
            .target_session_attrs(attrs)
            .host_timeout(host_timeout);
        let gave_up =
            tokio::time::timeout(host_timeout + Duration::from_millis(1), connector.connect())
                .await;
        if gave_up.is_err() {
            break connector;
        }
        assert!(tries < 5, "the hung host never held the first attempt");
    };
    let started = Instant::now();
    let (client, conn) = tokio::time::timeout(Duration::from_secs(5), connector.connect())
        .await
        .expect("a connection within both hosts' deadlines")
        .expect("the live host");
    let took = started.elapsed();
    tokio::spawn(conn);
    let row = client.query_one("SELECT 1", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 1);
    assert!(
        took < host_timeout,
        "the live host was tried after the hung one: {took:?}"
    );
}

#[tokio::test]
async fn an_abandoned_statement_takes_its_connection_out_of_the_pool() {
    let db = embedded_pg::testing::database().await.unwrap();
    let pool = pool(db.config.clone(), &PoolOptions::with_max_size(1)).unwrap();
    let lease = Lease::get(&pool).await.unwrap();
    let pid: i32 = lease
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    // Abandoned at its deadline: the future holding the lease is dropped.
    let abandoned = tokio::time::timeout(Duration::from_millis(100), async move {
        lease.execute("SELECT pg_sleep(30)", &[]).await.unwrap();
        lease.release();
    })
    .await;
    assert!(abandoned.is_err());
    assert_eq!(pool.status().size, 0, "the connection left the pool");
    // The next statement gets a new connection, not one queued behind
    // the sleep.
    let started = Instant::now();
    let fresh = Lease::get(&pool).await.unwrap();
    let other: i32 = fresh
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    assert_ne!(other, pid);
    assert!(started.elapsed() < Duration::from_secs(2));
    fresh.release();
    assert_eq!(pool.status().size, 1, "a released connection stays");
}

#[tokio::test]
async fn target_session_attrs_pick_the_node() {
    let primary = embedded_pg::testing::private_cluster().await.unwrap();
    let standby = embedded_pg::testing::private_replica_with(&primary, |o| o)
        .await
        .unwrap();
    for (order, attrs, wants_standby) in [
        ([&standby, &primary], "primary", false),
        ([&standby, &primary], "read-write", false),
        ([&primary, &standby], "standby", true),
        ([&primary, &standby], "prefer-standby", true),
        ([&primary, &standby], "read-only", true),
    ] {
        let text = hosts(&order, &format!("target_session_attrs={attrs}"));
        let (config, attrs) = parse_config(&text).unwrap();
        let pool = pool(
            config,
            &PoolOptions::with_max_size(1).target_session_attrs(attrs),
        )
        .unwrap();
        let lease = Lease::get(&pool).await.unwrap();
        assert_eq!(in_recovery(&lease).await, wants_standby, "{attrs}");
        lease.release();
    }

    // No host fits: the server's own refusal, with a SQLSTATE that says the
    // node is not usable.
    let (config, _) = parse_config(&hosts(&[&standby], "")).unwrap();
    let refused = Connector::new(config, tokio_postgres::NoTls)
        .target_session_attrs(TargetSessionAttrs::Primary)
        .connect()
        .await
        .err()
        .expect("a standby is not a primary");
    assert_eq!(refused.code().map(|c| c.code()), Some("25006"), "{refused}");
    assert_eq!(
        pgbatch::pg::classify(&refused),
        pgbatch::pg::DbErrorKind::Unavailable
    );
    let (config, _) = parse_config(&hosts(&[&primary], "")).unwrap();
    let refused = Connector::new(config, tokio_postgres::NoTls)
        .target_session_attrs(TargetSessionAttrs::Standby)
        .connect()
        .await
        .err()
        .expect("a primary is not a standby");
    assert_eq!(refused.code().map(|c| c.code()), Some("08004"), "{refused}");
}

async fn backend_pid(lease: &Lease) -> i32 {
    lease
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn prefer_standby_reuses_its_connections() {
    // A primary listed first is connected to and let go on every new
    // connection: that must not read as the node changing, which would
    // discard the pool's older connections.
    let primary = embedded_pg::testing::private_cluster().await.unwrap();
    let standby = embedded_pg::testing::private_replica_with(&primary, |o| o)
        .await
        .unwrap();
    let text = hosts(&[&primary, &standby], "target_session_attrs=prefer-standby");
    let (config, attrs) = parse_config(&text).unwrap();
    let pool = pool(
        config,
        &PoolOptions::with_max_size(2).target_session_attrs(attrs),
    )
    .unwrap();
    let (a, b) = (
        Lease::get(&pool).await.unwrap(),
        Lease::get(&pool).await.unwrap(),
    );
    let mut first = vec![backend_pid(&a).await, backend_pid(&b).await];
    a.release();
    b.release();
    let (a, b) = (
        Lease::get(&pool).await.unwrap(),
        Lease::get(&pool).await.unwrap(),
    );
    let mut again = vec![backend_pid(&a).await, backend_pid(&b).await];
    assert!(in_recovery(&a).await && in_recovery(&b).await);
    first.sort_unstable();
    again.sort_unstable();
    assert_eq!(first, again, "both connections were used again");
    a.release();
    b.release();
}
