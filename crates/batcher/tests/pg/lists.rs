//! Lists and pages on real Postgres, on both drivers: every row of a key
//! (an empty list for a parent with none), and pages of each parent's
//! children after a cursor, for many parents in one statement; through the
//! batcher, the cache and scopes under row-level security; with parents
//! of no child, fewer than a page, exactly a page and one more, and ties
//! in the order column broken by the key.

use std::time::Duration;

use pgbatch::cache::{Admission, Cache};
use pgbatch::db::{Cursor, Page, PageKey, PageSql, Scope};
use pgbatch::{Batcher, FlushPolicy};
use tokio_postgres::NoTls;

/// A child row: its id and body.
type Child = (i64, String);

/// Parents 1-5 and their children:
/// - 1: none;
/// - 2: two (fewer than a page of three);
/// - 3: three (exactly a page);
/// - 4: four (one more than a page);
/// - 5: seven, all at the same position (ties, broken by id);
/// - 6: one whose body is NULL (a row that does not map), and one fine.
///
/// Children of even id are tenant 0's, of odd id tenant 1's.
async fn children(config: &tokio_postgres::Config, role: &str) {
    let (client, conn) = config.connect(NoTls).await.unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(&format!(
            "CREATE TABLE children (
                 id bigint PRIMARY KEY, parent_id bigint NOT NULL, pos int NOT NULL,
                 tenant int NOT NULL, body text);
             INSERT INTO children (id, parent_id, pos, tenant, body) VALUES
                 (21, 2, 2, 1, 'c21'), (22, 2, 1, 0, 'c22'),
                 (31, 3, 1, 1, 'c31'), (32, 3, 2, 0, 'c32'), (33, 3, 3, 1, 'c33'),
                 (41, 4, 4, 1, 'c41'), (42, 4, 3, 0, 'c42'), (43, 4, 2, 1, 'c43'), (44, 4, 1, 0, 'c44'),
                 (57, 5, 1, 1, 'c57'), (51, 5, 1, 1, 'c51'), (55, 5, 1, 1, 'c55'), (53, 5, 1, 1, 'c53'),
                 (52, 5, 1, 0, 'c52'), (56, 5, 1, 0, 'c56'), (54, 5, 1, 0, 'c54'),
                 (61, 6, 1, 1, NULL), (62, 6, 2, 0, 'c62');
             CREATE INDEX ON children (parent_id, pos, id);
             -- A date column to order by, and a column NULL for child 43.
             ALTER TABLE children ADD COLUMN created date, ADD COLUMN rank int;
             UPDATE children SET created = date '2024-01-01' + pos,
                                 rank = CASE WHEN id = 43 THEN NULL ELSE pos END;
             CREATE ROLE {role} NOLOGIN;
             GRANT {role} TO CURRENT_USER;
             GRANT SELECT ON children TO {role};
             ALTER TABLE children ENABLE ROW LEVEL SECURITY;
             ALTER TABLE children FORCE ROW LEVEL SECURITY;
             CREATE POLICY by_tenant ON children FOR SELECT TO {role}
               USING (tenant = nullif(current_setting('app.tenant', true), '')::int);
             CREATE POLICY owner_reads_all ON children FOR SELECT TO CURRENT_USER USING (true);",
        ))
        .await
        .unwrap();
}

/// The SQL of every list load: a parent's children by position, then id.
const LIST_SQL: &str =
    "SELECT parent_id, id, body FROM children WHERE parent_id = ANY($1) ORDER BY parent_id, pos, id";

fn page_sql(order: &str) -> PageSql {
    PageSql::builder("children")
        .parent("parent_id", "bigint")
        .columns(["id", "body"])
        .order_by(order, "int")
        .order_by("id", "bigint")
        .max_first(10)
        .build()
        .unwrap()
}

