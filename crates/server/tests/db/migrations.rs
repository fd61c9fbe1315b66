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

/// The checksum refinery recorded for `V20261121000000__object_metadata`
/// as development databases made before 2026-11-22 applied it: its text
/// was changed (to `CREATE TABLE IF NOT EXISTS random_read_test`) before
/// any release.
const DEVELOPMENT_CHECKSUM: &str = "4476754471378026892";

/// A development database made before 2026-11-22 is refused, with an error
/// that names the migration, and the one statement the CHANGELOG gives
/// makes it migrate.
#[tokio::test]
async fn an_early_development_database_is_refused_and_the_documented_fix_migrates_it() {
    let database = embedded_pg::testing::database().await.unwrap();
    db::migrate(&database.config).await.unwrap();
    let client = client(&database.config).await;
    let current: String = client
        .query_one(
            "SELECT checksum FROM refinery_schema_history WHERE version = 20261121000000",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    client
        .execute(
            "UPDATE refinery_schema_history SET checksum = $1 WHERE version = 20261121000000",
            &[&DEVELOPMENT_CHECKSUM],
        )
        .await
        .unwrap();
    let err = db::migrate(&database.config).await.unwrap_err();
    assert!(
        format!("{err:#}").contains("is different than filesystem one"),
        "{err:#}"
    );

    let changelog = include_str!("../../../../CHANGELOG.md");
    assert!(changelog.contains(FIX_STATEMENT), "{FIX_STATEMENT}");
    client
        .batch_execute(FIX_STATEMENT)
        .await
        .expect("the CHANGELOG's statement runs");
    db::migrate(&database.config)
        .await
        .expect("a fixed development database migrates");
    let now: String = client
        .query_one(
            "SELECT checksum FROM refinery_schema_history WHERE version = 20261121000000",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(now, current);
}

/// The statement the CHANGELOG gives, word for word.
const FIX_STATEMENT: &str = "UPDATE refinery_schema_history SET checksum = '11369972078624577421' \
     WHERE version = 20261121000000 AND checksum = '4476754471378026892'";
