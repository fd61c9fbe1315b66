//! The admin commands beside a serving server: they use its embedded
//! cluster through the socket; a second server refuses to share it.

use server::db::Database;
use server::settings::DbSettings;

#[tokio::test]
async fn admin_commands_attach_to_the_running_cluster_and_a_second_server_refuses_it() {
    // Under the temporary directory itself: the `postgres` OS user (when
    // the tests run as root) must be able to reach it.
    let data_dir = std::env::temp_dir().join(format!("pgbatch-attach-{}", std::process::id()));
    let settings = DbSettings {
        url: None,
        data_dir: data_dir.clone(),
        pool_size: 2,
        ..DbSettings::default()
    };
    let serving = Database::open(&settings).await.expect("the first start");
    assert!(serving.cluster.is_some());

    let admin = Database::open_or_attach(&settings).await.unwrap();
    assert!(admin.cluster.is_none(), "attached, not started");
    let client = server::db::Postgres::from(&admin).connect().await.unwrap();
    let db: String = client
        .query_one("SELECT current_database()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(db, "pgbatch");
    drop(client);
    admin.close().await; // stops nothing

    let err = Database::open(&settings).await.unwrap_err();
    let message = format!("{err:#}");
    assert!(message.contains("already runs on"), "{message}");

    // The serving cluster still answers.
    let client = server::db::Postgres::from(&serving)
        .connect()
        .await
        .unwrap();
    client.query_one("SELECT 1", &[]).await.unwrap();
    drop(client);
    serving.close().await;
    // Once it is stopped, the admin commands start it themselves.
    let admin = Database::open_or_attach(&settings).await.unwrap();
    assert!(admin.cluster.is_some());
    admin.close().await;
    let _ = std::fs::remove_dir_all(&data_dir);
    let _ = std::fs::remove_file(data_dir.with_extension("log"));
}