/// Tenant `t`'s scope, as the role of the database named `db` (roles are
/// the cluster's: each test's database has its own).
fn tenant(db: &str, t: i32) -> Scope {
    Scope::builder()
        .label(format!("tenant {t}"))
        .role(role_of(db))
        .setting("app.tenant", t.to_string())
        .build()
        .unwrap()
}

/// What children of `parent` read as, in order.
fn child(id: i64) -> Child {
    (id, format!("c{id}"))
}

/// One driver's list and page batchers on one database.
trait Driver: Sized {
    const NAME: &'static str;
    async fn open(config: &tokio_postgres::Config) -> Self;
    fn lists(&self) -> Batcher<i64, Vec<Child>>;
    fn pages(&self, sql: PageSql) -> Batcher<PageKey<i64>, Page<Child>>;
    fn scoped_lists(&self) -> Batcher<i64, Vec<Child>, Scope>;
    fn scoped_pages(&self, sql: PageSql) -> Batcher<PageKey<i64>, Page<Child>, Scope>;
}

/// Gathers concurrent requests into one load: each test's requests are one
/// `load_many`, so one statement answers keys of every shape.
fn builder<K, V>() -> pgbatch::BatcherBuilder<K, V>
where
    K: Clone + Eq + std::hash::Hash + Send + 'static,
    V: Clone + Send + 'static,
{
    Batcher::builder()
        .policy(FlushPolicy::FixedDelay)
        .max_delay(Duration::from_millis(5))
}

mod tokio_pg {
    use pgbatch::pg::tokio_postgres::{Error, Row};
    use pgbatch::pg::{self, BatchQuery, PageQuery, Params, PgLoader, PoolOptions};

    use super::*;

    pub(super) struct Children;

    impl BatchQuery for Children {
        type Key = i64;
        type Value = Child;
        fn batch_sql(&self) -> &str {
            LIST_SQL
        }
        fn batch_params<'a>(&self, keys: &'a [i64]) -> Params<'a> {
            vec![Box::new(keys)]
        }
        fn map_row(&self, row: &Row) -> Result<(i64, Child), Error> {
            Ok((row.try_get(0)?, (row.try_get(1)?, row.try_get(2)?)))
        }
        fn row_key(&self, row: &Row) -> Option<i64> {
            row.try_get(0).ok()
        }
    }

    pub(super) struct Pages(pub(super) PageSql);

    impl PageQuery for Pages {
        type Parent = i64;
        type Value = Child;
        fn page_sql(&self) -> &PageSql {
            &self.0
        }
        fn map_row(&self, row: &Row) -> Result<Child, Error> {
            Ok((row.try_get(0)?, row.try_get(1)?))
        }
    }

    pub(super) struct TokioPostgres(pub(super) pg::Pool);

    impl Driver for TokioPostgres {
        const NAME: &'static str = "tokio-postgres";

        async fn open(config: &tokio_postgres::Config) -> Self {
            Self(pg::pool(config.clone(), &PoolOptions::with_max_size(2)).unwrap())
        }
        fn lists(&self) -> Batcher<i64, Vec<Child>> {
            builder()
                .build(PgLoader::new(self.0.clone(), Children).lists())
                .unwrap()
        }
        fn pages(&self, sql: PageSql) -> Batcher<PageKey<i64>, Page<Child>> {
            builder()
                .build(PgLoader::pages(self.0.clone(), Pages(sql)))
                .unwrap()
        }
        fn scoped_lists(&self) -> Batcher<i64, Vec<Child>, Scope> {
            let loader = PgLoader::new(self.0.clone(), Children)
                .lists()
                .scoped(["app.tenant"])
                .unwrap();
            builder().build_scoped(loader).unwrap()
        }
        fn scoped_pages(&self, sql: PageSql) -> Batcher<PageKey<i64>, Page<Child>, Scope> {
            let loader = PgLoader::pages(self.0.clone(), Pages(sql))
                .scoped(["app.tenant"])
                .unwrap();
            builder().build_scoped(loader).unwrap()
        }
    }
}

