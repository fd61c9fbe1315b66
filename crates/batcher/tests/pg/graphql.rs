//! The GraphQL example (`examples/graphql.rs`) against a real server: the
//! N+1 author lookups of one query become a few batched loads, each
//! tenant reads only its own rows and cached authors, a second query is
//! served from the cache, and bad input is a GraphQL error.

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

/// `query` as tenant `tenant`.
fn as_tenant(query: &str, tenant: i64) -> async_graphql::Request {
    async_graphql::Request::new(query).data(example::tenant_scope(tenant).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_query_s_author_lookups_become_a_few_batched_loads() {
    let (schema, _db) = schema().await;
    let response = schema
        .execute(as_tenant(
            "{ books(first: 400) { id title author { id name } } }",
            1,
        ))
        .await;
    assert!(response.errors.is_empty(), "{:?}", response.errors);
    let data = response.data.into_json().unwrap();
    let books = data["books"].as_array().unwrap();
    assert_eq!(books.len(), 400);
    for book in books {
        let id = book["id"].as_i64().unwrap();
        let author = 1 + (id * 7919) % 300;
        assert_eq!(
            example::tenant_of(author),
            1,
            "tenant 1's books alone: {book}"
        );
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
        .execute(as_tenant("{ books(first: 400) { author { name } } }", 1))
        .await;
    assert!(again.errors.is_empty(), "{:?}", again.errors);
    assert_eq!(loaders(&schema).author_loads.stats().batches, stats.batches);
    assert!(loaders(&schema).authors.stats().hits >= 400);

    // The API reports the same.
    let reported = schema
        .execute(as_tenant("{ authorLoads { requests loads cacheHits } }", 1))
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
    let response = schema
        .execute(as_tenant("{ books(first: 100000) { id } }", 0))
        .await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_at_once_each_get_their_own_books_and_authors() {
    let (schema, _db) = schema().await;
    let queries = (0..example::TENANTS).map(|tenant| {
        let schema = schema.clone();
        tokio::spawn(async move {
            let query = "{ books(first: 300) { id author { id } } }";
            (tenant, schema.execute(as_tenant(query, tenant)).await)
        })
    });
    for query in queries.collect::<Vec<_>>() {
        let (tenant, response) = query.await.unwrap();
        assert!(response.errors.is_empty(), "{:?}", response.errors);
        let data = response.data.into_json().unwrap();
        let books = data["books"].as_array().unwrap();
        assert!(!books.is_empty());
        for book in books {
            let author = book["author"]["id"].as_i64().expect("an author");
            assert_eq!(example::tenant_of(author), tenant, "{book}");
        }
    }
    // The cache keeps each tenant's authors: an author of tenant 2 is
    // not one tenant 1 may read.
    let loaders = loaders(&schema);
    let tenant_1 = example::tenant_scope(1).unwrap();
    let of_tenant_2 = 2;
    assert_eq!(example::tenant_of(of_tenant_2), 2);
    assert!(loaders
        .authors
        .get_as(&tenant_1, of_tenant_2)
        .await
        .unwrap()
        .is_none());
}

/// `{ authors { books(first: 5, after: ...) { reviews(first: 3) } } }`:
/// each level is one statement for every parent of the level, and a
/// book's next page starts where the last ended. On one thread, as the
/// example's `--once` runs, so that a busy machine cannot hold the
/// request's task up past the gathering delay.
#[tokio::test]
async fn each_level_of_pages_is_one_statement_for_the_whole_query() {
    let (schema, _db) = schema().await;
    let query = "{ authors(first: 20) { id books(first: 5) { \
                   pageInfo { hasNextPage endCursor } \
                   nodes { id title reviews(first: 3) { nodes { id stars } pageInfo { hasNextPage } } } } } }";
    let response = schema.execute(as_tenant(query, 1)).await;
    assert!(response.errors.is_empty(), "{:?}", response.errors);
    let loaders = loaders(&schema);
    let (books, reviews) = (
        loaders.book_pages.stats().batches,
        loaders.review_pages.stats().batches,
    );
    assert_eq!((books, reviews), (1, 1), "one statement per level");
    let data = response.data.into_json().unwrap();
    let authors = data["authors"].as_array().unwrap();
    assert_eq!(authors.len(), 20);
    let mut with_more = None;
    for author in authors {
        let id = author["id"].as_i64().unwrap();
        assert_eq!(example::tenant_of(id), 1, "{author}");
        let page = &author["books"];
        let nodes = page["nodes"].as_array().unwrap();
        assert!(nodes.len() <= 5);
        let ids: Vec<i64> = nodes.iter().map(|b| b["id"].as_i64().unwrap()).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "by id: {ids:?}");
        for book in nodes {
            let reviews = book["reviews"]["nodes"].as_array().unwrap();
            assert!(reviews.len() <= 3);
            let stars: Vec<i64> = reviews
                .iter()
                .map(|r| r["stars"].as_i64().unwrap())
                .collect();
            assert!(
                stars.windows(2).all(|w| w[0] >= w[1]),
                "most stars first: {stars:?}"
            );
        }
        if page["pageInfo"]["hasNextPage"] == true {
            with_more = Some((id, ids, page["pageInfo"]["endCursor"].clone()));
        }
    }
    // The next page of an author with more: after the last book of the
    // first, no book twice.
    let (author, first_ids, cursor) = with_more.expect("an author with more than 5 books");
    let next = format!(
        "{{ authors(first: 20) {{ id books(first: 5, after: {cursor}) {{ nodes {{ id }} }} }} }}"
    );
    let response = schema.execute(as_tenant(&next, 1)).await;
    assert!(response.errors.is_empty(), "{:?}", response.errors);
    let data = response.data.into_json().unwrap();
    let page = data["authors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == author)
        .unwrap()["books"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_i64().unwrap())
        .collect::<Vec<_>>();
    assert!(!page.is_empty());
    assert!(
        page[0] > *first_ids.last().unwrap(),
        "{first_ids:?} then {page:?}"
    );
    assert_eq!(loaders.book_pages.stats().batches, 2, "still one statement");

    // Bad input is a GraphQL error naming it, never a database read.
    for (args, says) in [
        ("first: 0", "at least one item"),
        ("first: 51", "at most 50 items"),
        (r#"first: 5, after: "garbage""#, "cursor does not decode"),
    ] {
        let bad = format!("{{ authors(first: 1) {{ books({args}) {{ nodes {{ id }} }} }} }}");
        let response = schema.execute(as_tenant(&bad, 1)).await;
        let error = response.errors.first().expect("an error");
        assert!(error.message.contains(says), "{args}: {error:?}");
    }
    assert_eq!(loaders.book_pages.stats().batches, 2);
}
