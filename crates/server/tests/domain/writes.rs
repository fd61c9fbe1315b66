//! The write API against a real Postgres: upserts, deletes, NDJSON imports,
//! repositories, permissions, and reads that see acknowledged writes.

use crate::support;

use crate::support::{get, read_path, send, stat_uri, ADMIN_TOKEN, READ_PATHS};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{json, Value};
use server::db::seed::object_path;
use server::settings::{ImportSettings, ReadPath, Settings};

fn req(method: Method, uri: &str, body: impl Into<Body>) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap()
}

fn put(repo: &str, path: &str, body: &Value) -> Request<Body> {
    req(
        Method::PUT,
        &format!("/api/v1/repositories/{repo}/objects?path={path}"),
        body.to_string(),
    )
}

fn object(address: &str, size: i64) -> Value {
    json!({"physical_address": address, "size_bytes": size, "checksum": "abc", "metadata": {"k": "v"}})
}

fn import(repo: &str, policy: &str, ndjson: &str) -> Request<Body> {
    req(
        Method::POST,
        &format!("/api/v1/repositories/{repo}/objects/import?policy={policy}"),
        ndjson.to_owned(),
    )
}

#[tokio::test]
async fn a_read_after_an_acknowledged_write_sees_it_on_every_read_path() {
    let config = support::database().await;
    for path in READ_PATHS {
        let app = support::app_on(&config, &read_path(path)).await;
        let read_path = format!("{path:?}").to_lowercase();
        let path = format!("new/{read_path}.bin");
        // Read first, so the cached path has "not found" (or the old value) loaded.
        assert_eq!(
            send(&app.router, get(&stat_uri("demo", &path))).await.0,
            StatusCode::NOT_FOUND
        );

        let (status, body) = send(&app.router, put("demo", &path, &object("s3://one", 1))).await;
        assert_eq!(status, StatusCode::CREATED, "{read_path}: {body}");
        assert_eq!(body, json!({"path": path, "result": "created"}));
        let (status, body) = send(&app.router, get(&stat_uri("demo", &path))).await;
        assert_eq!(status, StatusCode::OK, "{read_path}");
        assert_eq!(body["physical_address"], "s3://one");
        assert_eq!(body["metadata"], json!({"k": "v"}));

        let (status, body) = send(&app.router, put("demo", &path, &object("s3://two", 2))).await;
        assert_eq!(
            (status, body["result"].clone()),
            (StatusCode::OK, json!("updated"))
        );
        let (_, body) = send(&app.router, get(&stat_uri("demo", &path))).await;
        assert_eq!(
            body["physical_address"], "s3://two",
            "{read_path}: stale read after write"
        );

        let del = req(
            Method::DELETE,
            &format!("/api/v1/repositories/demo/objects?path={path}"),
            "",
        );
        assert_eq!(send(&app.router, del).await.0, StatusCode::NO_CONTENT);
        assert_eq!(
            send(&app.router, get(&stat_uri("demo", &path))).await.0,
            StatusCode::NOT_FOUND,
            "{read_path}"
        );
        let del = req(
            Method::DELETE,
            &format!("/api/v1/repositories/demo/objects?path={path}"),
            "",
        );
        assert_eq!(send(&app.router, del).await.0, StatusCode::NOT_FOUND);
    }
}