mod sqlx_pg {
    use pgbatch::sqlx::{BatchQuery, PageQuery, PgQuery, SqlxLoader};
    use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
    use sqlx::Row as _;

    use super::*;
    use crate::sqlx_connect::connect_options;

    pub(super) struct Children;

    impl BatchQuery for Children {
        type Key = i64;
        type Row = (i64, i64, String);
        type Value = Child;
        fn batch_sql(&self) -> &str {
            LIST_SQL
        }
        fn bind_batch<'q>(&self, query: PgQuery<'q>, keys: &'q [i64]) -> PgQuery<'q> {
            query.bind(keys)
        }
        fn map_row(&self, (parent, id, body): (i64, i64, String)) -> (i64, Child) {
            (parent, (id, body))
        }
        fn row_key(&self, row: &PgRow) -> Option<i64> {
            row.try_get(0).ok()
        }
    }

    pub(super) struct Pages(pub(super) PageSql);

    impl PageQuery for Pages {
        type Parent = i64;
        type Row = (i64, String);
        type Value = Child;
        fn page_sql(&self) -> &PageSql {
            &self.0
        }
        fn map_row(&self, row: (i64, String)) -> Child {
            row
        }
    }

    pub(super) struct Sqlx(pub(super) PgPool);

    impl Driver for Sqlx {
        const NAME: &'static str = "sqlx";

        async fn open(config: &tokio_postgres::Config) -> Self {
            let pool = PgPoolOptions::new()
                .max_connections(2)
                .connect_with(connect_options(config))
                .await
                .unwrap();
            Self(pool)
        }
        fn lists(&self) -> Batcher<i64, Vec<Child>> {
            builder()
                .build(SqlxLoader::new(self.0.clone(), Children).lists())
                .unwrap()
        }
        fn pages(&self, sql: PageSql) -> Batcher<PageKey<i64>, Page<Child>> {
            builder()
                .build(SqlxLoader::pages(self.0.clone(), Pages(sql)))
                .unwrap()
        }
        fn scoped_lists(&self) -> Batcher<i64, Vec<Child>, Scope> {
            let loader = SqlxLoader::new(self.0.clone(), Children)
                .lists()
                .scoped(["app.tenant"])
                .unwrap();
            builder().build_scoped(loader).unwrap()
        }
        fn scoped_pages(&self, sql: PageSql) -> Batcher<PageKey<i64>, Page<Child>, Scope> {
            let loader = SqlxLoader::pages(self.0.clone(), Pages(sql))
                .scoped(["app.tenant"])
                .unwrap();
            builder().build_scoped(loader).unwrap()
        }
    }
}

use sqlx_pg::Sqlx;
use tokio_pg::TokioPostgres;

/// The tenants' role of the database named `db`.
fn role_of(db: &str) -> String {
    format!("{db}_tenant")
}

/// A database of the test's own with the children.
async fn database() -> embedded_pg::testing::TestDatabase {
    let db = embedded_pg::testing::database()
        .await
        .expect("test database");
    children(&db.config, &role_of(&db.name)).await;
    db
}

