//! The GraphQL example (`examples/graphql.rs`) against a real server: the
//! N+1 author lookups of one query become a few batched loads, a second
//! query is served from the cache, and bad input is a GraphQL error.

#[allow(dead_code)] // the example's `main` is not run here
#[path = "../../examples/graphql.rs"]
mod example;

use pgbatch::pg::{self, PoolOptions};

async fn schema() -> (example::BooksSchema, embedded_pg::testing::TestDatabase) {
    let db = embedded_pg::testing::database()
        .await
        .expect("test database");
    let pool = pg::pool(db.config.clone(), &PoolOptions::with_max_size(4)).unwrap();
    example::setup(&pool, 300).await.unwrap();
    (example::schema(pool).unwrap(), db)
}

fn loaders(schema: &example::BooksSchema) -> &example::Loaders {
    schema
        .data::<example::Loaders>()
        .expect("the schema holds its loaders")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_query_s_author_lookups_become_a_few_batched_loads() {
    let (schema, _db) = schema().await;
    let response = schema
        .execute("{ books(first: 400) { id title author { id name } } }")
        .await;
    assert!(response.errors.is_empty(), "{:?}", response.errors);
    let data = response.data.into_json().unwrap();
    let books = data["books"].as_array().unwrap();
    assert_eq!(books.len(), 400);
    for book in books {
        let id = book["id"].as_i64().unwrap();
        let author = 1 + (id * 7919) % 300;
        assert_eq!(book["title"], format!("book {id}"));
        assert_eq!(book["author"]["id"], author, "{book}");
        assert_eq!(book["author"]["name"], format!("author {author}"), "{book}");
    }
    let stats = loaders(&schema).author_loads.stats();
    let distinct = books
        .iter()
        .map(|b| b["author"]["id"].as_i64().unwrap())
        .collect::<std::collections::HashSet<_>>()
        .len() as u64;
    assert_eq!(stats.found, distinct, "each author loaded once: {stats:?}");
    assert!(
        stats.batches <= distinct / 10,
        "{distinct} authors in {} loads, not one query per book",
        stats.batches
    );

    // The same query again: every author from the cache.
    let again = schema
        .execute("{ books(first: 400) { author { name } } }")
        .await;
    assert!(again.errors.is_empty(), "{:?}", again.errors);
    assert_eq!(loaders(&schema).author_loads.stats().batches, stats.batches);
    assert!(loaders(&schema).authors.stats().hits >= 400);

    // The API reports the same.
    let reported = schema
        .execute("{ authorLoads { requests loads cacheHits } }")
        .await
        .data
        .into_json()
        .unwrap();
    assert_eq!(reported["authorLoads"]["loads"], stats.batches);
    assert_eq!(reported["authorLoads"]["requests"], stats.requests);
}

#[tokio::test]
async fn an_out_of_range_argument_is_a_graphql_error_naming_it() {
    let (schema, _db) = schema().await;
    let response = schema.execute("{ books(first: 100000) { id } }").await;
    let error = response.errors.first().expect("an error");
    assert!(
        error.message.contains("`first` must be between 1 and 500"),
        "{error:?}"
    );
    let code = error
        .extensions
        .as_ref()
        .and_then(|e| e.get("code"))
        .cloned();
    assert_eq!(code, Some(async_graphql::Value::from("BAD_USER_INPUT")));
}