#[tokio::test]
async fn bad_writes_get_a_4xx_naming_the_problem() {
    let app = support::setup(&Settings::default()).await;
    let ok = object("s3://x", 1);
    let cases: Vec<(Request<Body>, StatusCode, &str, &str)> = vec![
        (
            put(
                "demo",
                "a",
                &json!({"physical_address": "s3://x", "size_bytes": -1, "checksum": "c"}),
            ),
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "size_bytes",
        ),
        (
            put(
                "demo",
                "a",
                &json!({"physical_address": "s3://x", "size_bytes": 1, "checksum": "c", "metadata": {"n": 1}}),
            ),
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "metadata.n",
        ),
        (
            put(
                "demo",
                "a",
                &json!({"path": "b", "physical_address": "s3://x", "size_bytes": 1, "checksum": "c"}),
            ),
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "query string",
        ),
        (
            put("demo", "a", &json!({"size_bytes": 1})),
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "physical_address",
        ),
        (
            req(
                Method::PUT,
                "/api/v1/repositories/demo/objects?path=a",
                "{not json",
            ),
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "key must be a string",
        ),
        (
            req(
                Method::PUT,
                "/api/v1/repositories/demo/objects",
                ok.to_string(),
            ),
            StatusCode::BAD_REQUEST,
            "missing_path",
            "required",
        ),
        (
            put("demo", "%zz", &ok),
            StatusCode::BAD_REQUEST,
            "invalid_query",
            "percent-encoding",
        ),
        (
            put("nope", "a", &ok),
            StatusCode::NOT_FOUND,
            "repository_not_found",
            "nope",
        ),
        (
            import("demo", "sideways", ""),
            StatusCode::BAD_REQUEST,
            "invalid_policy",
            "skip, overwrite or fail",
        ),
        (
            import(
                "nope",
                "skip",
                r#"{"path":"a","physical_address":"x","size_bytes":1,"checksum":"c"}"#,
            ),
            StatusCode::NOT_FOUND,
            "repository_not_found",
            "nope",
        ),
        (
            req(
                Method::POST,
                "/api/v1/repositories",
                r#"{"name": "Bad_Name", "storage_namespace": "s3://b"}"#,
            ),
            StatusCode::BAD_REQUEST,
            "invalid_repository_name",
            "a-z",
        ),
        (
            req(
                Method::POST,
                "/api/v1/repositories",
                r#"{"name": "fine", "storage_namespace": ""}"#,
            ),
            StatusCode::BAD_REQUEST,
            "invalid_storage_namespace",
            "storage_namespace",
        ),
        (
            req(
                Method::POST,
                "/api/v1/repositories",
                r#"{"name": "demo", "storage_namespace": "s3://d"}"#,
            ),
            StatusCode::CONFLICT,
            "repository_exists",
            "demo",
        ),
        (
            req(Method::DELETE, "/api/v1/repositories/nope", ""),
            StatusCode::NOT_FOUND,
            "repository_not_found",
            "nope",
        ),
    ];
    support::assert_error_cases(&app.router, cases).await;
}

#[tokio::test]
async fn an_ndjson_import_applies_its_policy_and_reports_counts() {
    let app = support::setup(&read_path(ReadPath::Cached)).await;
    let line = |path: &str, addr: &str| {
        json!({"path": path, "physical_address": addr, "size_bytes": 1, "checksum": "c"})
            .to_string()
    };
    let first = [
        line("i/a", "s3://a1"),
        line("i/b", "s3://b1"),
        String::new(),
        line("i/b", "s3://b2"),
    ]
    .join("\n");
    let (status, body) = send(&app.router, import("empty", "skip", &first)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"rows": 3, "inserted": 2, "updated": 0, "skipped": 0, "superseded": 1})
    );
    let (_, b) = send(&app.router, get(&stat_uri("empty", "i/b"))).await;
    assert_eq!(
        b["physical_address"], "s3://b2",
        "the later line of a key wins"
    );

    let second = [line("i/a", "s3://a2"), line("i/c", "s3://c2")].join("\n");
    let (_, body) = send(&app.router, import("empty", "skip", &second)).await;
    assert_eq!(
        body,
        json!({"rows": 2, "inserted": 1, "updated": 0, "skipped": 1, "superseded": 0})
    );
    let (_, body) = send(&app.router, import("empty", "overwrite", &second)).await;
    assert_eq!(
        body,
        json!({"rows": 2, "inserted": 0, "updated": 2, "skipped": 0, "superseded": 0})
    );
    // The import invalidated the cache: the cached path reads the overwrite.
    let (_, b) = send(&app.router, get(&stat_uri("empty", "i/a"))).await;
    assert_eq!(b["physical_address"], "s3://a2");

    let (status, body) = send(
        &app.router,
        import(
            "empty",
            "fail",
            &[line("i/new", "x"), line("i/a", "x")].join("\n"),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "conflict");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("i/a"),
        "{body}"
    );
    assert_eq!(
        support::objects_in(&app.config, "empty").await,
        3,
        "nothing of a failed import is committed"
    );
}

