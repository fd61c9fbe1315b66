//! Scoped loads against real Postgres under row-level security, on both
//! drivers: a shared batcher serves many tenants, each load runs as one
//! tenant (`SET LOCAL ROLE` and `set_config(..., true)` in a transaction of
//! its own), no answer comes from another tenant's view, and nothing of a
//! scope survives on the pooled connection: after a success, a failed
//! statement, a refused role, an abandoned load, a killed connection, or
//! behind PgBouncer in transaction mode.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use embedded_pg::pgbouncer::{PgBouncer, PoolMode};
use pgbatch::cache::{Admission, Cache};
use pgbatch::db::Scope;
use pgbatch::{Batcher, BatcherBuilder, Concurrency, Error};
use proptest::prelude::*;
use tokio_postgres::NoTls;

/// Notes of tenants 0-9: note `id` belongs to tenant `id % 10`.
const NOTES: i64 = 2_000;
const TENANTS: i32 = 10;
const PASSWORD: &str = "authenticator-password";

/// What tenant `tenant` may read of note `id`.
fn view(tenant: i32, id: i64) -> Option<String> {
    (id % 10 == i64::from(tenant) && (1..=NOTES).contains(&id)).then(|| format!("note {id}"))
}

/// The roles and table of one test's database: `auth` logs in (a member
/// of `tenant`, as PostgREST's authenticator is), `tenant` reads under
/// the policy, `stranger` is a role `auth` may not become.
#[derive(Clone)]
struct Rls {
    /// As the authenticator.
    auth: tokio_postgres::Config,
    /// As the superuser.
    admin: tokio_postgres::Config,
    auth_role: String,
    tenant_role: String,
    stranger_role: String,
}

impl Rls {
    /// Tenant `t`'s scope: the tenant role, and `app.tenant` set to `t`.
    fn tenant(&self, t: i32) -> Scope {
        self.scope(&self.tenant_role, &t.to_string())
    }

    fn scope(&self, role: &str, tenant: &str) -> Scope {
        Scope::builder()
            .label(format!("tenant {tenant}"))
            .role(role)
            .setting("app.tenant", tenant)
            .setting("request.jwt.claims", format!(r#"{{"tenant":"{tenant}"}}"#))
            .build()
            .unwrap()
    }
}

/// Creates the roles, the table and its policy in the database `admin`
/// names, roles prefixed by `prefix` (roles are the cluster's, not the
/// database's).
async fn create_rls(admin: tokio_postgres::Config, prefix: &str) -> Rls {
    let (client, conn) = admin.connect(NoTls).await.unwrap();
    tokio::spawn(conn);
    let (auth, tenant, stranger) = (
        format!("{prefix}_auth"),
        format!("{prefix}_tenant"),
        format!("{prefix}_stranger"),
    );
    client
        .batch_execute(&format!(
            r#"CREATE ROLE "{auth}" LOGIN NOINHERIT PASSWORD '{PASSWORD}';
               CREATE ROLE "{tenant}" NOLOGIN;
               CREATE ROLE "{stranger}" NOLOGIN;
               GRANT "{tenant}" TO "{auth}";
               CREATE TABLE notes (id bigint PRIMARY KEY, tenant int NOT NULL, body text NOT NULL);
               INSERT INTO notes SELECT n, n % 10, 'note ' || n FROM generate_series(1, {NOTES}) AS n;
               ALTER TABLE notes ENABLE ROW LEVEL SECURITY;
               GRANT USAGE ON SCHEMA public TO "{tenant}", "{stranger}";
               GRANT SELECT ON notes TO "{tenant}", "{stranger}";
               -- Strict: a tenant that is not a number fails the statement.
               CREATE POLICY by_tenant ON notes FOR SELECT TO "{tenant}", "{stranger}"
                 USING (tenant = current_setting('app.tenant')::int);
               ANALYZE notes;"#
        ))
        .await
        .unwrap();
    let mut auth_config = admin.clone();
    auth_config.user(&auth).password(PASSWORD);
    Rls {
        auth: auth_config,
        admin,
        auth_role: auth,
        tenant_role: tenant,
        stranger_role: stranger,
    }
}

/// A database of the test's own on the shared cluster, with [`Rls`].
async fn rls_database() -> Rls {
    let db = embedded_pg::testing::database()
        .await
        .expect("test database");
    create_rls(db.config.clone(), &db.name).await
}

/// Which statement a loader runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sql {
    /// `SELECT id, body FROM notes WHERE id = ANY($1)`.
    Notes,
    /// The same, half a second late.
    Slow,
    /// The same, with a NULL body (which does not map) for ids ending in 7.
    Nulls,
}

impl Sql {
    fn text(self) -> &'static str {
        match self {
            Sql::Notes => "SELECT id, body FROM notes WHERE id = ANY($1)",
            Sql::Slow => "SELECT id, body FROM notes, pg_sleep(0.5) WHERE id = ANY($1)",
            Sql::Nulls => {
                "SELECT id, CASE WHEN id % 10 = 7 THEN NULL ELSE body END FROM notes WHERE id = ANY($1)"
            }
        }
    }
}