async fn lists_answer_every_key<D: Driver>(config: &tokio_postgres::Config, db: &str) {
    let ctx = D::NAME;
    let driver = D::open(config).await;
    let lists = driver.lists();
    let got = lists.load_many([1, 2, 3, 5, 6, 99]).await;
    assert_eq!(
        got[0].as_ref().unwrap(),
        &Some(vec![]),
        "{ctx}: no children"
    );
    assert_eq!(
        got[1].as_ref().unwrap(),
        &Some(vec![child(22), child(21)]),
        "{ctx}"
    );
    assert_eq!(
        got[2].as_ref().unwrap(),
        &Some(vec![child(31), child(32), child(33)]),
        "{ctx}"
    );
    let ties: Vec<i64> = got[3]
        .as_ref()
        .unwrap()
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.0)
        .collect();
    assert_eq!(
        ties,
        [51, 52, 53, 54, 55, 56, 57],
        "{ctx}: ties broken by id"
    );
    let bad = got[4].as_ref().unwrap_err().to_string();
    assert!(bad.contains("the row of key 6 did not map"), "{ctx}: {bad}");
    assert_eq!(
        got[5].as_ref().unwrap(),
        &Some(vec![]),
        "{ctx}: no such parent"
    );
    assert_eq!(lists.stats().batches, 1, "{ctx}: one statement");

    // Through the cache: a list per key; invalidating the parent drops it.
    let cache = Cache::builder()
        .admission(Admission::Always)
        .build_with_batcher(lists.clone())
        .unwrap();
    assert_eq!(cache.get(2).await.unwrap().unwrap().len(), 2, "{ctx}");
    assert_eq!(
        cache.get_if_present(&2).await.map(|l| l.unwrap().len()),
        Some(2)
    );
    cache.invalidate(&2).await;
    assert_eq!(cache.get_if_present(&2).await, None, "{ctx}");

    // As a scope under row-level security: each tenant's children only.
    let scoped = driver.scoped_lists();
    let odd = scoped.load_many_as(&tenant(db, 1), [4, 5]).await;
    let ids = |r: &Result<Option<Vec<Child>>, pgbatch::Error>| -> Vec<i64> {
        r.as_ref()
            .unwrap()
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.0)
            .collect()
    };
    assert_eq!(ids(&odd[0]), [43, 41], "{ctx}");
    assert_eq!(ids(&odd[1]), [51, 53, 55, 57], "{ctx}");
    let even = scoped.load_as(&tenant(db, 0), 4).await;
    assert_eq!(ids(&even), [44, 42], "{ctx}");
}

#[tokio::test]
async fn a_key_lists_every_row_in_order_and_a_parent_with_none_an_empty_list() {
    let db = database().await;
    lists_answer_every_key::<TokioPostgres>(&db.config, &db.name).await;
    lists_answer_every_key::<Sqlx>(&db.config, &db.name).await;
}

/// Walks `parent`'s pages of `size` from the first: every child's id, and
/// how many pages it took.
async fn walk(
    pages: &Batcher<PageKey<i64>, Page<Child>>,
    sql: &PageSql,
    parent: i64,
    size: u32,
) -> (Vec<i64>, usize) {
    let (mut ids, mut count, mut after): (Vec<i64>, usize, Option<Cursor>) = (Vec::new(), 0, None);
    loop {
        let key = sql
            .key(parent, size, after.as_ref().map(Cursor::as_str))
            .unwrap();
        let page = pages.load(key).await.unwrap().unwrap();
        count += 1;
        ids.extend(page.items.iter().map(|c| c.0));
        if !page.has_next_page {
            assert!(page.items.len() <= size as usize);
            return (ids, count);
        }
        assert_eq!(
            page.items.len(),
            size as usize,
            "a page before the last is full"
        );
        after = page.end_cursor().cloned();
    }
}

