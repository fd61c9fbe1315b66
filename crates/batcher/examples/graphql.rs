//! GraphQL resolvers that load through pgbatch, per tenant:
//! `{ books { author { name } } }` asks for one author per book (the N+1
//! problem), and the authors' resolver asks a cache in front of a batcher,
//! so the database sees a few `SELECT ... WHERE id = ANY($1)` instead of
//! one query per book. `{ authors { books(first: 5, after: ...) {
//! reviews(first: 3) } } }` asks for a page of books per author and a page
//! of reviews per book: each level is one statement for every parent of
//! the level (`pgbatch::pg::PgLoader::pages`: a `LATERAL` page per parent,
//! keyset cursors, one row more to tell whether a next page exists). The batcher and the cache are shared by every
//! request; each request says who it reads as (its tenant: a [`Scope`]),
//! each load runs as one tenant under row-level security, and a tenant's
//! cached authors are its own.
//!
//! The scope comes from the request: here the `x-tenant` header, in a real
//! service the verified token (its role and claims as the scope's role and
//! settings). The handler puts it in the request's data, and every
//! resolver loads with it: `cache.get_as(scope, id)`.
//!
//! It creates a role `pgbatch_example_reader` (granted to the connecting
//! user, which needs the right to create roles) and two tables,
//! `pgbatch_example_authors` and `pgbatch_example_books`, under a
//! per-tenant policy, in the database `DATABASE_URL` names (and leaves
//! them), so point it at a scratch database:
//!
//! ```sh
//! DATABASE_URL='host=/var/run/postgresql user=postgres dbname=scratch' \
//!     cargo run -p pgbatch --features postgres,cache --example graphql
//! curl -s 127.0.0.1:8000/graphql -H 'x-tenant: 1' -H 'content-type: application/json' \
//!     -d '{"query": "{ books(first: 100) { title author { name } } }"}'
//! curl -s 127.0.0.1:8000/graphql -H 'x-tenant: 1' -H 'content-type: application/json' \
//!     -d '{"query": "{ authorLoads { requests loads cacheHits } }"}'
//! # or: run two tenants' queries in process, print what they took, exit
//! cargo run -p pgbatch --features postgres,cache --example graphql -- --once
//! ```
//!
//! It listens on `GRAPHQL_ADDR` (or `--addr`), 127.0.0.1:8000 by default,
//! and stops on Ctrl-C. Compared with async-graphql's own `DataLoader` (a
//! 1 ms delay, batches of up to 1,000, no bound on loads at once, and one
//! loader per request where requests must not share), see BENCHMARKS.md's
//! DataLoader section and `cargo run --release -p benches --bin dataloader`.

use std::sync::LazyLock;
use std::time::Duration;

use async_graphql::{
    ComplexObject, Context, EmptyMutation, EmptySubscription, ErrorExtensions as _, Object, Schema,
    SimpleObject,
};
use pgbatch::cache::{Admission, Cache};
use pgbatch::pg::tokio_postgres::{Error as PgDriverError, Row};
use pgbatch::pg::{
    self, BatchQuery, Page, PageKey, PageQuery, PageSql, Params, PgLoader, Pool, PoolOptions,
    Scope, ScopedPgLoader, Sql,
};
use pgbatch::Batcher;

/// An author, as the API shows it; its books are resolved on demand.
#[derive(Debug, Clone, SimpleObject)]
#[graphql(complex)]
pub(crate) struct Author {
    /// The author's id.
    pub(crate) id: i64,
    /// The author's name.
    pub(crate) name: String,
}

/// A book; its author is resolved on demand.
#[derive(Debug, Clone, SimpleObject)]
#[graphql(complex)]
pub(crate) struct Book {
    /// The book's id.
    pub(crate) id: i64,
    /// Its title.
    pub(crate) title: String,
    #[graphql(skip)]
    pub(crate) author_id: i64,
}

