//! Migrations on databases that are not fresh: one holding the seed
//! benchmark's own table, and one migrated by an earlier release.

use crate::support::client;
use server::db;

/// The seed's setup script's table (seed 000), created before the server
/// ever ran: the server migrates around it and serves its rows.
#[tokio::test]
async fn a_database_with_the_seed_benchmarks_table_migrates_and_keeps_its_rows() {
    let database = embedded_pg::testing::database().await.unwrap();
    let client = client(&database.config).await;
    client
        .batch_execute(
            "CREATE TABLE random_read_test (pk text PRIMARY KEY, payload text);
             INSERT INTO random_read_test VALUES ('00000000000000000001', '1 - ******');",
        )
        .await
        .unwrap();
    db::migrate(&database.config).await.expect("migrates");
    let payload: String = client
        .query_one("SELECT payload FROM random_read_test", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(payload, "1 - ******");
    // Migrating again is a no-op.
    db::migrate(&database.config).await.unwrap();
}

/// A database migrated before `random_read_test` became `IF NOT EXISTS`
/// has the old checksum on record; refinery would refuse it as divergent.
#[tokio::test]
async fn a_database_migrated_by_an_earlier_release_still_migrates() {
    let database = embedded_pg::testing::database().await.unwrap();
    db::migrate(&database.config).await.unwrap();
    let client = client(&database.config).await;
    let old_sql = include_str!("../../src/db/superseded/V20261121000000__object_metadata.sql");
    let old = refinery::Migration::unapplied("V20261121000000__object_metadata", old_sql)
        .unwrap()
        .checksum()
        .to_string();
    let set = client
        .execute(
            "UPDATE refinery_schema_history SET checksum = $1 WHERE version = 20261121000000",
            &[&old],
        )
        .await
        .unwrap();
    assert_eq!(set, 1);

    db::migrate(&database.config)
        .await
        .expect("an earlier release's database migrates");
    let now: String = client
        .query_one(
            "SELECT checksum FROM refinery_schema_history WHERE version = 20261121000000",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_ne!(now, old, "the new text's checksum is on record");

    // Any other divergence is still refused.
    client
        .execute(
            "UPDATE refinery_schema_history SET checksum = '1' WHERE version = 20261121000000",
            &[],
        )
        .await
        .unwrap();
    let err = db::migrate(&database.config).await.unwrap_err();
    assert!(format!("{err:#}").contains("migration"), "{err:#}");
}