/// One driver's scoped batcher over a pool, and a look at what the pool's
/// next connection carries.
trait Driver: Sized + Send + Sync + 'static {
    const NAME: &'static str;

    /// A pool of `size` connections for `config`, sending unnamed
    /// statements if `unnamed`, and a scoped batcher running `sql` on it.
    async fn open(
        config: &tokio_postgres::Config,
        size: usize,
        unnamed: bool,
        sql: Sql,
        builder: BatcherBuilder<i64, String>,
    ) -> (Self, Batcher<i64, String, Scope>);

    /// The role and `app.tenant` of the pool's next connection (with a
    /// pool of one, the connection the last load used).
    async fn session(&self) -> (String, Option<String>);
}

const SESSION: &str = "SELECT current_user::text, current_setting('app.tenant', true)";

mod tokio_pg {
    use pgbatch::pg::tokio_postgres::{Error as PgError, Row};
    use pgbatch::pg::{self, BatchQuery, Params, PgLoader, PoolOptions, StatementMode, Statements};

    use super::*;

    pub(super) struct Notes(pub(super) Sql);

    impl BatchQuery for Notes {
        type Key = i64;
        type Value = String;

        fn batch_sql(&self) -> &str {
            self.0.text()
        }
        fn batch_params<'a>(&self, keys: &'a [i64]) -> Params<'a> {
            vec![Box::new(keys)]
        }
        fn map_row(&self, row: &Row) -> Result<(i64, String), PgError> {
            Ok((row.try_get(0)?, row.try_get(1)?))
        }
    }

    pub(super) struct TokioPostgres(pub(super) pg::Pool);

    impl Driver for TokioPostgres {
        const NAME: &'static str = "tokio-postgres";

        async fn open(
            config: &tokio_postgres::Config,
            size: usize,
            unnamed: bool,
            sql: Sql,
            builder: BatcherBuilder<i64, String>,
        ) -> (Self, Batcher<i64, String, Scope>) {
            let pool = pg::pool(config.clone(), &PoolOptions::with_max_size(size)).unwrap();
            let mode = if unnamed {
                StatementMode::Unnamed
            } else {
                StatementMode::Prepared
            };
            let loader = PgLoader::with_statements(
                pool.clone(),
                Notes(sql),
                Statements::default().mode(mode),
            );
            (Self(pool), builder.build_scoped(loader).unwrap())
        }

        async fn session(&self) -> (String, Option<String>) {
            let client = self.0.get().await.unwrap();
            let row = client.query_one(SESSION, &[]).await.unwrap();
            (row.get(0), row.get(1))
        }
    }
}

mod sqlx_pg {
    use pgbatch::sqlx::{BatchQuery, PgQuery, SqlxLoader, StatementMode};
    use sqlx::postgres::{PgPool, PgPoolOptions};
    use sqlx::Row as _;

    use super::*;
    use crate::sqlx_connect::connect_options;

    pub(super) struct Notes(pub(super) Sql);

    impl BatchQuery for Notes {
        type Key = i64;
        type Row = (i64, String);
        type Value = String;

        fn batch_sql(&self) -> &str {
            self.0.text()
        }
        fn bind_batch<'q>(&self, query: PgQuery<'q>, keys: &'q [i64]) -> PgQuery<'q> {
            query.bind(keys)
        }
        fn map_row(&self, row: (i64, String)) -> (i64, String) {
            row
        }
    }

    pub(super) struct Sqlx(pub(super) PgPool);