/// A review of a book.
#[derive(Debug, Clone, SimpleObject)]
pub(crate) struct Review {
    /// The review's id.
    pub(crate) id: i64,
    /// Its stars, 1 to 5.
    pub(crate) stars: i32,
}

/// Where a page ended, as GraphQL connections say it.
#[derive(Debug, Clone, SimpleObject)]
pub(crate) struct PageInfo {
    /// Whether the parent has more after this page.
    pub(crate) has_next_page: bool,
    /// Pass as `after` for the next page.
    pub(crate) end_cursor: Option<String>,
}

/// A page of an author's books.
#[derive(Debug, Clone, SimpleObject)]
pub(crate) struct BookPage {
    /// The books, by id.
    pub(crate) nodes: Vec<Book>,
    /// Where the page ended.
    pub(crate) page_info: PageInfo,
}

/// A page of a book's reviews.
#[derive(Debug, Clone, SimpleObject)]
pub(crate) struct ReviewPage {
    /// The reviews, most stars first (ties by id).
    pub(crate) nodes: Vec<Review>,
    /// Where the page ended.
    pub(crate) page_info: PageInfo,
}

fn page_info<V>(page: &Page<V>) -> PageInfo {
    PageInfo {
        has_next_page: page.has_next_page,
        end_cursor: page.end_cursor().map(|c| c.as_str().to_owned()),
    }
}

/// Each author's books, by id: a page per author, every author of a
/// request in one statement.
struct BooksOfAuthor(PageSql);

impl PageQuery for BooksOfAuthor {
    type Parent = i64;
    type Value = Book;

    fn page_sql(&self) -> &PageSql {
        &self.0
    }
    fn map_row(&self, row: &Row) -> Result<Book, PgDriverError> {
        Ok(Book {
            id: row.try_get(0)?,
            title: row.try_get(1)?,
            author_id: row.try_get(2)?,
        })
    }
}

/// Each book's reviews, most stars first.
struct ReviewsOfBook(PageSql);

impl PageQuery for ReviewsOfBook {
    type Parent = i64;
    type Value = Review;

    fn page_sql(&self) -> &PageSql {
        &self.0
    }
    fn map_row(&self, row: &Row) -> Result<Review, PgDriverError> {
        Ok(Review {
            id: row.try_get(0)?,
            stars: row.try_get(1)?,
        })
    }
}

/// The most items of one page.
pub(crate) const MAX_PAGE: u32 = 50;

/// Authors by id: one statement for a batch of ids. It names no tenant:
/// the policy keeps each tenant to its own rows.
struct AuthorsById;

impl BatchQuery for AuthorsById {
    type Key = i64;
    type Value = Author;

    fn batch_sql(&self) -> &str {
        "SELECT id, name FROM pgbatch_example_authors WHERE id = ANY($1)"
    }
    fn batch_params<'a>(&self, keys: &'a [i64]) -> Params<'a> {
        vec![Box::new(keys)]
    }
    fn map_row(&self, row: &Row) -> Result<(i64, Author), PgDriverError> {
        let id = row.try_get(0)?;
        Ok((
            id,
            Author {
                id,
                name: row.try_get(1)?,
            },
        ))
    }
}

/// Statements the page loaders sent.
#[derive(Debug, Clone, SimpleObject)]
pub(crate) struct PageLoads {
    /// Pages of books: one statement per load, every author in it.
    pub(crate) books: u64,
    /// Pages of reviews, likewise.
    pub(crate) reviews: u64,
}

/// How the authors' lookups went so far: what N+1 turned into.
#[derive(Debug, Clone, SimpleObject)]
pub(crate) struct AuthorLoads {
    /// Lookups the batcher received (cache misses).
    pub(crate) requests: u64,
    /// Loads it sent to the database.
    pub(crate) loads: u64,
    /// Loads allowed at once now (the automatic limit).
    pub(crate) concurrency_limit: u64,
    /// Lookups the cache answered.
    pub(crate) cache_hits: u64,
}

