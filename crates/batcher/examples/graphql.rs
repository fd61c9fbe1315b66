//! GraphQL resolvers that load through pgbatch: `{ books { author { name } } }`
//! asks for one author per book (the N+1 problem), and the authors'
//! resolver asks a cache in front of a batcher, so the database sees a few
//! `SELECT ... WHERE id = ANY($1)` instead of one query per book, with the
//! batcher's self-tuned concurrency, its deadlines and load shedding.
//!
//! It creates and fills two tables, `pgbatch_example_authors` and
//! `pgbatch_example_books`, in the database `DATABASE_URL` names (and
//! leaves them), so point it at a scratch database:
//!
//! ```sh
//! DATABASE_URL='host=/var/run/postgresql user=postgres dbname=scratch' \
//!     cargo run -p pgbatch --features postgres,cache --example graphql
//! curl -s 127.0.0.1:8000/graphql -H 'content-type: application/json' \
//!     -d '{"query": "{ books(first: 100) { title author { name } } }"}'
//! curl -s 127.0.0.1:8000/graphql -H 'content-type: application/json' \
//!     -d '{"query": "{ authorLoads { requests loads cacheHits } }"}'
//! ```
//!
//! Compared with async-graphql's own `DataLoader` (a 1 ms delay, batches of
//! up to 1,000, no bound on loads at once), see BENCHMARKS.md's DataLoader
//! section and `cargo run --release -p benches --bin dataloader`.

use std::time::Duration;

use async_graphql::{
    ComplexObject, Context, EmptyMutation, EmptySubscription, ErrorExtensions as _, Object, Schema,
    SimpleObject,
};
use pgbatch::cache::Cache;
use pgbatch::pg::tokio_postgres::{Error as PgDriverError, Row};
use pgbatch::pg::{self, BatchQuery, Lease, Params, PgLoader, Pool, PoolOptions};
use pgbatch::Batcher;

/// An author, as the API shows it.
#[derive(Debug, Clone, SimpleObject)]
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

/// Authors by id: one statement for a batch of ids.
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
/// the cache are shared by every request in flight.
pub(crate) struct Loaders {
    /// Authors by id: a cache in front of a batcher.
    pub(crate) authors: Cache<i64, Author>,
    /// The batcher under the cache, for its stats.
    pub(crate) author_loads: Batcher<i64, Author>,
    pool: Pool,
}

/// The API's schema.
pub(crate) type BooksSchema = Schema<QueryRoot, EmptyMutation, EmptySubscription>;

/// The query root.
pub(crate) struct QueryRoot;

/// The most books one query may ask for.
const MAX_FIRST: i32 = 500;

#[Object]
impl QueryRoot {
    /// The first `first` books by id (1 to 500).
    async fn books(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 20)] first: i32,
    ) -> async_graphql::Result<Vec<Book>> {
        if !(1..=MAX_FIRST).contains(&first) {
            return Err(async_graphql::Error::new(format!(
                "`first` must be between 1 and {MAX_FIRST}, got {first}"
            ))
            .extend_with(|_, e| e.set("code", "BAD_USER_INPUT")));
        }
        let loaders = ctx.data::<Loaders>()?;
        let lease = Lease::get(&loaders.pool)
            .await
            .map_err(|e| database_error(&pg::PgError::from(e)))?;
        let rows = lease
            .query(
                "SELECT id, title, author_id FROM pgbatch_example_books ORDER BY id LIMIT $1",
                &[&i64::from(first)],
            )
            .await;
        lease.settle(&rows);
        let rows = rows.map_err(|e| database_error(&pg::PgError::from(e)))?;
        Ok(rows
            .iter()
            .map(|row| Book {
                id: row.get(0),
                title: row.get(1),
                author_id: row.get(2),
            })
            .collect())
    }

    /// How the authors' lookups went so far.
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
impl Book {
    /// The book's author: one key, answered from the cache or from a
    /// batched load shared with every other book being resolved.
    async fn author(&self, ctx: &Context<'_>) -> async_graphql::Result<Option<Author>> {
        let loaders = ctx.data::<Loaders>()?;
        loaders
            .authors
            .get(self.author_id)
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

/// The schema over `pool`: the authors' batcher at its defaults (the
/// automatic concurrency limit, at most the pool's size) behind a cache.
///
/// # Errors
///
/// When a setting is invalid.
pub(crate) fn schema(pool: Pool) -> Result<BooksSchema, pgbatch::BuildError> {
    let author_loads = Batcher::builder()
        .name("authors")
        .concurrency(pgbatch::Concurrency::Auto {
            max: pool.status().max_size,
        })
        .timeout(Duration::from_secs(2))
        .build(PgLoader::new(pool.clone(), AuthorsById))?;
    let authors = Cache::builder()
        .name("authors")
        .max_capacity(100_000)
        .time_to_live(Duration::from_secs(30))
        .build_with_batcher(author_loads.clone())?;
    Ok(Schema::build(QueryRoot, EmptyMutation, EmptySubscription)
        // Bounds on what one request may ask of the database.
        .limit_depth(8)
        .limit_complexity(5_000)
        .data(Loaders {
            authors,
            author_loads,
            pool,
        })
        .finish())
}

/// Creates the example's tables and fills them (`authors` authors, 20
/// books each) if they are empty.
///
/// # Errors
///
/// When the database fails.
pub(crate) async fn setup(pool: &Pool, authors: i64) -> Result<(), Box<dyn std::error::Error>> {
    pool.get()
        .await?
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS pgbatch_example_authors (
                 id bigint PRIMARY KEY, name text NOT NULL);
             CREATE TABLE IF NOT EXISTS pgbatch_example_books (
                 id bigint PRIMARY KEY, title text NOT NULL,
                 author_id bigint NOT NULL REFERENCES pgbatch_example_authors (id));
             INSERT INTO pgbatch_example_authors
                 SELECT n, 'author ' || n FROM generate_series(1, {authors}) n
                 ON CONFLICT DO NOTHING;
             INSERT INTO pgbatch_example_books
                 SELECT n, 'book ' || n, 1 + (n * 7919) % {authors}
                 FROM generate_series(1, {authors} * 20) n
                 ON CONFLICT DO NOTHING;"
        ))
        .await?;
    Ok(())
}

#[allow(dead_code)] // the example's tests include this file and run no `main`
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .ok_or("set DATABASE_URL to a scratch database (see the example's docs)")?;
    let pool = pg::pool(url.parse()?, &PoolOptions::with_max_size(8))?;
    setup(&pool, 1_000).await?;
    let schema = schema(pool)?;

    let app =
        axum::Router::new().route_service("/graphql", async_graphql_axum::GraphQL::new(schema));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8000").await?;
    println!("GraphQL on http://{}/graphql", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