async fn pages_start_at_their_cursors<D: Driver>(config: &tokio_postgres::Config, db: &str) {
    let ctx = D::NAME;
    let driver = D::open(config).await;
    let sql = page_sql("pos");
    let pages = driver.pages(sql.clone());
    // First pages of three, and a second page, all in one statement.
    let second_of_4 = Cursor::new(["3", "42"]);
    let keys = vec![
        sql.key(1, 3, None).unwrap(),
        sql.key(2, 3, None).unwrap(),
        sql.key(3, 3, None).unwrap(),
        sql.key(4, 3, None).unwrap(),
        sql.key(4, 1, Some(second_of_4.as_str())).unwrap(),
        sql.key(5, 2, None).unwrap(),
    ];
    let got: Vec<Page<Child>> = pages
        .load_many(keys)
        .await
        .into_iter()
        .map(|p| p.unwrap().unwrap())
        .collect();
    assert_eq!(
        pages.stats().batches,
        1,
        "{ctx}: one statement for every shape"
    );
    assert_eq!(got[0], Page::default(), "{ctx}: no children");
    assert_eq!(got[1].items, [child(22), child(21)], "{ctx}");
    assert!(!got[1].has_next_page, "{ctx}: fewer than a page");
    assert_eq!(got[2].items, [child(31), child(32), child(33)], "{ctx}");
    assert!(!got[2].has_next_page, "{ctx}: exactly a page");
    assert_eq!(got[3].items, [child(44), child(43), child(42)], "{ctx}");
    assert!(got[3].has_next_page, "{ctx}: one more than a page");
    assert_eq!(got[3].cursors.len(), 3);
    assert_eq!(got[3].end_cursor(), Some(&second_of_4), "{ctx}");
    assert_eq!(got[4].items, [child(41)], "{ctx}: after the cursor");
    assert!(!got[4].has_next_page);
    assert_eq!(got[5].items, [child(51), child(52)], "{ctx}: ties by id");

    // Walking the ties page by page reads every child once, in order.
    for size in [1, 2, 3, 7, 10] {
        let (ids, count) = walk(&pages, &sql, 5, size).await;
        assert_eq!(ids, [51, 52, 53, 54, 55, 56, 57], "{ctx}: pages of {size}");
        assert_eq!(
            count,
            7usize.div_ceil(size as usize),
            "{ctx}: pages of {size}"
        );
    }

    // A row that does not map fails its own key's page.
    let mixed = pages
        .load_many([sql.key(6, 3, None).unwrap(), sql.key(3, 1, None).unwrap()])
        .await;
    let bad = mixed[0].as_ref().unwrap_err().to_string();
    assert!(bad.contains("did not map"), "{ctx}: {bad}");
    assert_eq!(
        mixed[1].as_ref().unwrap().as_ref().unwrap().items,
        [child(31)]
    );

    // An order column that does not exist: the database's error, naming it.
    let missing = page_sql("no_such_column");
    let err = driver
        .pages(missing.clone())
        .load(missing.key(3, 3, None).unwrap())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no_such_column"), "{ctx}: {err}");
    assert!(!err.is_retryable(), "{ctx}");

    // As a scope: each tenant pages through its own children.
    let scoped = driver.scoped_pages(sql.clone());
    let odd = scoped
        .load_as(&tenant(db, 1), sql.key(5, 3, None).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(odd.items, [child(51), child(53), child(55)], "{ctx}");
    assert!(odd.has_next_page);
    let next = sql.key(5, 3, odd.end_cursor().map(Cursor::as_str)).unwrap();
    let rest = scoped.load_as(&tenant(db, 1), next).await.unwrap().unwrap();
    assert_eq!(rest.items, [child(57)], "{ctx}");
    assert!(!rest.has_next_page);

    // Through the cache over the scoped batcher: a page per key and scope.
    let cache = Cache::builder()
        .admission(Admission::Always)
        .build_with_batcher(scoped.clone())
        .unwrap();
    let key = sql.key(4, 2, None).unwrap();
    let even = cache
        .get_as(&tenant(db, 0), key.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(even.items, [child(44), child(42)], "{ctx}");
    assert_eq!(cache.get_if_present_as(&tenant(db, 1), &key).await, None);
    assert!(cache
        .get_if_present_as(&tenant(db, 0), &key)
        .await
        .is_some());
}

#[tokio::test]
async fn pages_of_every_parent_start_at_their_cursors_in_one_statement() {
    let db = database().await;
    pages_start_at_their_cursors::<TokioPostgres>(&db.config, &db.name).await;
    pages_start_at_their_cursors::<Sqlx>(&db.config, &db.name).await;
}

/// What a client sends as a page's size and cursor cannot fail other
/// clients' pages, read a page of another statement, or reach the
/// database unchecked.
async fn bad_page_input_fails_its_own_key<D: Driver>(config: &tokio_postgres::Config) {
    let ctx = D::NAME;
    let driver = D::open(config).await;
    let sql = page_sql("pos");
    let pages = driver.pages(sql.clone());
    // Refused before any read: a value not of its column's type.
    assert!(
        matches!(
            sql.key(4, 2, Some(Cursor::new(["1", "x"]).as_str())),
            Err(pgbatch::db::PageError::BadCursorValue(c)) if c == "id"
        ),
        "{ctx}"
    );
    // A value of the right form the database still refuses (an int out of
    // range for `int`): only its own key fails; the others in its load
    // are answered.
    let forged = sql
        .key(4, 2, Some(Cursor::new(["99999999999", "42"]).as_str()))
        .err();
    assert!(
        forged.is_some(),
        "{ctx}: out of range for int, refused here"
    );
    let cast = PageSql::builder("children")
        .parent("parent_id", "bigint")
        .columns(["id", "body"])
        .order_by("created", "date")
        .order_by("id", "bigint")
        .build()
        .unwrap();
    let by_date = driver.pages(cast.clone());
    let got = by_date
        .load_many([
            cast.key(3, 2, Some(Cursor::new(["2024-99-99", "1"]).as_str()))
                .unwrap(),
            cast.key(2, 2, None).unwrap(),
        ])
        .await;
    assert!(got[0].is_err(), "{ctx}: the forger's page fails");
    assert_eq!(
        got[1].as_ref().unwrap().as_ref().unwrap().items,
        [child(22), child(21)],
        "{ctx}: the other's is answered"
    );
    // A key made by another statement fails alone.
    let other = page_sql("id");
    let mixed = pages
        .load_many([other.key(3, 1, None).unwrap(), sql.key(3, 1, None).unwrap()])
        .await;
    let err = mixed[0].as_ref().unwrap_err().to_string();
    assert!(err.contains("another page statement"), "{ctx}: {err}");
    assert_eq!(
        mixed[1].as_ref().unwrap().as_ref().unwrap().items,
        [child(31)]
    );
    // A NULL order column fails its own key: no cursor can name its place.
    let by_rank = PageSql::builder("children")
        .parent("parent_id", "bigint")
        .columns(["id", "body"])
        .order_by("rank", "int")
        .order_by("id", "bigint")
        .build()
        .unwrap();
    let nulls = driver.pages(by_rank.clone());
    let got = nulls
        .load_many([
            by_rank.key(4, 5, None).unwrap(),
            by_rank.key(2, 5, None).unwrap(),
        ])
        .await;
    let err = got[0].as_ref().unwrap_err().to_string();
    assert!(err.contains("NULL"), "{ctx}: {err}");
    assert_eq!(got[1].as_ref().unwrap().as_ref().unwrap().items.len(), 2);
}

#[tokio::test]
async fn bad_page_input_is_refused_or_fails_its_own_key_alone() {
    for (bad, what) in [
        ("bigint) OR (true", "an expression"),
        ("int; DROP TABLE x", "a statement"),
        ("(SELECT 1)", "a subquery"),
        ("double x", "an unknown type of two words"),
    ] {
        let built = PageSql::builder("children")
            .parent("parent_id", "bigint")
            .columns(["id"])
            .order_by("id", bad)
            .build();
        assert!(
            matches!(built, Err(pgbatch::db::PageError::BadType(_))),
            "{what}: {built:?}"
        );
    }
    for fine in [
        "bigint",
        "timestamp with time zone",
        "numeric(10, 2)",
        "public.my_type",
        "text[]",
    ] {
        assert!(
            PageSql::builder("children")
                .parent("parent_id", "bigint")
                .columns(["id"])
                .order_by("id", fine)
                .build()
                .is_ok(),
            "{fine}"
        );
    }
    let db = database().await;
    bad_page_input_fails_its_own_key::<TokioPostgres>(&db.config).await;
    bad_page_input_fails_its_own_key::<Sqlx>(&db.config).await;
}