/// What the resolvers load through, kept in the schema's data. Built once
/// per process, not per request: the batches, the concurrency limit and
/// the cache are shared by every request in flight, whatever its tenant.
pub(crate) struct Loaders {
    /// Authors by id, per tenant: a cache in front of a scoped batcher.
    pub(crate) authors: Cache<i64, Author, Scope>,
    /// The batcher under the cache, for its stats.
    pub(crate) author_loads: Batcher<i64, Author, Scope>,
    /// The authors' scoped loader, which also runs the root lists as a
    /// tenant.
    as_tenant: ScopedPgLoader<AuthorsById>,
    /// Pages of each author's books and of each book's reviews.
    pub(crate) book_pages: Batcher<PageKey<i64>, Page<Book>, Scope>,
    pub(crate) review_pages: Batcher<PageKey<i64>, Page<Review>, Scope>,
    books_sql: PageSql,
    reviews_sql: PageSql,
}

/// The API's schema.
pub(crate) type BooksSchema = Schema<QueryRoot, EmptyMutation, EmptySubscription>;

/// The query root.
pub(crate) struct QueryRoot;

/// The most books one query may ask for.
const MAX_FIRST: i32 = 500;

/// The books query, run as the request's tenant.
static BOOKS: LazyLock<Sql> = LazyLock::new(|| {
    Sql::new("SELECT id, title, author_id FROM pgbatch_example_books ORDER BY id LIMIT $1")
});

/// The authors query, run as the request's tenant.
static AUTHORS: LazyLock<Sql> =
    LazyLock::new(|| Sql::new("SELECT id, name FROM pgbatch_example_authors ORDER BY id LIMIT $1"));

/// The tenant `tenant`'s scope: the reader role, and the tenant as a
/// transaction-local setting the policies read.
pub(crate) fn tenant_scope(tenant: i64) -> Result<Scope, pg::ScopeError> {
    Scope::builder()
        .label(format!("tenant {tenant}"))
        .role("pgbatch_example_reader")
        .setting("app.tenant", tenant.to_string())
        .build()
}

#[Object]
impl QueryRoot {
    /// The request's tenant's first `first` books by id (1 to 500).
    async fn books(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 20)] first: i32,
    ) -> async_graphql::Result<Vec<Book>> {
        if !(1..=MAX_FIRST).contains(&first) {
            return Err(bad_input(format!(
                "`first` must be between 1 and {MAX_FIRST}, got {first}"
            )));
        }
        let (loaders, scope) = (ctx.data::<Loaders>()?, ctx.data::<Scope>()?);
        // As the tenant, in a transaction of its own: the policy applies.
        let rows = loaders
            .as_tenant
            .query_as(scope, &BOOKS, &[&i64::from(first)])
            .await
            .map_err(|e| database_error(&e))?;
        Ok(rows
            .iter()
            .map(|row| Book {
                id: row.get(0),
                title: row.get(1),
                author_id: row.get(2),
            })
            .collect())
    }

    /// The request's tenant's first `first` authors by id (1 to 500).
    async fn authors(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 20)] first: i32,
    ) -> async_graphql::Result<Vec<Author>> {
        if !(1..=MAX_FIRST).contains(&first) {
            return Err(bad_input(format!(
                "`first` must be between 1 and {MAX_FIRST}, got {first}"
            )));
        }
        let (loaders, scope) = (ctx.data::<Loaders>()?, ctx.data::<Scope>()?);
        let rows = loaders
            .as_tenant
            .query_as(scope, &AUTHORS, &[&i64::from(first)])
            .await
            .map_err(|e| database_error(&e))?;
        Ok(rows
            .iter()
            .map(|row| Author {
                id: row.get(0),
                name: row.get(1),
            })
            .collect())
    }

    /// How many statements each level's pages took so far, all requests
    /// together: one per level of a query is the point.
    async fn page_loads(&self, ctx: &Context<'_>) -> async_graphql::Result<PageLoads> {
        let loaders = ctx.data::<Loaders>()?;
        Ok(PageLoads {
            books: loaders.book_pages.stats().batches,
            reviews: loaders.review_pages.stats().batches,
        })
    }

    /// How the authors' lookups went so far, all tenants together.
    async fn author_loads(&self, ctx: &Context<'_>) -> async_graphql::Result<AuthorLoads> {
        let loaders = ctx.data::<Loaders>()?;
        let batcher = loaders.author_loads.stats();
        Ok(AuthorLoads {
            requests: batcher.requests,
            loads: batcher.batches,
            concurrency_limit: batcher.concurrency_limit,
            cache_hits: loaders.authors.stats().hits,
        })
    }
}

