//! Seeding bulk-loads both tables with binary COPY, in the seed benchmark's
//! format, and leaves tables that already have rows alone.

use server::db::queries::kv::{kv_payload, kv_pk};
use server::db::seed::{object_path, seed, DEMO_REPOSITORY};
use tokio_postgres::NoTls;

#[tokio::test]
async fn seeding_fills_empty_tables_once() {
    let db = embedded_pg::testing::database().await.unwrap();
    server::db::migrate(&db.config).await.unwrap();
    let (client, conn) = db.config.connect(NoTls).await.unwrap();
    tokio::spawn(conn);

    let report = seed(&db.config, 5_000, 7_000).await.unwrap();
    assert_eq!((report.objects.rows, report.kv.rows), (5_000, 7_000));
    assert!(!report.objects.skipped && !report.kv.skipped);
    assert!(report.rows_per_sec() > 0.0);

    let count = |table: &'static str| {
        let client = &client;
        async move {
            let n: i64 = client
                .query_one(&format!("SELECT count(*) FROM {table}"), &[])
                .await
                .unwrap()
                .get(0);
            n
        }
    };
    assert_eq!(count("objects").await, 5_000);
    assert_eq!(count("random_read_test").await, 7_000);

    let row = client
        .query_one(
            "SELECT payload FROM random_read_test WHERE pk = $1",
            &[&kv_pk(7_000)],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), kv_payload(7_000));
    let row = client
        .query_one(
            "SELECT repository, size_bytes >= 0 FROM objects WHERE path = $1",
            &[&object_path(5_000)],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), DEMO_REPOSITORY);
    assert!(row.get::<_, bool>(1));

    // A second run finds rows and changes nothing.
    let again = seed(&db.config, 100, 100).await.unwrap();
    assert!(again.objects.skipped && again.kv.skipped);
    assert_eq!(count("objects").await, 5_000);
    assert_eq!(count("random_read_test").await, 7_000);
}

#[tokio::test]
async fn a_failed_seed_leaves_the_table_empty() {
    let db = embedded_pg::testing::database().await.unwrap();
    server::db::migrate(&db.config).await.unwrap();
    let (client, conn) = db.config.connect(NoTls).await.unwrap();
    tokio::spawn(conn);
    // Make row 1,500 violate a constraint halfway through the COPY.
    client
        .batch_execute(&format!(
            "ALTER TABLE random_read_test ADD CONSTRAINT no_1500 CHECK (pk <> '{}')",
            kv_pk(1_500)
        ))
        .await
        .unwrap();

    let err = seed(&db.config, 0, 3_000).await.unwrap_err();
    assert!(format!("{err:#}").contains("no_1500"), "{err:#}");
    let n: i64 = client
        .query_one("SELECT count(*) FROM random_read_test", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "the COPY's transaction must roll back entirely");
}
