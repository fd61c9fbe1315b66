//! Scoped loads against real Postgres under row-level security, on both
//! drivers: a shared batcher serves many tenants, each load runs as one
//! tenant (its role and settings set as parameters by the loader's
//! prologue, in a transaction of its own), no answer comes from another
//! tenant's view, and nothing of a scope survives on the pooled
//! connection: after a success, a failed statement, a refused role, an
//! abandoned load, a killed connection, or behind PgBouncer in
//! transaction mode. The holes an adversarial review found are each a
//! test here: roles that bypass row-level security, settings and roles
//! another client left on a connection, names in another case,
//! statements colliding behind a pooler, shared cached values served to
//! a refused role.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use embedded_pg::pgbouncer::{PgBouncer, PoolMode};
use pgbatch::cache::{Admission, Cache};
use pgbatch::db::Scope;
use pgbatch::{Batcher, BatcherBuilder, Concurrency, Error, FlushPolicy};
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
    bypass_role: String,
    owner_role: String,
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
    let (auth, tenant, stranger, bypass, owner) = (
        format!("{prefix}_auth"),
        format!("{prefix}_tenant"),
        format!("{prefix}_stranger"),
        format!("{prefix}_bypass"),
        format!("{prefix}_owner"),
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
               ANALYZE notes;
               -- Roles row-level security does not apply to: one with
               -- BYPASSRLS, and the owner of a table whose policies are
               -- not forced on it; `auth` may become both.
               CREATE ROLE "{bypass}" NOLOGIN BYPASSRLS;
               CREATE ROLE "{owner}" NOLOGIN;
               GRANT "{bypass}", "{owner}" TO "{auth}";
               GRANT SELECT ON notes TO "{bypass}", "{owner}";
               CREATE TABLE owned (id bigint PRIMARY KEY);
               ALTER TABLE owned ENABLE ROW LEVEL SECURITY;
               ALTER TABLE owned OWNER TO "{owner}";
               -- What another client of the login role could point a
               -- pooled connection's search path at.
               CREATE SCHEMA evil;
               CREATE FUNCTION evil.set_config(text, text, boolean) RETURNS text
                 LANGUAGE sql AS $f$ SELECT $2 $f$;
               GRANT USAGE ON SCHEMA evil TO PUBLIC;"#
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
        bypass_role: bypass,
        owner_role: owner,
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
    /// The same, a tenth of a second late.
    Brief,
    /// The same, with a NULL body (which does not map) for ids ending in 17.
    Nulls,
    /// The same, the body in capitals.
    Upper,
}

impl Sql {
    fn text(self) -> &'static str {
        match self {
            Sql::Notes => "SELECT id, body FROM notes WHERE id = ANY($1)",
            Sql::Slow => "SELECT id, body FROM notes, pg_sleep(0.5) WHERE id = ANY($1)",
            Sql::Brief => "SELECT id, body FROM notes, pg_sleep(0.1) WHERE id = ANY($1)",
            Sql::Nulls => {
                "SELECT id, CASE WHEN id % 100 = 17 THEN NULL ELSE body END FROM notes WHERE id = ANY($1)"
            }
            Sql::Upper => "SELECT id, upper(body) FROM notes WHERE id = ANY($1)",
        }
    }
}

/// One driver's scoped batcher over a pool, and a look at what the pool's
/// next connection carries.
trait Driver: Sized + Send + Sync + 'static {
    const NAME: &'static str;
    /// How many scopes one load serves at most (the loader's default).
    const SCOPES_PER_LOAD: u64;

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

    /// Runs `sql` (session-level `SET`s) on the pool's next connection
    /// and gives it back to the pool as it is: what another client of a
    /// pooled connection may leave on it.
    async fn leave(&self, sql: &str);
}

const SESSION: &str = "SELECT current_user::text, current_setting('app.tenant', true)";

