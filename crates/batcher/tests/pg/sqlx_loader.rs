//! The sqlx loader against a real server: batched lookups into a row type
//! of the user's, composite keys through `unnest`, missing keys, unnamed
//! statements (also behind a real PgBouncer in transaction mode), the
//! classification of server errors and lost connections, and the CSV COPY
//! import.

use std::collections::HashMap;
use std::time::Duration;

use embedded_pg::pgbouncer::{PgBouncer, PoolMode};
use pgbatch::sqlx::copy::{self, ConflictPolicy, ImportError, RowSource, RowValues, TableSpec};
use pgbatch::sqlx::{
    classify, is_pool_timeout, is_retryable, BatchQuery, DbErrorKind, PgQuery, SqlxLoader,
    StatementMode,
};
use pgbatch::{Batcher, Error, Loader};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};

use crate::sqlx_connect::connect_options;
use sqlx::{Connection, FromRow, PgConnection, Postgres, Row};

fn pool_options(max_connections: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
}

/// A database of this test's own, with `users` seeded.
async fn users_pool(max_connections: u32) -> PgPool {
    let db = embedded_pg::testing::database()
        .await
        .expect("test database");
    let pool = pool_options(max_connections)
        .connect_with(connect_options(&db.config))
        .await
        .unwrap();
    seed_users(&pool).await;
    pool
}

const USERS: i64 = 1_000;

async fn seed_users(pool: &PgPool) {
    sqlx::raw_sql(&format!(
        "CREATE TABLE users (id bigint PRIMARY KEY, name text NOT NULL, email text);
         INSERT INTO users
           SELECT n, 'user ' || n,
                  CASE WHEN n % 3 = 0 THEN NULL ELSE 'u' || n || '@example.com' END
             FROM generate_series(1, {USERS}) AS n;
         ANALYZE users;"
    ))
    .execute(pool)
    .await
    .unwrap();
}

/// A row of `users`, read by a hand-written `FromRow` (sqlx's macros are
/// off in this crate).
#[derive(Debug, Clone, PartialEq, Eq)]
struct User {
    id: i64,
    name: String,
    email: Option<String>,
}

impl<'r> FromRow<'r, PgRow> for User {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(User {
            id: row.try_get("id")?,
            name: row.try_get("name")?,
            email: row.try_get("email")?,
        })
    }
}

/// What `seed_users` wrote for `id`, if it wrote that id.
fn user(id: i64) -> Option<User> {
    (1..=USERS).contains(&id).then(|| User {
        id,
        name: format!("user {id}"),
        email: (id % 3 != 0).then(|| format!("u{id}@example.com")),
    })
}

/// Only the required methods: a batch of one uses the batch statement.
struct Users;

impl BatchQuery for Users {
    type Key = i64;
    type Row = User;
    type Value = User;