    impl Driver for Sqlx {
        const NAME: &'static str = "sqlx";

        async fn open(
            config: &tokio_postgres::Config,
            size: usize,
            unnamed: bool,
            sql: Sql,
            builder: BatcherBuilder<i64, String>,
        ) -> (Self, Batcher<i64, String, Scope>) {
            let pool = PgPoolOptions::new()
                .max_connections(size as u32)
                .acquire_timeout(Duration::from_secs(10))
                .connect_with(connect_options(config))
                .await
                .unwrap();
            let mode = if unnamed {
                StatementMode::Unnamed
            } else {
                StatementMode::Prepared
            };
            let loader = SqlxLoader::with_statement_mode(pool.clone(), Notes(sql), mode);
            (Self(pool), builder.build_scoped(loader).unwrap())
        }

        async fn session(&self) -> (String, Option<String>) {
            // A simple query: unprepared, so it works through a
            // transaction-mode pooler too.
            let row = sqlx::raw_sql(SESSION).fetch_one(&self.0).await.unwrap();
            (row.get(0), row.get(1))
        }
    }
}

use sqlx_pg::Sqlx;
use tokio_pg::TokioPostgres;

/// Whether `session` is the login role's, with no tenant set: what a
/// connection looks like when nothing of a scope survived on it.
/// (After a transaction that set it locally, `current_setting` reads
/// `''`, not NULL: PostgREST's policies use `nullif` for that reason.)
fn is_clean(session: &(String, Option<String>), login: &str) -> bool {
    session.0 == login && session.1.as_deref().unwrap_or("").is_empty()
}

/// Ten tenants read all notes at once through one shared batcher; each
/// gets exactly its own view.
async fn tenants_read_their_own_rows<D: Driver>() {
    let rls = rls_database().await;
    let (_, batcher) = D::open(&rls.auth, 4, false, Sql::Notes, Batcher::builder()).await;
    let reads: Vec<_> = (0..TENANTS)
        .flat_map(|t| (1..=200i64).map(move |id| (t, id)))
        .map(|(t, id)| {
            let (batcher, scope) = (batcher.clone(), rls.tenant(t));
            tokio::spawn(async move { (t, id, batcher.load_as(&scope, id).await) })
        })
        .collect();
    let mut wrong = Vec::new();
    for read in reads {
        let (t, id, got) = read.await.unwrap();
        let got = got.unwrap_or_else(|e| panic!("{} tenant {t} note {id}: {e:?}", D::NAME));
        if got != view(t, id) {
            wrong.push((t, id, got));
        }
    }
    assert!(wrong.is_empty(), "{}: {wrong:?}", D::NAME);
    let stats = batcher.stats();
    assert!(
        stats.batches < 2_000,
        "{}: reads were batched: {stats:?}",
        D::NAME
    );
}

#[tokio::test]
async fn tenants_read_their_own_rows_through_one_shared_batcher() {
    tenants_read_their_own_rows::<TokioPostgres>().await;
    tenants_read_their_own_rows::<Sqlx>().await;
}

/// With a pool of one connection, every load and every look at the
/// session use the same connection (or its replacement, once discarded).
async fn nothing_of_a_scope_survives<D: Driver>() {
    let rls = rls_database().await;
    let login = rls.auth_role.clone();
    let (probe, batcher) = D::open(&rls.auth, 1, false, Sql::Notes, Batcher::builder()).await;
    let ctx = D::NAME;
    let clean = async |when: &str| {
        let session = probe.session().await;
        assert!(is_clean(&session, &login), "{ctx}: {when}: {session:?}");
    };
    clean("fresh").await;

    // After a success.
    assert_eq!(
        batcher.load_as(&rls.tenant(3), 13).await.unwrap(),
        view(3, 13)
    );
    clean("after a success").await;

    // After a statement that failed (the strict policy's cast).
    let bad = rls.scope(&rls.tenant_role, "not-a-number");
    let err = batcher.load_as(&bad, 1).await.unwrap_err();
    assert!(
        err.to_string().contains("invalid input syntax"),
        "{ctx}: {err}"
    );
    assert!(!err.is_retryable(), "{ctx}: {err}");
    clean("after a failed statement").await;

    // After a role the database refused.
    let stranger = rls.scope(&rls.stranger_role, "3");
    let err = batcher.load_as(&stranger, 13).await.unwrap_err();
    assert!(
        err.to_string().contains("permission denied"),
        "{ctx}: {err}"
    );
    clean("after a refused role").await;

    // After a killed connection: the load runs again on a new one.
    kill_sessions_of(&rls.admin, &login).await;
    assert_eq!(
        batcher.load_as(&rls.tenant(4), 14).await.unwrap(),
        view(4, 14)
    );
    clean("after a kill").await;
}

