//! The lakeFS-compatible API's details that lakeFS's clients rely on
//! without the clients (see `lakefs_clients.rs` for those): both mount
//! points, Basic credentials, exact statuses, a bodiless HEAD, booleans as
//! Python spells them, listing bounds and byte order, one branch per
//! repository, read-only repositories, errors with a top-level `message`,
//! credentials made through the API.

use crate::support;

use crate::support::ADMIN_TOKEN;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use base64::Engine as _;
use http_body_util::BodyExt as _;
use serde_json::{json, Value};
use server::settings::{ReadPath, Settings};
use std::time::Duration;
use tower::ServiceExt as _;

fn basic(id: &str, secret: &str) -> String {
    let pair = base64::engine::general_purpose::STANDARD.encode(format!("{id}:{secret}"));
    format!("Basic {pair}")
}

fn admin_basic() -> String {
    basic(&server::domain::auth::token_id(ADMIN_TOKEN), ADMIN_TOKEN)
}

async fn call(
    router: &axum::Router,
    method: Method,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Vec<u8>) {
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", admin_basic());
    let body = match body {
        Some(v) => {
            req = req.header("content-type", "application/json");
            Body::from(v.to_string())
        }
        None => Body::empty(),
    };
    let res = router
        .clone()
        .oneshot(req.body(body).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (status, bytes.to_vec())
}

async fn json_call(
    router: &axum::Router,
    method: Method,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let (status, bytes) = call(router, method, uri, body).await;
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// The paths of a listing's page, in order.
fn paths(page: &Value) -> Vec<&str> {
    page["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["path"].as_str().unwrap())
        .collect()
}

/// Creates a repository through the lakeFS API from `body`; its answer.
async fn create_repository(router: &axum::Router, body: Value) -> Value {
    let (status, answer) =
        json_call(router, Method::POST, "/lakefs/repositories", Some(body)).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    answer
}

async fn stage(router: &axum::Router, repo: &str, branch: &str, path: &str) -> StatusCode {
    let uri = format!(
        "/lakefs/repositories/{repo}/branches/{branch}/objects?path={}",
        path.replace(' ', "+")
    );
    let body =
        json!({"physical_address": format!("s3://b/{path}"), "checksum": "c", "size_bytes": 1});
    json_call(router, Method::PUT, &uri, Some(body)).await.0
}

#[tokio::test]
async fn both_mount_points_basic_and_bearer_credentials() {
    let app = support::setup(&Settings::default()).await;
    for base in ["/lakefs", "/lakefs/api/v1"] {
        let (status, body) =
            json_call(&app.router, Method::GET, &format!("{base}/user"), None).await;
        assert_eq!(status, StatusCode::OK, "{base}: {body}");
        assert_eq!(body["user"]["id"], "admin");
        assert!(body["user"]["creation_date"].is_i64(), "{body}");
    }
    let (status, body) = json_call(&app.router, Method::GET, "/lakefs/config", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["storage_config"]["pre_sign_support"], false);
    assert_eq!(body["version_config"]["version_context"], "lakeFS");
    // A wrong secret, a wrong id, none at all.
    for auth in [
        Some(basic(&server::domain::auth::token_id(ADMIN_TOKEN), "wrong")),
        Some(basic("0123456789abcdef", ADMIN_TOKEN)),
        None,
    ] {
        let mut req = Request::get("/lakefs/user");
        if let Some(auth) = &auth {
            req = req.header("authorization", auth);
        }
        let res = app
            .router
            .clone()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{auth:?}");
        let body: Value =
            serde_json::from_slice(&res.into_body().collect().await.unwrap().to_bytes()).unwrap();
        assert!(body["message"].is_string(), "lakeFS's error shape: {body}");
    }
    let res = app
        .router
        .clone()
        .oneshot(
            Request::get("/lakefs/healthcheck")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::NO_CONTENT,
        "no credentials needed"
    );
}

#[tokio::test]
async fn objects_on_the_one_branch_with_exact_statuses() {
    let app = support::setup(&Settings::default()).await;
    let r = &app.router;
    let body = create_repository(r, json!({"name": "lk-repo", "storage_namespace": "s3://b/lk", "default_branch": "dev", "sample_data": false})).await;
    assert_eq!(body["default_branch"], "dev");
    assert_eq!(body["read_only"], false);
    assert_eq!(body["storage_id"], "");
    assert_eq!(
        stage(r, "lk-repo", "dev", "x/a b").await,
        StatusCode::CREATED
    );
    assert_eq!(
        stage(r, "lk-repo", "main", "x/c").await,
        StatusCode::NOT_FOUND,
        "not its branch"
    );

    let stat = "/lakefs/repositories/lk-repo/refs/dev/objects/stat?path=x%2Fa+b&user_metadata=True";
    let (status, body) = json_call(r, Method::GET, stat, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["path"], "x/a b");
    assert_eq!(body["path_type"], "object");
    assert_eq!(body["metadata"], json!({}));
    assert!(body["mtime"].is_i64());

    let (status, body) = json_call(
        r,
        Method::GET,
        "/lakefs/repositories/lk-repo/refs/main/objects/stat?path=x/c",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "ref_not_found");
    assert!(body["message"].as_str().unwrap().contains("main"), "{body}");

    let (status, body) = call(
        r,
        Method::HEAD,
        "/lakefs/repositories/lk-repo/refs/dev/objects?path=nope",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.is_empty(), "a HEAD has no body");
    let (status, _) = call(
        r,
        Method::HEAD,
        "/lakefs/repositories/lk-repo/refs/dev/objects?path=x/a+b",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);

    let (status, _) = call(
        r,
        Method::DELETE,
        "/lakefs/repositories/lk-repo/branches/dev/objects?path=never",
        None,
    )
    .await;
    assert_eq!(
        status,
        StatusCode::NO_CONTENT,
        "deleting a missing object is 204, as lakeFS has it"
    );
    let (status, _) = call(
        r,
        Method::DELETE,
        "/lakefs/repositories/no-such/branches/dev/objects?path=x",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = json_call(
        r,
        Method::POST,
        "/lakefs/repositories/lk-repo/branches/dev/objects/delete",
        Some(json!({"paths": ["x/a b", "never"]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"errors": []}));

    let (status, body) = json_call(
        r,
        Method::GET,
        "/lakefs/repositories/lk-repo/branches/dev",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["id"], "dev");
    // A head commit id as lakeFS's look (64 hex digits), the same each time.
    let head = body["commit_id"].as_str().unwrap().to_owned();
    assert!(
        head.len() == 64 && head.bytes().all(|b| b.is_ascii_hexdigit()),
        "{head}"
    );
    let (_, again) = json_call(
        r,
        Method::GET,
        "/lakefs/repositories/lk-repo/branches/dev",
        None,
    )
    .await;
    assert_eq!(again["commit_id"], head.as_str());
    // Reading at it, or at any commit id, is history this server does not
    // keep: 501, not a 404.
    for at in [head.as_str(), "abc1234"] {
        let (status, body) = json_call(
            r,
            Method::GET,
            &format!("/lakefs/repositories/lk-repo/refs/{at}/objects/stat?path=a"),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::NOT_IMPLEMENTED, "{body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("no commit history"),
            "{body}"
        );
    }
    // listBranches pages its one branch as lakeFS pages branches.
    for (query, want) in [
        ("", vec!["dev"]),
        ("?prefix=de&amount=10", vec!["dev"]),
        ("?prefix=main", vec![]),
        ("?after=dev", vec![]),
        ("?after=cat", vec!["dev"]),
    ] {
        let (status, body) = json_call(
            r,
            Method::GET,
            &format!("/lakefs/repositories/lk-repo/branches{query}"),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{query}: {body}");
        let ids: Vec<&str> = body["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, want, "{query}: {body}");
        assert_eq!(body["pagination"]["has_more"], false, "{query}");
    }
    let (status, body) = json_call(
        r,
        Method::GET,
        "/lakefs/repositories/lk-repo/branches?amount=ten",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, _) = call(r, Method::DELETE, "/lakefs/repositories/lk-repo", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = call(r, Method::GET, "/lakefs/repositories/lk-repo", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn listings_page_in_byte_order_within_bounds() {
    let app = support::setup(&Settings::default()).await;
    let r = &app.router;
    create_repository(
        r,
        json!({"name": "lk-list", "storage_namespace": "s3://b/l"}),
    )
    .await;
    // Byte order: upper case before lower case before non-ASCII, whatever
    // the database's locale would say.
    for p in ["é", "a", "B", "b/1", "b/2"] {
        assert_eq!(stage(r, "lk-list", "main", p).await, StatusCode::CREATED);
    }
    let ls = |q: &str| format!("/lakefs/repositories/lk-list/refs/main/objects/ls?{q}");
    let (status, body) = json_call(r, Method::GET, &ls("amount=0"), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(paths(&body), ["B", "a", "b/1", "b/2", "é"]);
    assert_eq!(body["pagination"]["has_more"], false);
    assert_eq!(body["pagination"]["next_offset"], "");
    assert_eq!(body["pagination"]["max_per_page"], 1000);
    let (_, body) = json_call(r, Method::GET, &ls("amount=2&delimiter=/&after=a"), None).await;
    assert_eq!(
        body["results"],
        json!([
            {"path": "b/", "path_type": "common_prefix", "physical_address": "", "checksum": "", "mtime": 0},
            {"path": "é", "path_type": "object", "physical_address": "s3://b/é", "checksum": "c", "mtime": body["results"][1]["mtime"], "size_bytes": 1, "content_type": "application/octet-stream"},
        ])
    );
    // A directory marker equal to the prefix, as a page's last entry: the
    // next page goes on under it.
    assert_eq!(stage(r, "lk-list", "main", "b/").await, StatusCode::CREATED);
    let (status, body) = json_call(
        r,
        Method::GET,
        &ls("prefix=b/&delimiter=/&after=b/&amount=5"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(paths(&body), ["b/1", "b/2"], "{body}");
    // Text Postgres cannot hold, or longer than any path: 400, naming it.
    for q in ["prefix=%00", "after=a%00", "delimiter=%00"] {
        let (status, body) = json_call(r, Method::GET, &ls(q), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{q}: {body}");
        assert_eq!(body["error"]["code"], "invalid_path", "{q}: {body}");
    }
    let long = format!("prefix={}", "a".repeat(1025));
    let (status, _) = json_call(r, Method::GET, &ls(&long), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = json_call(r, Method::GET, &ls("amount=ten"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, _) = json_call(r, Method::GET, &ls("user_metadata=maybe"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = json_call(
        r,
        Method::GET,
        "/lakefs/repositories?amount=1&prefix=lk-",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["results"][0]["id"], "lk-list");
}

#[tokio::test]
async fn a_read_only_repository_refuses_writes_through_either_api() {
    let app = support::setup(&Settings::default()).await;
    let r = &app.router;
    let body = create_repository(
        r,
        json!({"name": "lk-frozen", "storage_namespace": "s3://b/f", "read_only": true}),
    )
    .await;
    assert_eq!(body["read_only"], true);
    assert_eq!(
        stage(r, "lk-frozen", "main", "x").await,
        StatusCode::FORBIDDEN
    );
    // The service's own API: the database refuses the row.
    let req = Request::put("/api/v1/repositories/lk-frozen/objects?path=x")
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"physical_address": "s3://b/x", "size_bytes": 1, "checksum": "c"}).to_string(),
        ))
        .unwrap();
    let (status, body) = support::send(r, req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("read-only"),
        "{body}"
    );
    // Deleting it needs `force`, as lakeFS has it.
    let (status, body) = json_call(r, Method::DELETE, "/lakefs/repositories/lk-frozen", None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["message"], "read-only repository");
    let (status, _) = call(
        r,
        Method::DELETE,
        "/lakefs/repositories/lk-frozen?force=true",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

/// `POST /auth/users/{userId}/credentials` as `authorization`.
async fn create_credentials(
    router: &axum::Router,
    authorization: &str,
    user: &str,
) -> (StatusCode, Value) {
    let req = Request::post(format!("/lakefs/auth/users/{user}/credentials"))
        .header("authorization", authorization)
        .body(Body::empty())
        .unwrap();
    support::send(router, req).await
}

#[tokio::test]
async fn credentials_from_the_api_for_oneself_or_as_an_admin() {
    let app = support::setup(&Settings::default()).await;
    let r = &app.router;
    let alice = support::user_with_token(&app.config, "alice").await;
    let alice_basic = basic(&server::domain::auth::token_id(&alice), &alice);

    // Alice makes a pair for herself: the secret is a new token, the
    // access key id its id, and it works at once.
    let (status, body) = create_credentials(r, &alice_basic, "alice").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let secret = body["secret_access_key"].as_str().unwrap();
    let id = body["access_key_id"].as_str().unwrap();
    assert_ne!(secret, alice);
    assert_eq!(id, server::domain::auth::token_id(secret));
    assert!(body["creation_date"].as_i64().unwrap() > 1_700_000_000);
    let req = Request::get("/lakefs/user")
        .header("authorization", basic(id, secret))
        .body(Body::empty())
        .unwrap();
    let (status, user) = support::send(r, req).await;
    assert_eq!(status, StatusCode::OK, "{user}");
    assert_eq!(user["user"]["id"], "alice");

    // Not for someone else, whether or not they exist; an admin may.
    for other in ["admin", "nobody"] {
        let (status, body) = create_credentials(r, &alice_basic, other).await;
        // lakeFS answers a missing permission with 401.
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{other}: {body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .starts_with("insufficient permissions"),
            "{body}"
        );
    }
    let (status, body) = create_credentials(r, &admin_basic(), "alice").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = create_credentials(r, &admin_basic(), "nobody").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "user_not_found");
    let (status, body) = create_credentials(r, &admin_basic(), "bad%20name").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, _) = create_credentials(r, "Basic bm9wZTpub3Bl", "alice").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // A pair made with a token that expires expires with it: a short-lived
    // token cannot mint a lasting one.
    let short = server::domain::auth::new_token().unwrap();
    let c = support::client(&app.config).await;
    server::domain::auth::add_expiring_token(
        &c,
        "alice",
        &short,
        "short",
        Some(Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    let short_basic = basic(&server::domain::auth::token_id(&short), &short);
    let (status, body) = create_credentials(r, &short_basic, "alice").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let minted = body["access_key_id"].as_str().unwrap().to_owned();
    let req = Request::get("/api/v1/user/tokens")
        .header("authorization", format!("Bearer {alice}"))
        .body(Body::empty())
        .unwrap();
    let (status, body) = support::send(r, req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let expiry = |id: &str| {
        body["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == id)
            .unwrap_or_else(|| panic!("no token {id}: {body}"))["expires_at"]
            .as_i64()
    };
    let (minted_at, short_at) = (
        expiry(&minted),
        expiry(&server::domain::auth::token_id(&short)),
    );
    assert!(short_at.is_some(), "{body}");
    // The same expiry, to the second (the server computes the time left,
    // the database adds it to its own clock a moment later).
    assert!(
        minted_at.is_some_and(|m| m <= short_at.unwrap() + 1),
        "minted {minted_at:?}, its maker {short_at:?}"
    );
}

/// deleteObjects deletes its valid paths in one statement: all of them, or
/// (when the database refuses) none, each refused path listed; an invalid
/// path is listed alone and the others still go, and leave this
/// instance's cache at once.
#[tokio::test]
async fn delete_objects_removes_every_valid_path_or_lists_each_refusal() {
    let app = support::setup(&support::read_path(ReadPath::Cached)).await;
    let r = &app.router;
    create_repository(
        r,
        json!({"name": "lk-del", "storage_namespace": "s3://b/d"}),
    )
    .await;
    let staged: Vec<String> = (0..300).map(|i| format!("d/{i:04}")).collect();
    for path in &staged {
        assert_eq!(stage(r, "lk-del", "main", path).await, StatusCode::CREATED);
    }
    let list = |repo: &str| format!("/lakefs/repositories/{repo}/refs/main/objects/ls?amount=1000");
    let delete = "/lakefs/repositories/lk-del/branches/main/objects/delete";

    let stat = "/lakefs/repositories/lk-del/refs/main/objects/stat?path=d/0000";

    // A read-only repository refuses every path, before any statement:
    // 200, each path listed with 403, as lakeFS answers.
    let first_200 = json!({"paths": staged[..200]});
    let db = support::client(&app.config).await;
    db.batch_execute("UPDATE repositories SET read_only = true WHERE name = 'lk-del'")
        .await
        .unwrap();
    let (status, body) = json_call(r, Method::POST, delete, Some(first_200.clone())).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let refused = body["errors"].as_array().unwrap();
    assert_eq!(refused.len(), 200, "{body}");
    assert_eq!(refused[0]["status_code"], 403);
    assert_eq!(refused[0]["message"], "read-only repository");
    db.batch_execute("UPDATE repositories SET read_only = false WHERE name = 'lk-del'")
        .await
        .unwrap();

    // The database refuses the statement: each path is listed, none goes.
    db.batch_execute(
        "CREATE FUNCTION refuse_deletes() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'no deletes today'; END $$; \
         CREATE TRIGGER refuse_deletes BEFORE DELETE ON objects \
         FOR EACH STATEMENT EXECUTE FUNCTION refuse_deletes();",
    )
    .await
    .unwrap();
    let (status, body) = json_call(r, Method::POST, delete, Some(first_200.clone())).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let errors = body["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 200, "{body}");
    // The statement's error, as any unexpected one, is a 503 that names
    // no database detail.
    assert!(
        errors
            .iter()
            .zip(&staged)
            .all(|(e, path)| e["path"] == path.as_str() && e["status_code"] == 503),
        "{body}"
    );
    let (_, page) = json_call(r, Method::GET, &list("lk-del"), None).await;
    assert_eq!(paths(&page).len(), 300, "nothing deleted");
    db.batch_execute("DROP TRIGGER refuse_deletes ON objects")
        .await
        .unwrap();

    // Cached before the delete, with the change notification that would
    // also evict it turned off: the delete must evict it itself.
    db.batch_execute("ALTER TABLE objects DISABLE TRIGGER objects_notify_delete")
        .await
        .unwrap();
    let hits = || async {
        let metrics = support::metrics_text(r).await;
        support::metric_value(&metrics, r#"cache_hits_total{cache="object_stat"}"#)
    };
    let before = hits().await;
    for _ in 0..2 {
        let (status, _) = call(r, Method::GET, stat, None).await;
        assert_eq!(status, StatusCode::OK, "read before the delete");
    }
    assert!(hits().await > before, "the second read was not a cache hit");

    let mut asked: Vec<&str> = staged[..200].iter().map(String::as_str).collect();
    asked.push("bad\u{0}path");
    asked.push("never-staged");
    let (status, body) = json_call(r, Method::POST, delete, Some(json!({ "paths": asked }))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let errors = body["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{body}");
    assert_eq!(errors[0]["path"], "bad\u{0}path");
    assert_eq!(errors[0]["status_code"], 400);
    let (_, page) = json_call(r, Method::GET, &list("lk-del"), None).await;
    assert_eq!(
        paths(&page),
        staged[200..].iter().map(String::as_str).collect::<Vec<_>>()
    );
    // A deleted object read (and cached) before answers 404 at once.
    let (status, _) = call(r, Method::GET, stat, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