    fn batch_sql(&self) -> &str {
        "SELECT id, name, email FROM users WHERE id = ANY($1)"
    }
    fn bind_batch<'q>(&self, query: PgQuery<'q>, keys: &'q [i64]) -> PgQuery<'q> {
        query.bind(keys)
    }
    fn map_row(&self, row: User) -> (i64, User) {
        (row.id, row)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_lookups_through_a_batcher_return_each_callers_row() {
    let pool = users_pool(4).await;
    let batcher: Batcher<i64, User> = Batcher::builder()
        .max_concurrent_batches(2)
        .build(SqlxLoader::new(pool, Users))
        .unwrap();

    // Spread over the table and past its end, some repeated.
    let ids: Vec<i64> = (0..400).map(|i| (i * 7919) % (USERS + 100)).collect();
    assert!(ids.iter().any(|&id| user(id).is_none()), "some ids missing");
    assert!(
        ids.iter()
            .any(|&id| user(id).is_some_and(|u| u.email.is_none())),
        "some rows with a NULL column"
    );
    let tasks: Vec<_> = ids
        .iter()
        .map(|&id| {
            let b = batcher.clone();
            tokio::spawn(async move { b.load(id).await })
        })
        .collect();
    for (&id, task) in ids.iter().zip(tasks) {
        let got = task.await.unwrap().unwrap();
        assert_eq!(got, user(id), "id {id}");
    }
    let stats = batcher.stats();
    assert!(
        stats.batches < 400,
        "400 concurrent lookups took {} statements",
        stats.batches
    );
}

#[tokio::test]
async fn missing_keys_are_not_found() {
    let loader = SqlxLoader::new(users_pool(2).await, Users);
    let found = loader
        .load(vec![1, 0, USERS + 1, -5])
        .await
        .unwrap()
        .into_values();
    assert_eq!(found, HashMap::from([(1, user(1).unwrap())]));
    assert_eq!(loader.load_one(&(USERS + 1)).await.unwrap(), None);
    assert!(loader.load(vec![0]).await.unwrap().into_values().is_empty());

    let batcher: Batcher<i64, User> = Batcher::new(loader);
    let keys = [0, USERS + 7, 2];
    for (&id, r) in keys.iter().zip(batcher.load_many(keys).await) {
        assert_eq!(r.unwrap(), user(id), "id {id}");
    }
    assert_eq!(batcher.load(USERS + 7).await.unwrap(), None);
}

/// [`Users`] with a single-key statement of its own, and statements that
/// say which one answered.
struct Tagged;

impl BatchQuery for Tagged {
    type Key = i64;
    type Row = (i64, String);
    type Value = String;

    fn batch_sql(&self) -> &str {
        "SELECT id, 'batch' FROM users WHERE id = ANY($1)"
    }
    fn bind_batch<'q>(&self, query: PgQuery<'q>, keys: &'q [i64]) -> PgQuery<'q> {
        query.bind(keys)
    }
    fn map_row(&self, row: (i64, String)) -> (i64, String) {
        row
    }
    fn single_sql(&self) -> &str {
        "SELECT id, 'single' FROM users WHERE id = $1"
    }
    fn bind_single<'q>(&self, query: PgQuery<'q>, key: &'q i64) -> PgQuery<'q> {
        query.bind(key)
    }
}

#[tokio::test]
async fn a_batch_of_one_runs_the_single_key_statement() {
    let pool = users_pool(2).await;
    let loader = SqlxLoader::new(pool.clone(), Tagged);
    let one = loader.load(vec![3]).await.unwrap().into_values();
    assert_eq!(one, HashMap::from([(3, "single".to_owned())]));
    let two = loader.load(vec![3, 4]).await.unwrap().into_values();
    assert_eq!(
        two,
        HashMap::from([(3, "batch".to_owned()), (4, "batch".to_owned())])
    );
    assert_eq!(
        loader.load_one(&5).await.unwrap().as_deref(),
        Some("single")
    );

    // Without `single_sql`, a batch of one is the batch statement with a
    // one-element array.
    let users = SqlxLoader::new(pool, Users);
    assert_eq!(users.load_one(&7).await.unwrap(), user(7));
    assert_eq!(
        users.load(vec![9]).await.unwrap().into_values(),
        HashMap::from([(9, user(9).unwrap())])
    );
}

/// `members(org_id, login)` → `role`, looked up with `unnest`.
struct Roles;

impl BatchQuery for Roles {
    type Key = (i64, String);
    type Row = (i64, String, String);
    type Value = String;

    fn batch_sql(&self) -> &str {
        "SELECT m.org_id, m.login, m.role \
         FROM unnest($1::bigint[], $2::text[]) AS k(org_id, login) \
         JOIN members m ON m.org_id = k.org_id AND m.login = k.login"
    }
    fn bind_batch<'q>(&self, query: PgQuery<'q>, keys: &'q [(i64, String)]) -> PgQuery<'q> {
        let (orgs, logins): (Vec<i64>, Vec<String>) = keys.iter().cloned().unzip();
        query.bind(orgs).bind(logins)
    }
    fn map_row(&self, (org_id, login, role): (i64, String, String)) -> ((i64, String), String) {
        ((org_id, login), role)
    }
}

fn member(org_id: i64, login: &str) -> (i64, String) {
    (org_id, login.to_owned())
}

#[tokio::test]
async fn a_composite_key_is_looked_up_with_unnest() {
    let pool = users_pool(2).await;
    sqlx::raw_sql(
        "CREATE TABLE members (org_id bigint, login text, role text NOT NULL,
                               PRIMARY KEY (org_id, login));
         INSERT INTO members VALUES (1, 'ann', 'owner'), (1, 'bob', 'member'),
                                    (2, 'ann', 'member'), (2, 'cy', 'admin');",
    )
    .execute(&pool)
    .await
    .unwrap();
    let loader = SqlxLoader::new(pool, Roles);

    // (1, cy): both parts exist, the pair does not.
    let keys = vec![
        member(1, "ann"),
        member(2, "ann"),
        member(2, "cy"),
        member(1, "cy"),
        member(3, "bob"),
    ];
    let found = loader.load(keys.clone()).await.unwrap().into_values();
    let expected: HashMap<_, _> = [
        (member(1, "ann"), "owner".to_owned()),
        (member(2, "ann"), "member".to_owned()),
        (member(2, "cy"), "admin".to_owned()),
    ]
    .into();
    assert_eq!(found, expected);
    assert_eq!(loader.load_one(&member(1, "cy")).await.unwrap(), None);
    assert_eq!(
        loader.load_one(&member(1, "bob")).await.unwrap().as_deref(),
        Some("member")
    );

    let batcher: Batcher<(i64, String), String> = Batcher::new(loader);
    let results = batcher.load_many(keys.clone()).await;
    for (key, r) in keys.iter().zip(results) {
        assert_eq!(r.unwrap().as_ref(), expected.get(key), "{key:?}");
    }
}

/// How many named prepared statements the session holds.
async fn prepared_statements(pool: &PgPool) -> i64 {
    sqlx::query_scalar::<Postgres, i64>("SELECT count(*) FROM pg_prepared_statements")
        .persistent(false)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn unnamed_statements_leave_nothing_prepared() {
    // One connection, so every statement below runs in the same session.
    let pool = users_pool(1).await;
    assert_eq!(prepared_statements(&pool).await, 0);

    let unnamed = SqlxLoader::with_statement_mode(pool.clone(), Users, StatementMode::Unnamed);
    assert_eq!(unnamed.statement_mode(), StatementMode::Unnamed);
    assert_eq!(unnamed.load_one(&1).await.unwrap(), user(1));
    let found = unnamed
        .load(vec![1, 2, 3, USERS + 1])
        .await
        .unwrap()
        .into_values();
    assert_eq!(found.len(), 3);
    assert_eq!(found[&2], user(2).unwrap());
    assert_eq!(prepared_statements(&pool).await, 0);

    // The same loads, prepared, leave statements: the check sees them.
    let prepared = SqlxLoader::new(pool.clone(), Users);
    assert_eq!(prepared.statement_mode(), StatementMode::Prepared);
    assert_eq!(prepared.load_one(&1).await.unwrap(), user(1));
    assert_eq!(
        prepared.load(vec![1, 2]).await.unwrap().into_values().len(),
        2
    );
    assert!(prepared_statements(&pool).await > 0);
}

/// `kv(pk text PRIMARY KEY, payload text NOT NULL)`.
struct Kv;

impl BatchQuery for Kv {
    type Key = String;
    type Row = (String, String);
    type Value = String;

    fn batch_sql(&self) -> &str {
        "SELECT pk, payload FROM kv WHERE pk = ANY($1)"
    }
    fn bind_batch<'q>(&self, query: PgQuery<'q>, keys: &'q [String]) -> PgQuery<'q> {
        query.bind(keys)
    }
    fn map_row(&self, row: (String, String)) -> (String, String) {
        row
    }
    fn single_sql(&self) -> &str {
        "SELECT pk, payload FROM kv WHERE pk = $1"
    }
    fn bind_single<'q>(&self, query: PgQuery<'q>, key: &'q String) -> PgQuery<'q> {
        query.bind(key)
    }
}

const KV_ROWS: i64 = 2_000;

fn pk(n: i64) -> String {
    format!("{n:020}")
}

/// A cluster with the `kv` table, PgBouncer in transaction mode in front
/// of it with two server connections, and a sqlx pool of 8 through it.
async fn pooled() -> (embedded_pg::Cluster, PgBouncer, PgPool) {
    let cluster = embedded_pg::testing::private_cluster()
        .await
        .expect("a private cluster");
    let mut admin = PgConnection::connect_with(&connect_options(&cluster.config("postgres")))
        .await
        .unwrap();
    sqlx::raw_sql(&format!(
        "CREATE TABLE kv (pk text PRIMARY KEY, payload text NOT NULL);
         INSERT INTO kv SELECT lpad(n::text, 20, '0'), n::text
           FROM generate_series(1, {KV_ROWS}) AS n;"
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    admin.close().await.unwrap();
    let bouncer = PgBouncer::start(&cluster, PoolMode::Transaction, 2)
        .await
        .expect("PgBouncer (scripts/ensure-pgbouncer.sh installs it)");
    let pool = pool_options(8)
        .connect(&bouncer.url("postgres"))
        .await
        .unwrap();
    (cluster, bouncer, pool)
}

/// 40 callers, 50 reads each, through a batcher over `loader` running up
/// to 8 batches at once: each key with what it loaded.
async fn read_concurrently(loader: SqlxLoader<Kv>) -> Vec<(i64, Result<Option<String>, Error>)> {
    let batcher = Batcher::builder()
        .max_concurrent_batches(8)
        .build(loader)
        .unwrap();
    let mut tasks = Vec::new();
    for c in 0..40 {
        let b = batcher.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..50 {
                let n = 1 + (c * 50 + i) % KV_ROWS;
                out.push((n, b.load(pk(n)).await));
            }
            out
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unnamed_statements_read_through_a_transaction_pooler() {
    let (cluster, _bouncer, pool) = pooled().await;
    let loader = SqlxLoader::with_statement_mode(pool, Kv, StatementMode::Unnamed);
    let results = read_concurrently(loader.clone()).await;
    assert_eq!(results.len(), 2_000);
    for (n, r) in &results {
        // The value too, not just a row: a statement executed on the wrong
        // server connection could answer with another query's rows.
        let expected = n.to_string();
        assert!(matches!(r, Ok(Some(v)) if *v == expected), "key {n}: {r:?}");
    }
    assert_eq!(loader.load_one(&pk(3)).await.unwrap().as_deref(), Some("3"));
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_through_a_transaction_pooler_fail_and_say_why() {
    let (cluster, _bouncer, pool) = pooled().await;
    let results = read_concurrently(SqlxLoader::new(pool, Kv)).await;
    let lost = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().err())
        .filter(|e| {
            e.load_error::<sqlx::Error>()
                .is_some_and(|e| classify(e) == DbErrorKind::SessionStateLost)
        })
        .count();
    assert!(lost > 0, "named statements broke, and the error says so");
    cluster.stop().await;
}

/// The SQLSTATE of a server error.
fn sqlstate(e: &sqlx::Error) -> Option<String> {
    e.as_database_error()
        .and_then(|db| db.code())
        .map(|code| code.into_owned())
}

#[tokio::test]
async fn server_errors_are_classified_by_sqlstate() {
    let pool = users_pool(2).await;

    let duplicate = sqlx::query("INSERT INTO users (id, name) VALUES (1, 'again')")
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(
        sqlstate(&duplicate).as_deref(),
        Some("23505"),
        "{duplicate}"
    );
    assert_eq!(classify(&duplicate), DbErrorKind::UniqueViolation);
    assert!(!is_retryable(&duplicate));

    let syntax = sqlx::query("SELEC 1").execute(&pool).await.unwrap_err();
    assert_eq!(sqlstate(&syntax).as_deref(), Some("42601"), "{syntax}");
    assert_eq!(classify(&syntax), DbErrorKind::Other);
    assert!(!is_retryable(&syntax));
    assert!(!is_pool_timeout(&syntax));

    let serialization = sqlx::query("DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '40001'; END $$")
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(
        sqlstate(&serialization).as_deref(),
        Some("40001"),
        "{serialization}"
    );
    assert_eq!(classify(&serialization), DbErrorKind::Conflict);
    assert!(is_retryable(&serialization));

    // The pool still serves after all three.
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(one, 1);
}

/// Terminates backend `pid` from a connection of its own and waits until
/// it is gone.
async fn terminate(options: &PgConnectOptions, pid: i32) {
    let mut admin = PgConnection::connect_with(options).await.unwrap();
    let signalled: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(signalled, "backend {pid} not found");
    for _ in 0..500 {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
            .bind(pid)
            .fetch_one(&mut admin)
            .await
            .unwrap();
        if left == 0 {
            admin.close().await.unwrap();
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("backend {pid} still there 5 s after pg_terminate_backend");
}

/// The pid of the pool's one connection, once that connection is idle in
/// the pool again: sqlx returns a connection (and pings it) in a task of
/// its own, so a connection terminated before that ping would be replaced
/// by a new one, and the statement would never meet the lost one.
async fn backend_pid(pool: &PgPool) -> i32 {
    let pid = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(pool)
        .await
        .unwrap();
    for _ in 0..500 {
        if pool.num_idle() == 1 {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the connection was not back in the pool within 5 s");
}

#[tokio::test]
async fn a_terminated_connection_is_unavailable_and_the_loader_reads_again() {
    let db = embedded_pg::testing::database().await.unwrap();
    let options = connect_options(&db.config);
    // One connection, handed out without a test first: a terminated one
    // reaches the statement, as one lost between the pool's test and the
    // statement would.
    let pool = pool_options(1)
        .test_before_acquire(false)
        .connect_with(options.clone())
        .await
        .unwrap();
    seed_users(&pool).await;

    terminate(&options, backend_pid(&pool).await).await;
    let lost = sqlx::query("SELECT 1").execute(&pool).await.unwrap_err();
    assert_eq!(classify(&lost), DbErrorKind::Unavailable, "{lost:?}");
    assert!(is_retryable(&lost));

    // The loader meets the same on its first attempt, and reads again on
    // a new connection.
    let loader = SqlxLoader::new(pool.clone(), Users);
    assert_eq!(loader.load_one(&1).await.unwrap(), user(1));
    let pid = backend_pid(&pool).await;
    terminate(&options, pid).await;
    assert_eq!(loader.load_one(&2).await.unwrap(), user(2));
    assert_ne!(backend_pid(&pool).await, pid, "a new connection");
    terminate(&options, backend_pid(&pool).await).await;
    let found = loader
        .load(vec![4, 5, USERS + 1])
        .await
        .unwrap()
        .into_values();
    assert_eq!(found.len(), 2);
}

#[tokio::test]
async fn a_stopped_server_is_unavailable() {
    let cluster = embedded_pg::testing::private_cluster().await.unwrap();
    let pool = pool_options(2)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(connect_options(&cluster.config("postgres")))
        .await
        .unwrap();
    seed_users(&pool).await;
    let loader = SqlxLoader::new(pool.clone(), Users);
    assert_eq!(loader.load_one(&1).await.unwrap(), user(1));

    let mut held = pool.acquire().await.unwrap();
    cluster.stop().await;
    let e = sqlx::query("SELECT 1")
        .execute(&mut *held)
        .await
        .unwrap_err();
    assert_eq!(classify(&e), DbErrorKind::Unavailable, "{e:?}");
    assert!(is_retryable(&e));
    drop(held);

    // The server's socket is gone with it: a new connection fails at once.
    let e = loader.load_one(&1).await.unwrap_err();
    assert_eq!(classify(&e), DbErrorKind::Unavailable, "{e:?}");
    assert!(!is_pool_timeout(&e), "{e:?}");
}

#[tokio::test]
async fn an_exhausted_pool_times_out() {
    let db = embedded_pg::testing::database().await.unwrap();
    let pool = pool_options(1)
        .acquire_timeout(Duration::from_millis(200))
        .connect_with(connect_options(&db.config))
        .await
        .unwrap();
    let _held = pool.acquire().await.unwrap();
    let e = SqlxLoader::new(pool.clone(), Users)
        .load_one(&1)
        .await
        .unwrap_err();
    assert!(is_pool_timeout(&e), "{e:?}");
    assert_eq!(classify(&e), DbErrorKind::Other);
    assert!(is_retryable(&e));
}

/// Rows from a list.
struct Rows(std::vec::IntoIter<RowValues>);

impl Rows {
    fn new(rows: Vec<Vec<Option<&str>>>) -> Self {
        Rows(
            rows.into_iter()
                .map(|r| r.into_iter().map(|v| v.map(str::to_owned)).collect())
                .collect::<Vec<RowValues>>()
                .into_iter(),
        )
    }
}

impl RowSource for Rows {
    type Error = std::io::Error;

    async fn next_row(&mut self) -> Result<Option<RowValues>, std::io::Error> {
        Ok(self.0.next())
    }
}

#[tokio::test]
async fn copy_rows_keeps_every_value_and_null_as_written() {
    let pool = users_pool(1).await;
    sqlx::raw_sql("CREATE TABLE notes (id bigint PRIMARY KEY, body text, extra text)")
        .execute(&pool)
        .await
        .unwrap();
    let rows = vec![
        vec![Some("1"), Some("plain"), None],
        vec![Some("2"), Some(""), Some("")],
        vec![
            Some("3"),
            Some("comma, \"quote\"\nline\\backslash"),
            Some("\\."),
        ],
        vec![Some("4"), Some("ünïcødé ✓"), Some("NULL")],
    ];
    let mut conn = pool.acquire().await.unwrap();
    let mut reported = Vec::new();
    let n = copy::copy_rows(
        &mut conn,
        "notes",
        &["id", "body", "extra"],
        Rows::new(rows.clone()),
        false,
        |n| reported.push(n),
    )
    .await
    .unwrap();
    assert_eq!(n, 4);
    assert_eq!(reported, [4]);

    let stored: Vec<(i64, Option<String>, Option<String>)> =
        sqlx::query_as("SELECT id, body, extra FROM notes ORDER BY id")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    let written: Vec<(i64, Option<String>, Option<String>)> = rows
        .iter()
        .map(|r| {
            (
                r[0].unwrap().parse().unwrap(),
                r[1].map(str::to_owned),
                r[2].map(str::to_owned),
            )
        })
        .collect();
    assert_eq!(stored, written);
}

/// `items(id bigint PRIMARY KEY, name text NOT NULL, qty int NOT NULL)`
/// with ids 1 to 3.
async fn items_pool() -> PgPool {
    let pool = users_pool(1).await;
    sqlx::raw_sql(
        "CREATE TABLE items (id bigint PRIMARY KEY, name text NOT NULL, qty int NOT NULL DEFAULT 0);
         INSERT INTO items VALUES (1, 'one', 1), (2, 'two', 2), (3, 'three', 3);",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool
}

const ITEMS: TableSpec<'static> = TableSpec {
    table: "items",
    columns: &["id", "name", "qty"],
    key: &["id"],
};

async fn items(conn: &mut PgConnection) -> Vec<(i64, String, i32)> {
    sqlx::query_as("SELECT id, name, qty FROM items ORDER BY id")
        .fetch_all(conn)
        .await
        .unwrap()
}

fn item(id: i64, name: &str, qty: i32) -> (i64, String, i32) {
    (id, name.to_owned(), qty)
}

#[tokio::test]
async fn import_applies_the_conflict_policy_in_one_transaction() {
    let pool = items_pool().await;
    let mut conn = pool.acquire().await.unwrap();

    let counts = copy::import(
        &mut conn,
        &ITEMS,
        Rows::new(vec![
            vec![Some("2"), Some("two, new"), Some("20")],
            vec![Some("4"), Some("four"), Some("40")],
            vec![Some("4"), Some("four, later"), Some("41")],
            vec![Some("5"), Some("five"), Some("50")],
        ]),
        ConflictPolicy::Overwrite,
    )
    .await
    .unwrap();
    assert_eq!(counts.rows, 4);
    assert_eq!(counts.inserted, 2);
    assert_eq!(counts.updated, 1);
    assert_eq!(counts.skipped, 0);
    assert_eq!(counts.superseded, 1);

    let counts = copy::import(
        &mut conn,
        &ITEMS,
        Rows::new(vec![
            vec![Some("1"), Some("not written"), Some("0")],
            vec![Some("6"), Some("six"), Some("6")],
        ]),
        ConflictPolicy::Skip,
    )
    .await
    .unwrap();
    assert_eq!((counts.inserted, counts.skipped), (1, 1));

    let before = items(&mut conn).await;
    assert_eq!(
        before,
        [
            item(1, "one", 1),
            item(2, "two, new", 20),
            item(3, "three", 3),
            item(4, "four, later", 41),
            item(5, "five", 50),
            item(6, "six", 6),
        ]
    );

    // A key that exists, with policy Fail: nothing of the import stays.
    let err = copy::import(
        &mut conn,
        &ITEMS,
        Rows::new(vec![
            vec![Some("7"), Some("seven"), Some("7")],
            vec![Some("6"), Some("six again"), Some("0")],
        ]),
        ConflictPolicy::Fail,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ImportError::Conflict(_)), "{err:?}");
    assert_eq!(err.kind(), DbErrorKind::UniqueViolation);

    // A value its column cannot read.
    let err = copy::import(
        &mut conn,
        &ITEMS,
        Rows::new(vec![vec![Some("8"), Some("eight"), Some("many")]]),
        ConflictPolicy::Overwrite,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ImportError::Rejected(_)), "{err:?}");
    assert!(err.kind().is_row_fault(), "{:?}", err.kind());

    assert_eq!(items(&mut conn).await, before);
}

/// Yields `good` rows, then fails.
struct FailsAfter {
    good: u32,
}

impl RowSource for FailsAfter {
    type Error = std::io::Error;

    async fn next_row(&mut self) -> Result<Option<RowValues>, std::io::Error> {
        if self.good == 0 {
            return Err(std::io::Error::other("malformed line"));
        }
        self.good -= 1;
        let id = 100 + self.good;
        Ok(Some(vec![
            Some(id.to_string()),
            Some("from the source".to_owned()),
            Some("1".to_owned()),
        ]))
    }
}

#[tokio::test]
async fn a_failing_source_aborts_the_import_and_the_connection_serves_on() {
    let pool = items_pool().await;
    let mut conn = pool.acquire().await.unwrap();
    let before = items(&mut conn).await;

    let err = copy::import(
        &mut conn,
        &ITEMS,
        FailsAfter { good: 2 },
        ConflictPolicy::Overwrite,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ImportError::Source { row: 3, .. }), "{err:?}");
    assert_eq!(err.kind(), DbErrorKind::Other);
    assert!(err.as_sqlx_error().is_none());

    // Rolled back, and the same connection runs the next statement and
    // the next import.
    assert_eq!(items(&mut conn).await, before);
    let counts = copy::import(
        &mut conn,
        &ITEMS,
        Rows::new(vec![vec![Some("9"), Some("nine"), Some("9")]]),
        ConflictPolicy::Fail,
    )
    .await
    .unwrap();
    assert_eq!(counts.inserted, 1);
    assert_eq!(items(&mut conn).await.len(), before.len() + 1);
}