#[tokio::test]
async fn a_malformed_import_line_is_named_and_nothing_is_committed() {
    let app = support::setup(&Settings {
        import: ImportSettings {
            max_bytes: 2000,
            ..ImportSettings::default()
        },
        ..Settings::default()
    })
    .await;
    let good = json!({"path": "m/a", "physical_address": "x", "size_bytes": 1, "checksum": "c"})
        .to_string();
    let cases = [
        (format!("{good}\n{{oops\n{good}"), "line 2"),
        (
            format!(
                "{good}\n\n{}",
                json!({"physical_address": "x", "size_bytes": 1, "checksum": "c"})
            ),
            "line 3: `path` is required",
        ),
        (
            format!(
                "{}\n{good}",
                json!({"path": "", "physical_address": "x", "size_bytes": 1, "checksum": "c"})
            ),
            "line 1: path must not be empty",
        ),
        (
            format!(
                "{good}\n{}",
                json!({"path": "m/b", "physical_address": "x", "size_bytes": -4, "checksum": "c"})
            ),
            "line 2: `size_bytes`",
        ),
    ];
    for (body, says) in cases {
        let (status, resp) = send(&app.router, import("empty", "skip", &body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{says}: {resp}");
        assert_eq!(resp["error"]["code"], "invalid_import_line");
        assert!(
            resp["error"]["message"].as_str().unwrap().contains(says),
            "{resp}"
        );
    }
    let big = std::iter::repeat_n(good.as_str(), 40)
        .collect::<Vec<_>>()
        .join("\n");
    let (status, resp) = send(&app.router, import("empty", "skip", &big)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{resp}");
    assert_eq!(support::objects_in(&app.config, "empty").await, 0);
}

#[tokio::test]
async fn repositories_can_be_created_listed_and_deleted() {
    let app = support::setup(&Settings::default()).await;
    let (status, body) = send(
        &app.router,
        req(
            Method::POST,
            "/api/v1/repositories",
            r#"{"name": "fresh", "storage_namespace": "s3://fresh/"}"#,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["name"], "fresh");
    assert_eq!(
        send(&app.router, put("fresh", "x", &object("s3://fresh/x", 5)))
            .await
            .0,
        StatusCode::CREATED
    );

    let (_, list) = send(&app.router, get("/api/v1/repositories")).await;
    let names: Vec<&str> = list["repositories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["demo", "empty", "fresh"]);

    assert_eq!(
        send(
            &app.router,
            req(Method::DELETE, "/api/v1/repositories/fresh", "")
        )
        .await
        .0,
        StatusCode::NO_CONTENT
    );
    let (status, body) = send(&app.router, get(&stat_uri("fresh", "x"))).await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (StatusCode::NOT_FOUND, json!("repository_not_found"))
    );
}

#[tokio::test]
async fn writes_need_write_permission() {
    let config = support::database().await;
    let (client, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    let mut client = client;
    server::domain::auth::create_user(&mut client, "viewer", &["demo".to_owned()], &[])
        .await
        .unwrap();
    server::domain::auth::add_token(&client, "viewer", "viewer-token", "")
        .await
        .unwrap();
    let app = support::app_on(&config, &Settings::default()).await;
    let as_viewer = |method: Method, uri: &str, body: &str| {
        Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", "Bearer viewer-token")
            .header("content-type", "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap()
    };
    let cases = [
        as_viewer(
            Method::PUT,
            "/api/v1/repositories/demo/objects?path=a",
            &object("x", 1).to_string(),
        ),
        as_viewer(
            Method::DELETE,
            &format!("/api/v1/repositories/demo/objects?path={}", object_path(1)),
            "",
        ),
        as_viewer(Method::POST, "/api/v1/repositories/demo/objects/import", ""),
        as_viewer(
            Method::POST,
            "/api/v1/repositories",
            r#"{"name": "mine", "storage_namespace": "s3://m"}"#,
        ),
        as_viewer(Method::DELETE, "/api/v1/repositories/demo", ""),
    ];
    for r in cases {
        let what = format!("{} {}", r.method(), r.uri());
        let (status, body) = send(&app.router, r).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{what}: {body}");
    }
    let (_, list) = send(
        &app.router,
        as_viewer(Method::GET, "/api/v1/repositories", ""),
    )
    .await;
    assert_eq!(
        list["repositories"].as_array().unwrap().len(),
        1,
        "only what the user may read"
    );
    assert_eq!(
        send(&app.router, get(&stat_uri("demo", &object_path(1))))
            .await
            .0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn concurrent_puts_are_coalesced_into_few_statements() {
    let app = support::setup(&Settings::default()).await;
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let router = app.router.clone();
            tokio::spawn(async move {
                send(
                    &router,
                    put("empty", &format!("c/{i}"), &object("s3://c", i)),
                )
                .await
                .0
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), StatusCode::CREATED);
    }
    assert_eq!(support::objects_in(&app.config, "empty").await, 200);
    let batches = app.state.writes.batcher_stats().batches;
    assert!(
        batches < 200,
        "200 concurrent writes took {batches} statements"
    );
}
