//! What a caller reads when a load fails, on both drivers: the cause in the
//! message, once (a refused connection, a missing column, a pool with no
//! connection to spare), and an outage (the database stopped, each
//! driver's pool at its defaults) that is retryable and says so within the
//! batcher's deadline.

use std::time::{Duration, Instant};

use pgbatch::pg::tokio_postgres::{Error as PgDriverError, Row};
use pgbatch::pg::{self, BatchQuery, Params, PgLoader, PoolOptions};
use pgbatch::sqlx::{PgQuery, SqlxLoader};
use pgbatch::{Batcher, Error};
use sqlx::postgres::PgPoolOptions;

use crate::sqlx_connect::connect_options;

/// `SELECT id, <column> FROM t WHERE id = ANY($1)`.
struct Column(&'static str);

impl BatchQuery for Column {
    type Key = i64;
    type Value = String;

    fn batch_sql(&self) -> &str {
        match self.0 {
            "name" => "SELECT id, name FROM t WHERE id = ANY($1)",
            _ => "SELECT id, nickname FROM t WHERE id = ANY($1)",
        }
    }
    fn batch_params<'a>(&self, keys: &'a [i64]) -> Params<'a> {
        vec![Box::new(keys)]
    }
    fn map_row(&self, row: &Row) -> Result<(i64, String), PgDriverError> {
        Ok((row.try_get(0)?, row.try_get(1)?))
    }
}

impl pgbatch::sqlx::BatchQuery for Column {
    type Key = i64;
    type Row = (i64, String);
    type Value = String;

    fn batch_sql(&self) -> &str {
        BatchQuery::batch_sql(self)
    }
    fn bind_batch<'q>(&self, query: PgQuery<'q>, keys: &'q [i64]) -> PgQuery<'q> {
        query.bind(keys)
    }
    fn map_row(&self, row: (i64, String)) -> (i64, String) {
        row
    }
}

/// A database with `t(id, name)`.
async fn table() -> embedded_pg::testing::TestDatabase {
    let db = embedded_pg::testing::database().await.unwrap();
    let (client, conn) = db.config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
        .batch_execute("CREATE TABLE t (id bigint PRIMARY KEY, name text NOT NULL)")
        .await
        .unwrap();
    db
}

/// Asserts `text` holds `cause` exactly once.
fn once(text: &str, cause: &str) {
    assert_eq!(text.matches(cause).count(), 1, "{cause:?} once in {text:?}");
}

#[tokio::test]
async fn a_missing_column_is_named_in_the_message_once() {
    let db = table().await;
    let pool = pg::pool(db.config.clone(), &PoolOptions::with_max_size(1)).unwrap();
    let b = Batcher::new(PgLoader::new(pool, Column("nickname")));
    let text = b.load(1).await.unwrap_err().to_string();
    assert_eq!(
        text,
        "batch load failed: database query failed: db error: ERROR: column \"nickname\" does not exist"
    );

    let pool = PgPoolOptions::new()
        .connect_with(connect_options(&db.config))
        .await
        .unwrap();
    let b = Batcher::new(SqlxLoader::new(pool, Column("nickname")));
    let text = b.load(1).await.unwrap_err().to_string();
    assert_eq!(
        text,
        "batch load failed: error returned from database: column \"nickname\" does not exist"
    );
    once(&text, "does not exist");
}

#[tokio::test]
async fn a_pool_with_no_connection_to_spare_says_so() {
    let db = table().await;
    let mut options = PoolOptions::with_max_size(1);
    options.wait_timeout = Duration::from_millis(100);
    let pool = pg::pool(db.config.clone(), &options).unwrap();
    let _held = pool.get().await.unwrap();
    let err = Batcher::new(PgLoader::new(pool, Column("name")))
        .load(1)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "batch load failed: no database connection available: \
         Timeout occurred while waiting for a slot to become available"
    );
    assert!(err.is_retryable());

    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(connect_options(&db.config))
        .await
        .unwrap();
    let _held = pool.acquire().await.unwrap();
    let loader = SqlxLoader::new(pool, Column("name")).acquire_timeout(Duration::from_millis(100));
    let err = Batcher::new(loader).load(1).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "batch load failed: pool timed out while waiting for an open connection"
    );
    assert!(err.is_retryable());
}

/// Connection settings for a port nobody listens on.
fn nobody_listening() -> tokio_postgres::Config {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(port)
        .user("app")
        .password("never printed")
        .dbname("app");
    config
}

#[tokio::test]
async fn a_refused_connection_is_named_and_retryable_and_no_secret_is_printed() {
    let config = nobody_listening();
    let pool = pg::pool(config.clone(), &PoolOptions::with_max_size(1)).unwrap();
    let err = Batcher::new(PgLoader::new(pool, Column("name")))
        .load(1)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(
            "batch load failed: no database connection available: \
             Error occurred while creating a new object: error connecting to server:"
        ),
        "{text}"
    );
    once(&text, "Connection refused");
    assert!(
        !text.contains("never printed") && !text.contains("postgres://"),
        "{text}"
    );
    assert!(err.is_retryable(), "{text}");

    let pool = PgPoolOptions::new().connect_lazy_with(connect_options(&config));
    let err = Batcher::new(SqlxLoader::new(pool, Column("name")))
        .load(1)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("batch load failed: error communicating with database:"),
        "{text}"
    );
    once(&text, "Connection refused");
    assert!(!text.contains("never printed"), "{text}");
    assert!(err.is_retryable(), "{text}");
}

/// With the database stopped, a load under each driver's default pool
/// settings fails with a retryable error before the batcher's deadline
/// (sqlx's own pool waits 30 s for a connection by default).
#[tokio::test]
async fn an_outage_reads_as_retryable_on_both_drivers_at_their_defaults() {
    let cluster = embedded_pg::testing::private_cluster()
        .await
        .expect("a private cluster");
    let config = cluster.config("postgres");
    let pg_pool = pg::pool(config.clone(), &PoolOptions::default()).unwrap();
    let pg_batcher = Batcher::new(PgLoader::new(pg_pool, Column("name")));
    let sqlx_pool = PgPoolOptions::new().connect_lazy_with(connect_options(&config));
    let sqlx_batcher = Batcher::new(SqlxLoader::new(sqlx_pool, Column("name")));
    // Both work (the table is missing: a statement error, not an outage).
    assert!(!pg_batcher.load(1).await.unwrap_err().is_retryable());
    assert!(!sqlx_batcher.load(1).await.unwrap_err().is_retryable());

    cluster.stop().await;
    for (driver, batcher) in [("tokio-postgres", &pg_batcher), ("sqlx", &sqlx_batcher)] {
        let started = Instant::now();
        let err = batcher.load(2).await.unwrap_err();
        assert!(
            matches!(err, Error::Load(_)),
            "{driver}: a load error, not the caller's deadline: {err}"
        );
        assert!(err.is_retryable(), "{driver}: {err}");
        assert!(
            started.elapsed() < pgbatch::defaults::TIMEOUT,
            "{driver}: {:?}",
            started.elapsed()
        );
    }
}