/// Ends every session of `role` in the database.
async fn kill_sessions_of(admin: &tokio_postgres::Config, role: &str) {
    let (client, conn) = admin.connect(NoTls).await.unwrap();
    tokio::spawn(conn);
    let killed: i64 = client
        .query_one(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE usename = $1 AND datname = current_database()) AS k",
            &[&role],
        )
        .await
        .unwrap()
        .get(0);
    assert!(killed > 0, "a session of {role} to kill");
}

#[tokio::test]
async fn nothing_of_a_scope_survives_on_the_pooled_connection() {
    nothing_of_a_scope_survives::<TokioPostgres>().await;
    nothing_of_a_scope_survives::<Sqlx>().await;
}

/// A load abandoned at its load timeout, mid-statement.
async fn an_abandoned_load_leaves_nothing<D: Driver>() {
    let rls = rls_database().await;
    let builder = Batcher::builder().load_timeout(Duration::from_millis(100));
    let (probe, batcher) = D::open(&rls.auth, 1, false, Sql::Slow, builder).await;
    let err = batcher.load_as(&rls.tenant(5), 15).await.unwrap_err();
    assert!(matches!(err, Error::LoadTimeout(_)), "{}: {err:?}", D::NAME);
    let session = probe.session().await;
    assert!(
        is_clean(&session, &rls.auth_role),
        "{}: {session:?}",
        D::NAME
    );
    // And no session of the login role sits in the abandoned transaction.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (client, conn) = rls.admin.connect(NoTls).await.unwrap();
    tokio::spawn(conn);
    let open: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE usename = $1 AND state LIKE 'idle in transaction%'",
            &[&rls.auth_role],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(open, 0, "{}", D::NAME);
}

#[tokio::test]
async fn a_load_abandoned_at_its_deadline_leaves_nothing_on_the_connection() {
    an_abandoned_load_leaves_nothing::<TokioPostgres>().await;
    an_abandoned_load_leaves_nothing::<Sqlx>().await;
}

#[tokio::test]
async fn a_refused_role_or_failing_statement_fails_its_scope_alone() {
    // The empty scope reads as the authenticator, which may read nothing:
    // its reads fail too, as the role's own requests would.
    let rls = rls_database().await;
    let (_, batcher) =
        TokioPostgres::open(&rls.auth, 2, false, Sql::Notes, Batcher::builder()).await;
    let err = batcher
        .load_as(&Scope::builder().build().unwrap(), 1)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("permission denied for table notes"),
        "{err}"
    );
    drop(batcher);
    failures_stay_in_their_scope::<TokioPostgres>(&rls).await;
    failures_stay_in_their_scope::<Sqlx>(&rls).await;
}

/// A refused role and a failing statement fail their own scopes' callers,
/// while other scopes' loads, at the same time, succeed.
async fn failures_stay_in_their_scope<D: Driver>(rls: &Rls) {
    let (_, batcher) = D::open(&rls.auth, 4, false, Sql::Notes, Batcher::builder()).await;
    let scopes = [
        (rls.tenant(1), Ok(1)),
        (rls.tenant(2), Ok(2)),
        (
            rls.scope(&rls.stranger_role, "3"),
            Err("permission denied to set role"),
        ),
        (
            rls.scope(&rls.tenant_role, "x"),
            Err("invalid input syntax"),
        ),
    ];
    let reads: Vec<_> = scopes
        .iter()
        .flat_map(|(scope, want)| (1..=50i64).map(move |id| (scope.clone(), *want, id)))
        .map(|(scope, want, id)| {
            let batcher = batcher.clone();
            tokio::spawn(async move { (want, id, batcher.load_as(&scope, id).await) })
        })
        .collect();
    for read in reads {
        let (want, id, got) = read.await.unwrap();
        match want {
            Ok(t) => assert_eq!(
                got.unwrap(),
                view(t, id),
                "{} tenant {t} note {id}",
                D::NAME
            ),
            Err(text) => {
                let err = got.unwrap_err().to_string();
                assert!(err.contains(text), "{}: {err}", D::NAME);
            }
        }
    }
}