#[ComplexObject]
impl Author {
    /// A page of the author's books, by id: the first `first` (1 to 50)
    /// after the cursor `after`, if given.
    async fn books(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 5)] first: i32,
        after: Option<String>,
    ) -> async_graphql::Result<BookPage> {
        let (loaders, scope) = (ctx.data::<Loaders>()?, ctx.data::<Scope>()?);
        let key = page_key(&loaders.books_sql, self.id, first, after)?;
        let page = loaders
            .book_pages
            .load_as(scope, key)
            .await
            .map_err(|e| lookup_error(&e))?
            .unwrap_or_default();
        Ok(BookPage {
            page_info: page_info(&page),
            nodes: page.items,
        })
    }
}

/// The key of `parent`'s page asked for with `first` and `after`, or a
/// GraphQL error naming what is wrong with them.
fn page_key(
    sql: &PageSql,
    parent: i64,
    first: i32,
    after: Option<String>,
) -> async_graphql::Result<PageKey<i64>> {
    let first = u32::try_from(first).unwrap_or(0);
    sql.key(parent, first, after.as_deref())
        .map_err(|e| bad_input(e.to_string()))
}

/// A GraphQL error for bad input, with the code clients act on.
fn bad_input(message: String) -> async_graphql::Error {
    async_graphql::Error::new(message).extend_with(|_, e| e.set("code", "BAD_USER_INPUT"))
}

#[ComplexObject]
impl Book {
    /// A page of the book's reviews, most stars first (ties by id): the
    /// first `first` (1 to 50) after the cursor `after`, if given.
    async fn reviews(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 3)] first: i32,
        after: Option<String>,
    ) -> async_graphql::Result<ReviewPage> {
        let (loaders, scope) = (ctx.data::<Loaders>()?, ctx.data::<Scope>()?);
        let key = page_key(&loaders.reviews_sql, self.id, first, after)?;
        let page = loaders
            .review_pages
            .load_as(scope, key)
            .await
            .map_err(|e| lookup_error(&e))?
            .unwrap_or_default();
        Ok(ReviewPage {
            page_info: page_info(&page),
            nodes: page.items,
        })
    }

    /// The book's author: one key, as the request's tenant, answered from
    /// the tenant's cache or from a batched load shared with every other
    /// book of the tenant being resolved.
    async fn author(&self, ctx: &Context<'_>) -> async_graphql::Result<Option<Author>> {
        let (loaders, scope) = (ctx.data::<Loaders>()?, ctx.data::<Scope>()?);
        loaders
            .authors
            .get_as(scope, self.author_id)
            .await
            .map_err(|e| lookup_error(&e))
    }
}

/// A lookup's failure as a GraphQL error whose extensions say what a client
/// can do about it: `retryable` (shed load, a lost node) means asking again
/// after a pause may succeed; a `TIMEOUT` is not, as asking again at once
/// adds to what made it slow.
fn lookup_error(e: &pgbatch::Error) -> async_graphql::Error {
    let code = if e.is_overloaded() {
        "OVERLOADED"
    } else if e.is_timeout() {
        "TIMEOUT"
    } else {
        "DATABASE_ERROR"
    };
    let retryable = e.is_retryable();
    async_graphql::Error::new(e.to_string()).extend_with(|_, ext| {
        ext.set("code", code);
        ext.set("retryable", retryable);
    })
}

