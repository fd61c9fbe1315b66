//! The cluster starts from the installed binaries (as the `postgres` user
//! when run as root), keeps its data across restarts, and stops cleanly.

use embedded_pg::{Cluster, ClusterOptions};
use tokio_postgres::NoTls;

async fn query_one(config: &tokio_postgres::Config, sql: &str) -> String {
    let (client, conn) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(conn);
    let row = client.query_one(sql, &[]).await.expect("query");
    row.get(0)
}

#[tokio::test]
async fn a_cluster_keeps_its_data_across_restarts() {
    let tmp = tempfile::Builder::new()
        .prefix("pgbatch-cluster-")
        .tempdir_in("/tmp")
        .unwrap();
    let dir = tmp.path().join("pg");

    let cluster = Cluster::start(ClusterOptions::new(&dir).port(5499))
        .await
        .unwrap();
    let config = cluster.config("postgres");
    let (client, conn) = config.connect(NoTls).await.unwrap();
    tokio::spawn(conn);
    client
        .batch_execute("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('still here');")
        .await
        .unwrap();
    drop(client);
    cluster.stop().await;
    assert!(
        config.connect(NoTls).await.is_err(),
        "server must be down after stop"
    );

    let cluster = Cluster::start(ClusterOptions::new(&dir).port(5499))
        .await
        .unwrap();
    assert_eq!(
        query_one(&cluster.config("postgres"), "SELECT v FROM kept").await,
        "still here"
    );
    assert!(cluster.log_path().exists());
    cluster.stop().await;
}

#[tokio::test]
async fn test_databases_are_separate() {
    let a = embedded_pg::testing::database().await.unwrap();
    let b = embedded_pg::testing::database().await.unwrap();
    assert_ne!(a.name, b.name);
    assert_eq!(
        query_one(&a.config, "SELECT current_database()::text").await,
        a.name
    );
    assert_eq!(
        query_one(&b.config, "SELECT current_database()::text").await,
        b.name
    );
}

#[tokio::test]
async fn a_non_cluster_directory_is_refused() {
    let tmp = tempfile::Builder::new()
        .prefix("pgbatch-cluster-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::write(tmp.path().join("unrelated.txt"), "hello").unwrap();
    let err = Cluster::start(ClusterOptions::new(tmp.path()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, embedded_pg::Error::NotADataDir { .. }),
        "{err}"
    );
}

#[tokio::test]
async fn listen_tcp_adds_a_loopback_listener() {
    let tmp = tempfile::Builder::new()
        .prefix("pgbatch-cluster-")
        .tempdir_in("/tmp")
        .unwrap();
    // A free port: bound by the OS, then released for the server.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cluster = Cluster::start(
        ClusterOptions::new(tmp.path().join("pg"))
            .port(port)
            .listen_tcp(true),
    )
    .await
    .unwrap();
    let tcp = cluster.tcp_config("postgres").expect("a TCP config");
    assert_eq!(
        cluster.tcp_addr(),
        Some(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
    );
    // The session runs over TCP: the server sees a client address.
    assert_eq!(
        query_one(&tcp, "SELECT host(inet_client_addr())").await,
        "127.0.0.1"
    );
    cluster.stop().await;

    // Without the option there is no TCP config and nothing listens.
    let cluster = Cluster::start(ClusterOptions::new(tmp.path().join("pg2")).port(port))
        .await
        .unwrap();
    assert!(cluster.tcp_config("postgres").is_none());
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    cluster.stop().await;
}

#[tokio::test]
async fn a_running_cluster_is_found_and_never_started_twice() {
    let cluster = embedded_pg::testing::private_cluster().await.unwrap();
    let running = embedded_pg::Running::find(cluster.data_dir()).expect("found running");
    assert_eq!(running.socket_dir, cluster.socket_dir());
    assert_eq!(
        query_one(&running.config("postgres"), "SELECT 'attached'").await,
        "attached"
    );

    let again = Cluster::start(ClusterOptions::new(cluster.data_dir()))
        .await
        .unwrap_err();
    assert!(
        matches!(again, embedded_pg::Error::AlreadyRunning { pid, .. } if pid == running.pid),
        "{again}"
    );
    assert!(again.to_string().contains("already runs on"), "{again}");
    // The first server is untouched.
    assert_eq!(
        query_one(&cluster.config("postgres"), "SELECT 'still here'").await,
        "still here"
    );

    let dir = cluster.data_dir().to_owned();
    cluster.stop().await;
    assert_eq!(embedded_pg::Running::find(&dir), None, "a stopped server");
}

/// That `cluster` is a standby, replaying its primary's WAL.
async fn assert_in_recovery(cluster: &Cluster) {
    let in_recovery = query_one(
        &cluster.config("postgres"),
        "SELECT pg_is_in_recovery()::text",
    )
    .await;
    assert_eq!(in_recovery, "true");
}

#[tokio::test]
async fn a_replica_streams_the_primarys_changes_and_lags_as_told() {
    let primary = embedded_pg::testing::private_cluster().await.unwrap();
    let replica = embedded_pg::testing::private_replica_with(&primary, |o| {
        o.setting("recovery_min_apply_delay", "1s")
    })
    .await
    .unwrap();
    assert_in_recovery(&replica).await;
    let (client, conn) = primary.config("postgres").connect(NoTls).await.unwrap();
    tokio::spawn(conn);
    client
        .batch_execute("CREATE TABLE streamed (v text); INSERT INTO streamed VALUES ('sent');")
        .await
        .unwrap();
    let written = std::time::Instant::now();
    let (reader, conn) = replica.config("postgres").connect(NoTls).await.unwrap();
    tokio::spawn(conn);
    // The delay holds the table back for about a second, then it arrives.
    loop {
        let found = reader
            .query_opt("SELECT v FROM streamed", &[])
            .await
            .ok()
            .flatten();
        if let Some(row) = found {
            assert_eq!(row.get::<_, String>(0), "sent");
            break;
        }
        assert!(written.elapsed() < std::time::Duration::from_secs(30));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(written.elapsed() >= std::time::Duration::from_millis(900));
    replica.stop().await;
    primary.stop().await;
}

/// Socket-only clusters in their own directories may share a port number.
/// A replica's base backup copies the primary's socket lock file, which
/// names the primary's live postmaster; left in place it kept a replica on
/// the same port from starting (a CI run once drew the same free port
/// twice).
#[tokio::test]
async fn a_replica_starts_on_the_port_number_of_its_socket_only_primary() {
    let primary = embedded_pg::testing::private_cluster().await.unwrap();
    let replica = embedded_pg::testing::private_replica_with(&primary, |o| o.port(primary.port()))
        .await
        .unwrap();
    assert_in_recovery(&replica).await;
    replica.stop().await;
    primary.stop().await;
}