/// A row that does not map fails the keys without a value; the other
/// keys of its batch get theirs.
async fn a_bad_row_fails_its_keys_alone<D: Driver>() {
    let rls = rls_database().await;
    let builder = Batcher::builder()
        .concurrency(Concurrency::Fixed(1))
        .max_batch_size(64);
    let (_, batcher) = D::open(&rls.auth, 1, false, Sql::Nulls, builder).await;
    let tenant = rls.tenant(7);
    let mixed = batcher.load_many_as(&tenant, [7, 8, 17, 27]).await;
    assert!(mixed[0].is_err(), "{}: {mixed:?}", D::NAME);
    let ok = batcher.load_many_as(&rls.tenant(1), [1, 11, 12]).await;
    assert_eq!(ok[0].as_ref().unwrap(), &view(1, 1), "{}", D::NAME);
    assert_eq!(ok[1].as_ref().unwrap(), &view(1, 11));
    assert_eq!(ok[2].as_ref().unwrap(), &None);
}

#[tokio::test]
async fn a_row_that_does_not_map_fails_no_other_scopes_keys() {
    a_bad_row_fails_its_keys_alone::<TokioPostgres>().await;
    a_bad_row_fails_its_keys_alone::<Sqlx>().await;
}

/// The cache over a scoped batcher: each tenant's copy of a key is its
/// own, and invalidating the key drops every tenant's.
async fn the_cache_keeps_tenants_apart<D: Driver>() {
    let rls = rls_database().await;
    let (_, batcher) = D::open(&rls.auth, 4, false, Sql::Notes, Batcher::builder()).await;
    let cache = Cache::builder()
        .admission(Admission::Always)
        .negative_ttl(Duration::from_secs(60))
        .build_with_batcher(batcher.clone())
        .unwrap();
    for t in 0..TENANTS {
        for id in 1..=20 {
            assert_eq!(cache.get_as(&rls.tenant(t), id).await.unwrap(), view(t, id));
        }
    }
    let loads = batcher.stats().batches;
    for t in 0..TENANTS {
        for id in 1..=20 {
            assert_eq!(
                cache.get_if_present_as(&rls.tenant(t), &id).await,
                Some(view(t, id)),
                "{} tenant {t} note {id}",
                D::NAME
            );
        }
    }
    cache.invalidate(&13).await;
    for t in 0..TENANTS {
        assert_eq!(cache.get_if_present_as(&rls.tenant(t), &13).await, None);
    }
    assert_eq!(batcher.stats().batches, loads, "hits load nothing");
}

#[tokio::test]
async fn the_cache_keeps_each_tenants_copy_and_invalidation_reaches_all() {
    the_cache_keeps_tenants_apart::<TokioPostgres>().await;
    the_cache_keeps_tenants_apart::<Sqlx>().await;
}

/// Through PgBouncer in transaction mode with one server connection, so
/// every transaction shares it: scoped loads leave nothing for the next
/// client of that server connection.
async fn nothing_survives_behind_the_pooler<D: Driver>(bouncer: &PgBouncer, rls: &Rls) {
    let through = bouncer.config("postgres");
    let (probe, batcher) = D::open(&through, 4, true, Sql::Notes, Batcher::builder()).await;
    let reads: Vec<_> = (0..TENANTS)
        .flat_map(|t| (1..=30i64).map(move |id| (t, id)))
        .map(|(t, id)| {
            let (batcher, scope) = (batcher.clone(), rls.tenant(t));
            tokio::spawn(async move { (t, id, batcher.load_as(&scope, id).await) })
        })
        .collect();
    for read in reads {
        let (t, id, got) = read.await.unwrap();
        assert_eq!(
            got.unwrap(),
            view(t, id),
            "{} tenant {t} note {id}",
            D::NAME
        );
    }
    // Another client's transactions, on the same server connection.
    for _ in 0..5 {
        let session = probe.session().await;
        assert!(is_clean(&session, "postgres"), "{}: {session:?}", D::NAME);
    }
}