fn database_error(e: &pg::PgError) -> async_graphql::Error {
    let retryable = e.is_retryable();
    async_graphql::Error::new(e.to_string()).extend_with(|_, ext| {
        ext.set("code", "DATABASE_ERROR");
        ext.set("retryable", retryable);
    })
}

/// The schema over `pool`: the authors' scoped batcher at its defaults (the
/// automatic concurrency limit, at most the pool's size) behind a cache.
///
/// # Errors
///
/// When a setting is invalid.
pub(crate) fn schema(pool: Pool) -> Result<BooksSchema, Box<dyn std::error::Error>> {
    // Every setting the policies read, reset in every load.
    let as_tenant = PgLoader::new(pool.clone(), AuthorsById).scoped(["app.tenant"])?;
    let books_sql = PageSql::builder("pgbatch_example_books")
        .parent("author_id", "bigint")
        .columns(["id", "title", "author_id"])
        .order_by("id", "bigint")
        .max_first(MAX_PAGE)
        .build()?;
    let reviews_sql = PageSql::builder("pgbatch_example_reviews")
        .parent("book_id", "bigint")
        .columns(["id", "stars"])
        .order_by("stars", "int")
        .order_by("id", "bigint")
        .descending()
        .max_first(MAX_PAGE)
        .build()?;
    // A level of a query asks for every parent's page in one poll of its
    // resolvers: a short delay gathers them into one statement, where the
    // eager default would send the first at once and the rest after.
    let book_pages = pages().name("book pages").build_scoped(
        PgLoader::pages(pool.clone(), BooksOfAuthor(books_sql.clone())).scoped(["app.tenant"])?,
    )?;
    let review_pages = pages().name("review pages").build_scoped(
        PgLoader::pages(pool, ReviewsOfBook(reviews_sql.clone())).scoped(["app.tenant"])?,
    )?;
    let author_loads = Batcher::builder()
        .name("authors")
        .concurrency(pgbatch::Concurrency::Auto {
            max: as_tenant.pool().status().max_size,
        })
        .timeout(Duration::from_secs(2))
        .build_scoped(as_tenant.clone())?;
    let authors = Cache::builder()
        .name("authors")
        .max_capacity(100_000)
        .time_to_live(Duration::from_secs(30))
        // One query asks for an author once per book, over several
        // batches: storing every value makes its next books hits. (The
        // default stores a key from its second miss, for key spaces larger
        // than the cache.)
        .admission(Admission::Always)
        .build_with_batcher(author_loads.clone())?;
    Ok(Schema::build(QueryRoot, EmptyMutation, EmptySubscription)
        // Bounds on what one request may ask of the database.
        .limit_depth(8)
        .limit_complexity(5_000)
        .data(Loaders {
            authors,
            author_loads,
            as_tenant,
            book_pages,
            review_pages,
            books_sql,
            reviews_sql,
        })
        .finish())
}

/// A batcher of one level's pages: see [`schema`].
fn pages<V: Clone + Send + 'static>() -> pgbatch::BatcherBuilder<PageKey<i64>, Page<V>> {
    Batcher::builder()
        .policy(pgbatch::FlushPolicy::FixedDelay)
        .max_delay(Duration::from_millis(2))
        .max_batch_size(1_000)
        .timeout(Duration::from_secs(2))
}

/// The tenants the example's data is spread over.
pub(crate) const TENANTS: i64 = 3;

/// Which tenant an author (and so each of its books) belongs to.
pub(crate) fn tenant_of(author: i64) -> i64 {
    author % TENANTS
}