/// Every setting the tests' scopes set.
const SETTINGS: [&str; 2] = ["app.tenant", "request.jwt.claims"];

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
        fn row_key(&self, row: &Row) -> Option<i64> {
            row.try_get(0).ok()
        }
    }

    pub(super) struct TokioPostgres(pub(super) pg::Pool);

    impl Driver for TokioPostgres {
        const NAME: &'static str = "tokio-postgres";
        const SCOPES_PER_LOAD: u64 = 4;

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
            )
            .scoped(SETTINGS)
            .unwrap();
            (Self(pool), builder.build_scoped(loader).unwrap())
        }

        async fn session(&self) -> (String, Option<String>) {
            let client = self.0.get().await.unwrap();
            let row = client.query_one(SESSION, &[]).await.unwrap();
            (row.get(0), row.get(1))
        }

        async fn leave(&self, sql: &str) {
            self.0
                .get()
                .await
                .unwrap()
                .batch_execute(sql)
                .await
                .unwrap();
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
        fn row_key(&self, row: &sqlx::postgres::PgRow) -> Option<i64> {
            row.try_get(0).ok()
        }
    }

    pub(super) struct Sqlx(pub(super) PgPool);

    impl Driver for Sqlx {
        const NAME: &'static str = "sqlx";
        const SCOPES_PER_LOAD: u64 = 4;

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
            let loader = SqlxLoader::with_statement_mode(pool.clone(), Notes(sql), mode)
                .scoped(SETTINGS)
                .unwrap();
            (Self(pool), builder.build_scoped(loader).unwrap())
        }

        async fn session(&self) -> (String, Option<String>) {
            // A simple query: unprepared, so it works through a
            // transaction-mode pooler too.
            let row = sqlx::raw_sql(SESSION).fetch_one(&self.0).await.unwrap();
            (row.get(0), row.get(1))
        }

        async fn leave(&self, sql: &str) {
            sqlx::raw_sql(sql).execute(&self.0).await.unwrap();
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

    // After a statement that failed (the strict policy's cast): the
    // database's message quotes the value, so it is withheld.
    let bad = rls.scope(&rls.tenant_role, "not-a-number");
    let err = batcher.load_as(&bad, 1).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("22P02") && text.contains("withheld") && !text.contains("not-a-number"),
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
        .load_as(&Scope::builder().login_role().build().unwrap(), 1)
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
        (rls.scope(&rls.tenant_role, "x"), Err("SQLSTATE 22P02")),
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

/// A row that does not map fails its own key alone, with an error naming
/// the key and the column; the keys of its batch without a row read as
/// not found; other scopes' loads are untouched.
async fn a_bad_row_fails_its_keys_alone<D: Driver>() {
    let rls = rls_database().await;
    let builder = Batcher::builder()
        .concurrency(Concurrency::Fixed(1))
        .max_batch_size(64);
    let (_, batcher) = D::open(&rls.auth, 1, false, Sql::Nulls, builder).await;
    let tenant = rls.tenant(7);
    // 17 is the NULL row; 8 is another tenant's (no row); 27 maps.
    let mixed = batcher.load_many_as(&tenant, [17, 8, 27]).await;
    let err = mixed[0].as_ref().unwrap_err().to_string();
    assert!(
        err.contains("the row of key 17 did not map") && err.contains("column 1"),
        "{}: {err}",
        D::NAME
    );
    assert_eq!(mixed[1].as_ref().unwrap(), &None, "{}", D::NAME);
    assert_eq!(mixed[2].as_ref().unwrap(), &view(7, 27), "{}", D::NAME);
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
    // Another client's plain `SET` stays on the one server connection; a
    // scope that does not set `app.tenant` must not read it.
    probe.leave("SET app.tenant = '3'").await;
    assert_eq!(probe.session().await.1.as_deref(), Some("3"), "{}", D::NAME);
    let unset = Scope::builder()
        .label("no tenant")
        .role(&rls.tenant_role)
        .build()
        .unwrap();
    let got = batcher.load_as(&unset, 13).await;
    assert!(
        got.is_err(),
        "{}: read as the leftover tenant: {got:?}",
        D::NAME
    );
    probe.leave("RESET app.tenant").await;
    // The pooler logs in as the superuser: a login-role scope is refused.
    let login = Scope::builder().login_role().build().unwrap();
    let err = batcher.load_as(&login, 13).await.unwrap_err();
    assert!(
        matches!(
            scope_error(&err),
            Some(pgbatch::db::ScopeError::BypassesRls { .. })
        ),
        "{}: {err}",
        D::NAME
    );
}

/// Ten tenants and a refused role in one load through the pooler (one
/// server connection, unnamed statements): each reads its own view, and
/// the server connection is left clean for the next client.
async fn several_scopes_in_one_load_behind_the_pooler<D: Driver>(bouncer: &PgBouncer, rls: &Rls) {
    let through = bouncer.config("postgres");
    let (probe, batcher) = D::open(
        &through,
        2,
        true,
        Sql::Notes,
        one_load(Duration::from_millis(200)),
    )
    .await;
    let mut asks: Asks = (0..TENANTS)
        .map(|t| {
            (
                rls.tenant(t),
                vec![(40 + i64::from(t), Ok(view(t, 40 + i64::from(t))))],
            )
        })
        .collect();
    // The pooler logs in as the superuser, who may become any role: the
    // failing scope here is a tenant the policy cannot cast.
    asks.push((
        rls.scope(&rls.tenant_role, "x"),
        vec![(1, Err("SQLSTATE 22P02"))],
    ));
    ask_all(D::NAME, &batcher, asks).await;
    let loads = 11u64.div_ceil(D::SCOPES_PER_LOAD);
    assert_eq!(batcher.stats().batches, loads, "{}", D::NAME);
    for _ in 0..3 {
        let session = probe.session().await;
        assert!(is_clean(&session, "postgres"), "{}: {session:?}", D::NAME);
    }
}

/// Both behind one pooler, which a private cluster and PgBouncer take
/// seconds to start.
#[tokio::test]
async fn nothing_of_a_scope_survives_and_no_statement_collides_behind_a_transaction_pooler() {
    let cluster = embedded_pg::testing::private_cluster()
        .await
        .expect("a private cluster");
    let rls = create_rls(cluster.config("postgres"), "pooled").await;
    let bouncer = PgBouncer::start(&cluster, PoolMode::Transaction, 1)
        .await
        .expect("PgBouncer (scripts/ensure-pgbouncer.sh installs it)");
    nothing_survives_behind_the_pooler::<TokioPostgres>(&bouncer, &rls).await;
    nothing_survives_behind_the_pooler::<Sqlx>(&bouncer, &rls).await;
    several_scopes_in_one_load_behind_the_pooler::<TokioPostgres>(&bouncer, &rls).await;
    several_scopes_in_one_load_behind_the_pooler::<Sqlx>(&bouncer, &rls).await;
    statements_do_not_collide_behind_the_pooler::<TokioPostgres>(&bouncer, &rls).await;
    statements_do_not_collide_behind_the_pooler::<Sqlx>(&bouncer, &rls).await;
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

/// The scope error inside a failed load's error, of either driver.
fn scope_error(e: &Error) -> Option<pgbatch::db::ScopeError> {
    if let Some(pg) = e.load_error::<pgbatch::pg::PgError>() {
        return pg.as_scope_error().cloned();
    }
    match e.load_error::<sqlx::Error>()? {
        sqlx::Error::Configuration(inner) => inner.downcast_ref().cloned(),
        _ => None,
    }
}

/// Loads as a role that row-level security does not apply to are refused
/// before they run: the login role as a superuser (or as the tables'
/// owner), a role with BYPASSRLS, a role owning a table whose policies are
/// not forced. A refusal is not remembered: once the table forces its
/// policies, the owner's scope runs.
async fn roles_that_bypass_policies_are_refused<D: Driver>(rls: &Rls) {
    let ctx = D::NAME;
    let refused = |e: &Error, why: &str| {
        let scope = scope_error(e);
        assert!(
            matches!(&scope, Some(pgbatch::db::ScopeError::BypassesRls { why: w, .. }) if w.contains(why)),
            "{ctx}: {why}: {e} ({scope:?})"
        );
    };
    // Logged in as the superuser that owns `notes`.
    let (_, as_admin) = D::open(&rls.admin, 2, false, Sql::Notes, Batcher::builder()).await;
    let login = Scope::builder().login_role().build().unwrap();
    refused(&as_admin.load_as(&login, 1).await.unwrap_err(), "superuser");

    let (_, batcher) = D::open(&rls.auth, 2, false, Sql::Notes, Batcher::builder()).await;
    for (role, why) in [
        (&rls.bypass_role, "BYPASSRLS"),
        (&rls.owner_role, "owns table"),
    ] {
        let scope = rls.scope(role, "3");
        refused(&batcher.load_as(&scope, 13).await.unwrap_err(), why);
    }
    // The tenant's scope still reads its own rows only.
    assert_eq!(
        batcher.load_as(&rls.tenant(3), 13).await.unwrap(),
        view(3, 13)
    );
    assert_eq!(batcher.load_as(&rls.tenant(3), 14).await.unwrap(), None);

    let (client, conn) = rls.admin.connect(NoTls).await.unwrap();
    tokio::spawn(conn);
    client
        .batch_execute("ALTER TABLE owned FORCE ROW LEVEL SECURITY")
        .await
        .unwrap();
    let owner = rls.scope(&rls.owner_role, "3");
    assert!(
        batcher.load_as(&owner, 13).await.is_ok(),
        "{ctx}: accepted once the policies apply"
    );
    client
        .batch_execute("ALTER TABLE owned NO FORCE ROW LEVEL SECURITY")
        .await
        .unwrap();
}

#[tokio::test]
async fn a_role_that_bypasses_row_level_security_is_refused_before_it_reads() {
    for reserved in [
        "none",
        "NONE",
        "current_user",
        "session_user",
        "public",
        "pg_read_all_data",
    ] {
        assert!(
            matches!(
                Scope::builder().role(reserved).build(),
                Err(pgbatch::db::ScopeError::ReservedRole(_))
            ),
            "{reserved}"
        );
    }
    assert!(matches!(
        Scope::builder().setting("app.tenant", "2").build(),
        Err(pgbatch::db::ScopeError::NoRole)
    ));
    let rls = rls_database().await;
    roles_that_bypass_policies_are_refused::<TokioPostgres>(&rls).await;
    roles_that_bypass_policies_are_refused::<Sqlx>(&rls).await;
}

/// Another client left a session-level role and settings on the pooled
/// connection (a plain `SET`): a scope reads none of them. Its loads run as
/// its own role, and every declared setting it does not set is `''`.
async fn nothing_left_on_the_connection_is_read<D: Driver>(rls: &Rls) {
    let ctx = D::NAME;
    let (probe, batcher) = D::open(&rls.auth, 1, false, Sql::Notes, Batcher::builder()).await;
    probe
        .leave(&format!(
            r#"SET app.tenant = '3'; SET request.jwt.claims = 'left'; SET ROLE "{}""#,
            rls.tenant_role
        ))
        .await;
    assert_eq!(probe.session().await.1.as_deref(), Some("3"), "{ctx}: left");
    // A scope of the tenant role that does not set `app.tenant`: the
    // strict policy casts `''`, which fails; with the leftover `3` it
    // would have read tenant 3's note.
    let unset = Scope::builder()
        .label("no tenant")
        .role(&rls.tenant_role)
        .build()
        .unwrap();
    let got = batcher.load_as(&unset, 13).await;
    assert!(
        got.as_ref().is_err_and(|e| e
            .to_string()
            .contains("invalid input syntax for type integer: \"\"")),
        "{ctx}: {got:?}"
    );
    // As the login role: not the tenant role left on the session, so the
    // table is not readable at all.
    let login = Scope::builder().login_role().build().unwrap();
    let got = batcher.load_as(&login, 13).await;
    assert!(
        got.as_ref()
            .is_err_and(|e| e.to_string().contains("permission denied for table notes")),
        "{ctx}: {got:?}"
    );
    // A search path and a temporary table another client left: a scope's
    // load still sets its role and settings with Postgres's own
    // `set_config`, and reads the application's table.
    probe
        .leave(
            "SET search_path = evil, pg_catalog, public; \
             CREATE TEMP TABLE notes (id bigint, tenant int, body text); \
             INSERT INTO notes VALUES (13, 3, 'forged')",
        )
        .await;
    assert_eq!(
        batcher.load_as(&rls.tenant(3), 13).await.unwrap(),
        view(3, 13),
        "{ctx}: the left search path chose what the load read"
    );
    probe
        .leave("RESET search_path; DROP TABLE pg_temp.notes")
        .await;
    // A setting's name is what Postgres reads, whatever its case.
    let shouting = Scope::builder()
        .label("tenant 3")
        .role(&rls.tenant_role)
        .setting("APP.TENANT", "3")
        .build()
        .unwrap();
    assert_eq!(batcher.load_as(&shouting, 13).await.unwrap(), view(3, 13));
    // A setting the loader did not declare is refused by name.
    let stray = Scope::builder()
        .role(&rls.tenant_role)
        .setting("app.other", "1")
        .build()
        .unwrap();
    let err = batcher.load_as(&stray, 13).await.unwrap_err();
    assert_eq!(
        scope_error(&err),
        Some(pgbatch::db::ScopeError::UndeclaredSetting(
            "app.other".into()
        )),
        "{ctx}: {err}"
    );
}

#[tokio::test]
async fn a_scope_reads_no_role_or_setting_another_client_left_on_the_connection() {
    let rls = rls_database().await;
    nothing_left_on_the_connection_is_read::<TokioPostgres>(&rls).await;
    nothing_left_on_the_connection_is_read::<Sqlx>(&rls).await;
}

#[tokio::test]
async fn the_scoped_loaders_single_key_form_runs_as_its_scope() {
    use pgbatch::pg::{PgLoader, PoolOptions};

    let rls = rls_database().await;
    let pool = pgbatch::pg::pool(rls.auth.clone(), &PoolOptions::with_max_size(1)).unwrap();
    let loader = PgLoader::new(pool, tokio_pg::Notes(Sql::Notes))
        .scoped(SETTINGS)
        .unwrap();
    assert_eq!(
        loader.load_one(&rls.tenant(3), &13).await.unwrap(),
        view(3, 13)
    );
    assert_eq!(loader.load_one(&rls.tenant(4), &13).await.unwrap(), None);
    let sqlx_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(crate::sqlx_connect::connect_options(&rls.auth))
        .await
        .unwrap();
    let loader = pgbatch::sqlx::SqlxLoader::new(sqlx_pool, sqlx_pg::Notes(Sql::Notes))
        .scoped(SETTINGS)
        .unwrap();
    assert_eq!(
        loader.load_one(&rls.tenant(3), &13).await.unwrap(),
        view(3, 13)
    );
    assert_eq!(loader.load_one(&rls.tenant(4), &13).await.unwrap(), None);
}

/// A value every scope may share is served from the cache only to scopes
/// whose own loads the database has accepted: never to a role it refuses.
async fn shared_values_reach_accepted_scopes_alone<D: Driver>(rls: &Rls) {
    let ctx = D::NAME;
    let (_, batcher) = D::open(&rls.auth, 2, false, Sql::Notes, Batcher::builder()).await;
    let cache = Cache::builder()
        .admission(Admission::Always)
        // Every value marked the same for everyone, as a public row's is.
        .shared_when(|_| true)
        .build_with_batcher(batcher.clone())
        .unwrap();
    assert_eq!(cache.get_as(&rls.tenant(3), 13).await.unwrap(), view(3, 13));
    assert_eq!(
        cache.get_if_present_as(&rls.tenant(3), &13).await,
        Some(view(3, 13))
    );
    // The stranger's role is refused by the database: no shared value for
    // it, and its load fails.
    let stranger = rls.scope(&rls.stranger_role, "3");
    assert_eq!(cache.get_if_present_as(&stranger, &13).await, None, "{ctx}");
    let err = cache.get_as(&stranger, 13).await.unwrap_err();
    assert!(
        err.to_string().contains("permission denied to set role"),
        "{ctx}: {err}"
    );
    assert_eq!(cache.get_if_present_as(&stranger, &13).await, None, "{ctx}");
    // Tenant 4's loads succeed: then it is served the shared value.
    assert_eq!(cache.get_as(&rls.tenant(4), 14).await.unwrap(), view(4, 14));
    assert_eq!(
        cache.get_if_present_as(&rls.tenant(4), &13).await,
        Some(view(3, 13)),
        "{ctx}: shared once accepted"
    );
}

#[tokio::test]
async fn a_shared_cached_value_is_never_served_to_a_role_the_database_refuses() {
    let rls = rls_database().await;
    shared_values_reach_accepted_scopes_alone::<TokioPostgres>(&rls).await;
    shared_values_reach_accepted_scopes_alone::<Sqlx>(&rls).await;
}

/// Through PgBouncer in transaction mode with one server connection: two
/// clients whose statements sqlx and tokio-postgres would name alike
/// (`sqlx_s_1`, `s0`) but that read different columns. With unnamed
/// statements, as the pooler docs say, each answer comes from its own
/// client's statement.
async fn statements_do_not_collide_behind_the_pooler<D: Driver>(bouncer: &PgBouncer, rls: &Rls) {
    let through = bouncer.config("postgres");
    let (_, notes) = D::open(&through, 2, true, Sql::Notes, Batcher::builder()).await;
    let (_, upper) = D::open(&through, 2, true, Sql::Upper, Batcher::builder()).await;
    let reads: Vec<_> = (0..200i64)
        .map(|i| {
            let (t, id) = ((i % 10) as i32, 1 + i % 60);
            let (notes, upper, scope) = (notes.clone(), upper.clone(), rls.tenant(t));
            tokio::spawn(async move {
                let (a, b) = tokio::join!(notes.load_as(&scope, id), upper.load_as(&scope, id));
                (t, id, a.unwrap(), b.unwrap())
            })
        })
        .collect();
    for read in reads {
        let (t, id, plain, shouted) = read.await.unwrap();
        assert_eq!(plain, view(t, id), "{} tenant {t} note {id}", D::NAME);
        assert_eq!(
            shouted,
            view(t, id).map(|v| v.to_uppercase()),
            "{} tenant {t} note {id}",
            D::NAME
        );
    }
}

/// A batcher that gathers every request of the next `wait` into one load
/// on one connection: loads of several scopes, whatever the machine's
/// speed.
fn one_load(wait: Duration) -> BatcherBuilder<i64, String> {
    Batcher::builder()
        .policy(FlushPolicy::FixedDelay)
        .max_delay(wait)
        .max_batch_size(64)
        .concurrency(Concurrency::Fixed(1))
        .direct_when_idle(false)
}

/// How many transactions of the login role are open (idle in one).
async fn open_transactions(rls: &Rls) -> i64 {
    let (client, conn) = rls.admin.connect(NoTls).await.unwrap();
    tokio::spawn(conn);
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE usename = $1 AND state LIKE 'idle in transaction%'",
            &[&rls.auth_role],
        )
        .await
        .unwrap()
        .get(0)
}

/// Every scope's reads at once: its scope, and what each read must get
/// (the note's text, or a piece of the error).
type Asks = Vec<(Scope, Vec<(i64, Result<Option<String>, &'static str>)>)>;

/// Runs `asks` all at once, each read on its own task, and checks each
/// answer against what it must get.
async fn ask_all(ctx: &str, batcher: &Batcher<i64, String, Scope>, asks: Asks) {
    let reads: Vec<_> = asks
        .into_iter()
        .flat_map(|(scope, reads)| reads.into_iter().map(move |r| (scope.clone(), r)))
        .map(|(scope, (id, want))| {
            let batcher = batcher.clone();
            tokio::spawn(async move { (scope.name(), id, want, batcher.load_as(&scope, id).await) })
        })
        .collect();
    for read in reads {
        let (name, id, want, got) = read.await.unwrap();
        match (want, got) {
            (Ok(want), Ok(got)) => assert_eq!(got, want, "{ctx}: {name} note {id}"),
            (Err(text), Err(e)) => {
                assert!(e.to_string().contains(text), "{ctx}: {name} note {id}: {e}");
            }
            (want, got) => panic!("{ctx}: {name} note {id}: {got:?}, not {want:?}"),
        }
    }
}

/// Ten tenants, a refused role and a failing statement in as few loads as
/// the loader allows (one round trip on tokio-postgres; sqlx's in series):
/// each tenant reads its own view, the two bad scopes fail alone, and
/// nothing is left on the one connection.
async fn several_scopes_in_one_load<D: Driver>(rls: &Rls) {
    let (probe, batcher) = D::open(
        &rls.auth,
        1,
        false,
        Sql::Notes,
        one_load(Duration::from_millis(200)),
    )
    .await;
    let mut asks: Asks = (0..TENANTS)
        .map(|t| {
            (
                rls.tenant(t),
                (1..=3)
                    .map(|i| (i * 10 + i64::from(t), Ok(view(t, i * 10 + i64::from(t)))))
                    .collect(),
            )
        })
        .collect();
    // Another tenant's note reads as missing.
    asks[0].1.push((11, Ok(None)));
    asks.push((
        rls.scope(&rls.stranger_role, "3"),
        vec![(13, Err("permission denied to set role"))],
    ));
    asks.push((
        rls.scope(&rls.tenant_role, "x"),
        vec![(1, Err("SQLSTATE 22P02"))],
    ));
    ask_all(D::NAME, &batcher, asks).await;
    let stats = batcher.stats();
    let loads = 12u64.div_ceil(D::SCOPES_PER_LOAD);
    assert_eq!(stats.batches, loads, "{}: {stats:?}", D::NAME);
    let session = probe.session().await;
    assert!(
        is_clean(&session, &rls.auth_role),
        "{}: {session:?}",
        D::NAME
    );
    assert_eq!(open_transactions(rls).await, 0, "{}", D::NAME);
}

#[tokio::test]
async fn several_scopes_share_one_load_and_fail_alone() {
    let rls = rls_database().await;
    several_scopes_in_one_load::<TokioPostgres>(&rls).await;
    several_scopes_in_one_load::<Sqlx>(&rls).await;
}

/// A load of five scopes whose connection is killed while its statements
/// run: the load runs again on a new connection, and every tenant reads
/// its own view.
async fn a_load_of_several_scopes_survives_a_killed_connection<D: Driver>(rls: &Rls) {
    let (probe, batcher) = D::open(
        &rls.auth,
        1,
        false,
        Sql::Brief,
        one_load(Duration::from_millis(50)),
    )
    .await;
    let asks: Asks = (0..5)
        .map(|t| {
            (
                rls.tenant(t),
                vec![(20 + i64::from(t), Ok(view(t, 20 + i64::from(t))))],
            )
        })
        .collect();
    let (admin, login) = (rls.admin.clone(), rls.auth_role.clone());
    let kill = tokio::spawn(async move {
        // The load starts at 50 ms; its second transaction sleeps from
        // about 150 ms.
        tokio::time::sleep(Duration::from_millis(220)).await;
        kill_sessions_of(&admin, &login).await;
    });
    ask_all(D::NAME, &batcher, asks).await;
    kill.await.unwrap();
    let session = probe.session().await;
    assert!(
        is_clean(&session, &rls.auth_role),
        "{}: {session:?}",
        D::NAME
    );
}

#[tokio::test]
async fn a_load_of_several_scopes_runs_again_after_its_connection_is_killed() {
    let rls = rls_database().await;
    a_load_of_several_scopes_survives_a_killed_connection::<TokioPostgres>(&rls).await;
    a_load_of_several_scopes_survives_a_killed_connection::<Sqlx>(&rls).await;
}

/// A caller of a load of several scopes gives up while it runs: the
/// others get their answers, and the connection is left clean.
async fn a_cancelled_caller_of_several_scopes<D: Driver>(rls: &Rls) {
    let (probe, batcher) = D::open(
        &rls.auth,
        1,
        false,
        Sql::Brief,
        one_load(Duration::from_millis(50)),
    )
    .await;
    let quitter = {
        let (batcher, scope) = (batcher.clone(), rls.tenant(9));
        tokio::spawn(async move {
            tokio::time::timeout(Duration::from_millis(120), batcher.load_as(&scope, 19)).await
        })
    };
    let asks: Asks = (0..4)
        .map(|t| {
            (
                rls.tenant(t),
                vec![(30 + i64::from(t), Ok(view(t, 30 + i64::from(t))))],
            )
        })
        .collect();
    ask_all(D::NAME, &batcher, asks).await;
    assert!(quitter.await.unwrap().is_err(), "{}: gave up", D::NAME);
    let session = probe.session().await;
    assert!(
        is_clean(&session, &rls.auth_role),
        "{}: {session:?}",
        D::NAME
    );
    assert_eq!(open_transactions(rls).await, 0, "{}", D::NAME);
}

#[tokio::test]
async fn a_caller_that_gives_up_leaves_the_other_scopes_of_its_load_their_answers() {
    let rls = rls_database().await;
    a_cancelled_caller_of_several_scopes::<TokioPostgres>(&rls).await;
    a_cancelled_caller_of_several_scopes::<Sqlx>(&rls).await;
}