#[tokio::test]
async fn nothing_of_a_scope_survives_behind_a_transaction_pooler() {
    let cluster = embedded_pg::testing::private_cluster()
        .await
        .expect("a private cluster");
    let rls = create_rls(cluster.config("postgres"), "pooled").await;
    let bouncer = PgBouncer::start(&cluster, PoolMode::Transaction, 1)
        .await
        .expect("PgBouncer (scripts/ensure-pgbouncer.sh installs it)");
    nothing_survives_behind_the_pooler::<TokioPostgres>(&bouncer, &rls).await;
    nothing_survives_behind_the_pooler::<Sqlx>(&bouncer, &rls).await;
    bouncer.stop();
    cluster.stop().await;
}

/// The database the property test's cases share, made once.
fn shared_rls() -> Rls {
    static RLS: OnceLock<Rls> = OnceLock::new();
    RLS.get_or_init(|| {
        std::thread::spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(rls_database())
        })
        .join()
        .unwrap()
    })
    .clone()
}

#[derive(Debug, Clone)]
struct Read {
    tenant: i32,
    ids: Vec<i64>,
    cancel_after_us: Option<u64>,
}

fn read() -> impl Strategy<Value = Read> {
    (
        0..TENANTS,
        prop::collection::vec(1i64..=60, 1..=3),
        prop::option::weighted(0.3, 0u64..3_000),
    )
        .prop_map(|(tenant, ids, cancel_after_us)| Read {
            tenant,
            ids,
            cancel_after_us,
        })
}

/// Runs `reads` through a fresh scoped batcher (and a cache in front if
/// `cached`), returning every answer that is not its reader's view.
async fn wrong_answers<D: Driver>(
    rls: &Rls,
    reads: &[Read],
    cached: bool,
    timeout: Duration,
) -> Vec<(i32, i64, String)> {
    let builder = Batcher::builder().timeout(timeout);
    let (_, batcher) = D::open(&rls.auth, 4, false, Sql::Notes, builder).await;
    let cache = cached.then(|| {
        Cache::builder()
            .admission(Admission::Always)
            .build_with_batcher(batcher.clone())
            .unwrap()
    });
    let scopes: Arc<HashMap<i32, Scope>> =
        Arc::new((0..TENANTS).map(|t| (t, rls.tenant(t))).collect());
    let tasks: Vec<_> = reads
        .iter()
        .cloned()
        .map(|read| {
            let (batcher, cache, scopes) = (batcher.clone(), cache.clone(), Arc::clone(&scopes));
            tokio::spawn(async move {
                let scope = &scopes[&read.tenant];
                let ask = async {
                    match &cache {
                        Some(cache) => cache.get_many_as(scope, read.ids.clone()).await,
                        None => batcher.load_many_as(scope, read.ids.clone()).await,
                    }
                };
                let got = match read.cancel_after_us {
                    Some(us) => tokio::time::timeout(Duration::from_micros(us), ask)
                        .await
                        .ok(),
                    None => Some(ask.await),
                };
                (read, got)
            })
        })
        .collect();
    let mut wrong = Vec::new();
    for task in tasks {
        let (read, got) = task.await.unwrap();
        for (id, answer) in read.ids.iter().zip(got.into_iter().flatten()) {
            match answer {
                Ok(value) if value == view(read.tenant, *id) => {}
                Err(Error::Timeout(_) | Error::Overloaded) => {}
                other => wrong.push((read.tenant, *id, format!("{other:?}"))),
            }
        }
    }
    wrong
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Many tenants, keys and callers at once, with random cancellations
    /// and deadlines, on both drivers: no answer ever comes from another
    /// tenant's view.
    #[test]
    fn no_answer_comes_from_another_tenants_view(
        reads in prop::collection::vec(read(), 1..200),
        cached in any::<bool>(),
        timeout_ms in 5u64..200,
        sqlx in any::<bool>(),
    ) {
        let rls = shared_rls();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let timeout = Duration::from_millis(timeout_ms);
        let wrong = rt.block_on(async {
            if sqlx {
                wrong_answers::<Sqlx>(&rls, &reads, cached, timeout).await
            } else {
                wrong_answers::<TokioPostgres>(&rls, &reads, cached, timeout).await
            }
        });
        prop_assert!(wrong.is_empty(), "answers from another view: {:?}", wrong);
    }
}