/// Creates the example's role and tables, under their policies, and fills
/// them (`authors` authors, 20 books each, spread over [`TENANTS`]) if they
/// are empty.
///
/// # Errors
///
/// When the database fails.
pub(crate) async fn setup(pool: &Pool, authors: i64) -> Result<(), Box<dyn std::error::Error>> {
    pool.get()
        .await?
        .batch_execute(&format!(
            "DO $$ BEGIN CREATE ROLE pgbatch_example_reader NOLOGIN;
                 EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
             GRANT pgbatch_example_reader TO CURRENT_USER;
             CREATE TABLE IF NOT EXISTS pgbatch_example_authors (
                 id bigint PRIMARY KEY, tenant bigint NOT NULL, name text NOT NULL);
             CREATE TABLE IF NOT EXISTS pgbatch_example_books (
                 id bigint PRIMARY KEY, tenant bigint NOT NULL, title text NOT NULL,
                 author_id bigint NOT NULL REFERENCES pgbatch_example_authors (id));
             INSERT INTO pgbatch_example_authors
                 SELECT n, n % {TENANTS}, 'author ' || n FROM generate_series(1, {authors}) n
                 ON CONFLICT DO NOTHING;
             INSERT INTO pgbatch_example_books
                 SELECT n, (1 + (n * 7919) % {authors}) % {TENANTS}, 'book ' || n,
                        1 + (n * 7919) % {authors}
                 FROM generate_series(1, {authors} * 20) n
                 ON CONFLICT DO NOTHING;
             CREATE INDEX IF NOT EXISTS pgbatch_example_books_by_author
                 ON pgbatch_example_books (author_id, id);
             CREATE TABLE IF NOT EXISTS pgbatch_example_reviews (
                 id bigint PRIMARY KEY, tenant bigint NOT NULL, stars int NOT NULL,
                 book_id bigint NOT NULL REFERENCES pgbatch_example_books (id));
             CREATE INDEX IF NOT EXISTS pgbatch_example_reviews_by_book
                 ON pgbatch_example_reviews (book_id, stars, id);
             INSERT INTO pgbatch_example_reviews
                 SELECT n, b.tenant, 1 + n % 5, b.id
                 FROM generate_series(1, {authors} * 20 * 4) n
                 JOIN pgbatch_example_books b ON b.id = 1 + (n::bigint * 104729) % ({authors} * 20)
                 ON CONFLICT DO NOTHING;
             ALTER TABLE pgbatch_example_authors ENABLE ROW LEVEL SECURITY;
             ALTER TABLE pgbatch_example_books ENABLE ROW LEVEL SECURITY;
             ALTER TABLE pgbatch_example_reviews ENABLE ROW LEVEL SECURITY;
             GRANT SELECT ON pgbatch_example_authors, pgbatch_example_books,
                 pgbatch_example_reviews TO pgbatch_example_reader;
             DROP POLICY IF EXISTS own_authors ON pgbatch_example_authors;
             CREATE POLICY own_authors ON pgbatch_example_authors FOR SELECT
                 TO pgbatch_example_reader
                 USING (tenant = nullif(current_setting('app.tenant', true), '')::bigint);
             DROP POLICY IF EXISTS own_books ON pgbatch_example_books;
             CREATE POLICY own_books ON pgbatch_example_books FOR SELECT
                 TO pgbatch_example_reader
                 USING (tenant = nullif(current_setting('app.tenant', true), '')::bigint);
             DROP POLICY IF EXISTS own_reviews ON pgbatch_example_reviews;
             CREATE POLICY own_reviews ON pgbatch_example_reviews FOR SELECT
                 TO pgbatch_example_reader
                 USING (tenant = nullif(current_setting('app.tenant', true), '')::bigint);"
        ))
        .await?;
    Ok(())
}

/// The GraphQL endpoint: the request's tenant, from its `x-tenant` header
/// (in a real service, its verified token), becomes the scope every
/// resolver of the request loads as.
async fn graphql(
    axum::extract::State(schema): axum::extract::State<BooksSchema>,
    headers: axum::http::HeaderMap,
    request: async_graphql_axum::GraphQLRequest,
) -> async_graphql_axum::GraphQLResponse {
    let tenant = headers
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i64>().ok());
    let Some(scope) = tenant.and_then(|t| tenant_scope(t).ok()) else {
        let error =
            async_graphql::ServerError::new("send your tenant's number as `x-tenant`", None);
        return async_graphql::Response::from_errors(vec![error]).into();
    };
    schema
        .execute(request.into_inner().data(scope))
        .await
        .into()
}

/// Where to listen: `--addr ADDR`, else `GRAPHQL_ADDR`, else 127.0.0.1:8000.
fn listen_address() -> String {
    let mut args = std::env::args().skip_while(|a| a != "--addr").skip(1);
    args.next()
        .or_else(|| std::env::var("GRAPHQL_ADDR").ok())
        .unwrap_or_else(|| "127.0.0.1:8000".to_owned())
}

/// Runs one query for each tenant in process, prints what each got and
/// what their authors' lookups took, and checks that no tenant was given
/// another's author.
async fn once(schema: &BooksSchema) -> Result<(), Box<dyn std::error::Error>> {
    let query = "{ books(first: 200) { id author { id name } } }";
    for tenant in 0..TENANTS {
        let request = async_graphql::Request::new(query).data(tenant_scope(tenant)?);
        let response = schema.execute(request).await;
        if !response.errors.is_empty() {
            return Err(format!("tenant {tenant}: {:?}", response.errors).into());
        }
        let data = response.data.into_json()?;
        let books = data["books"].as_array().cloned().unwrap_or_default();
        for book in &books {
            let author = book["author"]["id"].as_i64().unwrap_or(-1);
            if tenant_of(author) != tenant {
                return Err(format!("tenant {tenant} was given author {author}").into());
            }
        }
        println!(
            "tenant {tenant}: {} books, each with its author",
            books.len()
        );
    }
    // Pages at two levels: each level one statement for all its parents.
    let nested = "{ authors(first: 10) { id books(first: 5) { pageInfo { hasNextPage endCursor } \
                  nodes { id reviews(first: 3) { nodes { stars } } } } } }";
    for tenant in 0..TENANTS {
        let loaders = schema.data::<Loaders>();
        let before =
            loaders.map(|l| (l.book_pages.stats().batches, l.review_pages.stats().batches));
        let response = schema
            .execute(async_graphql::Request::new(nested).data(tenant_scope(tenant)?))
            .await;
        if !response.errors.is_empty() {
            return Err(format!("tenant {tenant}: {:?}", response.errors).into());
        }
        let after = loaders.map(|l| (l.book_pages.stats().batches, l.review_pages.stats().batches));
        if let (Some((b0, r0)), Some((b1, r1))) = (before, after) {
            println!(
                "tenant {tenant}: authors, their books and reviews in statements: 1 for authors, \
                 {} for books, {} for reviews",
                b1 - b0,
                r1 - r0
            );
        }
    }
    let loads = schema.data::<Loaders>().map(|l| l.author_loads.stats());
    if let Some(stats) = loads {
        println!(
            "author lookups: {} requests in {} loads",
            stats.requests, stats.batches
        );
    }
    Ok(())
}

#[allow(dead_code)] // the example's tests include this file and run no `main`
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let once = std::env::args().any(|a| a == "--once");
    // `--once` runs its queries on one thread, where each level's
    // resolvers all ask before the batcher's worker runs again: each level
    // is then one statement however busy the machine is. Serving uses
    // every core; there a level is one statement unless the request's task
    // is held up longer than the pages' 2 ms gathering delay.
    let runtime = if once {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    }
    .enable_all()
    .build()?;
    runtime.block_on(run(once))
}

#[allow(dead_code)] // as `main`
async fn run(once_only: bool) -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .ok_or("set DATABASE_URL to a scratch database (see the example's docs)")?;
    let pool = pg::pool(url.parse()?, &PoolOptions::with_max_size(8))?;
    setup(&pool, 1_000).await?;
    let schema = schema(pool)?;
    if once_only {
        return once(&schema).await;
    }

    let app = axum::Router::new()
        .route("/graphql", axum::routing::post(graphql))
        .with_state(schema);
    let addr = listen_address();
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| format!("could not listen on {addr}: {e}"))?;
    println!("GraphQL on http://{}/graphql", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
