//! The HTTP API against a real Postgres: every endpoint, every kind of bad
//! input, not-found, and naive and batched reads giving the same answers.

use crate::support;

use crate::support::{
    get, post_json, read_path, send, send_full, setup, stat_uri, READ_PATHS, SEEDED,
};
use axum::http::StatusCode;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use server::db::queries::kv::{kv_payload, kv_pk};
use server::db::seed::object_path;
use server::settings::{Limits, ReadPath, Settings};

#[tokio::test]
async fn stat_returns_an_objects_metadata() {
    for mode in READ_PATHS {
        let app = setup(&read_path(mode)).await;
        let path = object_path(7);
        let (status, body) = send(&app.router, get(&stat_uri("demo", &path))).await;
        assert_eq!(status, StatusCode::OK, "{mode:?}: {body}");
        assert_eq!(body["path"], path);
        assert_eq!(body["content_type"], "application/vnd.apache.parquet");
        assert_eq!(body["metadata"], json!({"source": "seed", "shard": "7"}));
        assert!(body["size_bytes"].as_i64().unwrap() >= 0);
        assert!(body["physical_address"]
            .as_str()
            .unwrap()
            .starts_with("s3://pgbatch-demo/"));
        assert_eq!(body["checksum"].as_str().unwrap().len(), 32);
        assert!(body["mtime"].as_i64().unwrap() > 1_600_000_000);
    }
}

#[tokio::test]
async fn a_path_needing_percent_encoding_round_trips() {
    let app = setup(&read_path(ReadPath::Batched)).await;
    let (client, conn) = app.config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
        .execute(
            "INSERT INTO objects (repository, path, physical_address, size_bytes, checksum) \
             VALUES ('demo', $1, 's3://x/y', 1, 'abc')",
            &[&"dir with space/été & co/100%.txt"],
        )
        .await
        .unwrap();
    let raw = "dir+with%20space%2F%C3%A9t%C3%A9%20%26%20co/100%25.txt";
    let (status, body) = send(&app.router, get(&stat_uri("demo", raw))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["path"], "dir with space/été & co/100%.txt");
}

#[tokio::test]
async fn missing_objects_and_repositories_are_404_with_distinct_codes() {
    for mode in READ_PATHS {
        let app = setup(&read_path(mode)).await;
        let cases = [
            (stat_uri("demo", "no/such/object"), "object_not_found"),
            (stat_uri("empty", "anything"), "object_not_found"),
            (stat_uri("nope", "anything"), "repository_not_found"),
            (format!("/api/v1/kv/{}", kv_pk(SEEDED + 1)), "row_not_found"),
        ];
        for (uri, code) in cases {
            let (status, body) = send(&app.router, get(&uri)).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{mode:?} {uri}: {body}");
            assert_eq!(body["error"]["code"], code, "{mode:?} {uri}");
            assert!(body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()));
        }
    }
}

#[tokio::test]
async fn kv_returns_the_seed_benchmark_row() {
    for mode in READ_PATHS {
        let app = setup(&read_path(mode)).await;
        let (status, body) = send(&app.router, get(&format!("/api/v1/kv/{}", kv_pk(42)))).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, json!({"pk": kv_pk(42), "payload": kv_payload(42)}));
    }
}

#[tokio::test]
async fn post_stat_answers_each_path_in_order() {
    for mode in READ_PATHS {
        let app = setup(&read_path(mode)).await;
        let paths = [
            object_path(3),
            "missing/one".to_owned(),
            object_path(1),
            object_path(3),
        ];
        let (status, body) = send(
            &app.router,
            post_json(
                "/api/v1/repositories/demo/objects/stat",
                json!({ "paths": paths }).to_string(),
            ),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let results = body["results"].as_array().unwrap();
        assert_eq!(results.len(), 4);
        for (r, p) in results.iter().zip(&paths) {
            assert_eq!(&r["path"], p);
        }
        assert_eq!(results[0]["object"]["path"], object_path(3));
        assert_eq!(results[1]["object"], Value::Null);
        assert_eq!(results[2]["object"]["path"], object_path(1));
        assert_eq!(results[3]["object"], results[0]["object"]);

        let (status, body) = send(
            &app.router,
            post_json(
                "/api/v1/repositories/nope/objects/stat",
                r#"{"paths": ["a"]}"#,
            ),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["error"]["code"], "repository_not_found");
    }
}

#[tokio::test]
async fn bad_input_gets_a_4xx_json_error_naming_the_problem() {
    let long = "x".repeat(1025);
    let too_big = format!(r#"{{"paths": ["{}"]}}"#, "y".repeat(5000));
    let six = json!({ "paths": ["a", "b", "c", "d", "e", "f"] }).to_string();
    let no_content_type = axum::http::Request::post("/api/v1/repositories/demo/objects/stat")
        .header("authorization", format!("Bearer {}", support::ADMIN_TOKEN))
        .body(axum::body::Body::from(r#"{"paths": ["a"]}"#))
        .unwrap();
    let cases: Vec<(
        axum::http::Request<axum::body::Body>,
        StatusCode,
        &str,
        &str,
    )> = vec![
        (
            get("/api/v1/repositories/demo/objects/stat"),
            StatusCode::BAD_REQUEST,
            "missing_path",
            "required",
        ),
        (
            get(&stat_uri("demo", "")),
            StatusCode::BAD_REQUEST,
            "invalid_path",
            "empty",
        ),
        (
            get(&stat_uri("demo", &long)),
            StatusCode::BAD_REQUEST,
            "invalid_path",
            "1024",
        ),
        (
            get(&stat_uri("demo", "a%00b")),
            StatusCode::BAD_REQUEST,
            "invalid_path",
            "NUL",
        ),
        (
            get(&stat_uri("demo", "%C3%28")),
            StatusCode::BAD_REQUEST,
            "invalid_query",
            "UTF-8",
        ),
        (
            get(&stat_uri("demo", "%zz")),
            StatusCode::BAD_REQUEST,
            "invalid_query",
            "percent-encoding",
        ),
        (
            get(&format!("{}&path=b", stat_uri("demo", "a"))),
            StatusCode::BAD_REQUEST,
            "invalid_query",
            "more than once",
        ),
        (
            get(&stat_uri("Bad_Repo", "a")),
            StatusCode::BAD_REQUEST,
            "invalid_repository_name",
            "a-z",
        ),
        (
            get(&stat_uri("%FF%FE", "a")),
            StatusCode::BAD_REQUEST,
            "invalid_path_parameter",
            "UTF-8",
        ),
        (
            get("/api/v1/kv/a%07b"),
            StatusCode::BAD_REQUEST,
            "invalid_key",
            "control",
        ),
        (
            post_json("/api/v1/repositories/demo/objects/stat", r#"{"paths": ["#),
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "EOF",
        ),
        (
            post_json("/api/v1/repositories/demo/objects/stat", r#"{"paths": 5}"#),
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "invalid type",
        ),
        (
            post_json(
                "/api/v1/repositories/demo/objects/stat",
                r#"{"paths": [], "x": 1}"#,
            ),
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "unknown field",
        ),
        (
            post_json("/api/v1/repositories/demo/objects/stat", r#"{"paths": []}"#),
            StatusCode::BAD_REQUEST,
            "empty_paths",
            "empty",
        ),
        (
            post_json("/api/v1/repositories/demo/objects/stat", six),
            StatusCode::BAD_REQUEST,
            "too_many_paths",
            "at most 5",
        ),
        (
            post_json(
                "/api/v1/repositories/demo/objects/stat",
                r#"{"paths": ["ok", ""]}"#,
            ),
            StatusCode::BAD_REQUEST,
            "invalid_path",
            "paths[1]",
        ),
        (
            post_json("/api/v1/repositories/demo/objects/stat", too_big),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            "larger than 4096 bytes",
        ),
        (
            no_content_type,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "Content-Type",
        ),
        (
            get("/api/v1/nothing"),
            StatusCode::NOT_FOUND,
            "route_not_found",
            "route",
        ),
        (
            axum::http::Request::delete("/healthz")
                .body(axum::body::Body::empty())
                .unwrap(),
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "method",
        ),
    ];
    let app = setup(&Settings {
        limits: Limits {
            max_stat_paths: 5,
            max_body_bytes: 4096,
            ..Limits::default()
        },
        ..Settings::default()
    })
    .await;
    support::assert_error_cases(&app.router, cases).await;
}

#[tokio::test]
async fn naive_batched_and_cached_give_identical_answers_for_random_keys() {
    let config = support::database().await;
    let naive = support::app_on(&config, &read_path(ReadPath::Naive)).await;
    let batched = support::app_on(&config, &read_path(ReadPath::Batched)).await;
    let cached = support::app_on(&config, &read_path(ReadPath::Cached)).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);

    let mut uris = Vec::new();
    for _ in 0..150 {
        // About one in six keys is past the seeded range.
        let n = rng.random_range(1..=SEEDED + SEEDED / 5);
        uris.push(stat_uri("demo", &object_path(n)));
        uris.push(format!("/api/v1/kv/{}", kv_pk(n)));
    }
    // The batched and cached apps get them concurrently, so they really
    // share batches (and, for repeated keys, cache loads).
    let batched_answers = futures_join(&batched.router, &uris).await;
    let cached_answers = futures_join(&cached.router, &uris).await;
    for ((uri, batched_answer), cached_answer) in
        uris.iter().zip(batched_answers).zip(cached_answers)
    {
        let naive_answer = send(&naive.router, get(uri)).await;
        assert_eq!(naive_answer, batched_answer, "{uri}");
        assert_eq!(naive_answer, cached_answer, "{uri}");
    }
    // Asked again, the cached app answers from memory, identically.
    let again = futures_join(&cached.router, &uris).await;
    let hits: u64 = cached
        .state
        .reads
        .cache_stats()
        .iter()
        .map(|(_, s)| s.hits)
        .sum();
    assert!(hits >= 150, "only {hits} cache hits");
    for (uri, answer) in uris.iter().zip(again) {
        assert_eq!(answer, send(&naive.router, get(uri)).await, "{uri}");
    }
    let stats = batched.state.reads.batcher_stats();
    let batches: u64 = stats.iter().map(|(_, s)| s.batches).sum();
    assert!(
        batches < 300,
        "300 concurrent lookups took {batches} statements"
    );
}

async fn futures_join(router: &axum::Router, uris: &[String]) -> Vec<(StatusCode, Value)> {
    let tasks: Vec<_> = uris
        .iter()
        .map(|uri| {
            let router = router.clone();
            let req = get(uri);
            tokio::spawn(async move { send(&router, req).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let app = setup(&read_path(ReadPath::Cached)).await;
    assert_eq!(
        send(&app.router, get("/healthz")).await,
        (StatusCode::OK, json!({"status": "ok"}))
    );
    assert_eq!(
        send(&app.router, get("/readyz")).await,
        (
            StatusCode::OK,
            json!({"status": "ready", "caches": "in_use"})
        )
    );
    send(&app.router, get(&stat_uri("demo", &object_path(1)))).await;
    send(&app.router, get(&format!("/api/v1/kv/{}", kv_pk(1)))).await;
    for i in 0..3 {
        let odd = axum::http::Method::from_bytes(format!("FOO{i}").as_bytes()).unwrap();
        let req = axum::http::Request::builder().method(odd).uri("/healthz");
        send(&app.router, req.body(axum::body::Body::empty()).unwrap()).await;
    }

    let res = tower::ServiceExt::oneshot(app.router.clone(), get("/metrics"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let bytes = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    for needle in [
        r#"http_requests_total{method="GET",route="/api/v1/repositories/{repo}/objects/stat",status="200"} 1"#,
        r#"http_requests_total{method="GET",route="/api/v1/kv/{pk}",status="200"} 1"#,
        "# TYPE http_request_duration_seconds histogram",
        r#"batcher_batches_total{batcher="object_stat"} 1"#,
        r#"batcher_batch_size_count{batcher="kv"} 1"#,
        r#"batcher_queue_wait_seconds_count{batcher="kv"} 1"#,
        r#"batcher_load_duration_seconds_bucket{le="+Inf",batcher="object_stat"} 1"#,
        r#"http_requests_total{method="other",route="/healthz",status="405"} 3"#,
        r#"cache_misses_total{cache="object_stat"} 1"#,
        r#"cache_misses_total{cache="auth"} 1"#,
        r#"cache_hits_total{cache="auth"} "#,
        // Current at scrape time, though moka counts inserts lazily.
        r#"cache_entries{cache="kv"} 1"#,
        r#"cache_entries{cache="object_stat"} 1"#,
        r#"cache_entries{cache="auth"} 1"#,
        concat!(
            r#"pgbatch_build_info{version=""#,
            env!("CARGO_PKG_VERSION"),
            r#""} 1"#
        ),
        "db_pool_max_size 4",
        "# EOF",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert!(
        !text.contains("FOO"),
        "client-chosen methods must not become labels"
    );
}

#[tokio::test]
async fn an_unreachable_database_is_503_without_leaking_details() {
    let mut config = support::database().await;
    config.dbname("no_such_database");
    for mode in READ_PATHS {
        let app = support::app_on(&config, &read_path(mode)).await;
        let (status, headers, body) = send_full(&app.router, get(&stat_uri("demo", "a"))).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{mode:?}: {body}");
        assert_eq!(body["error"]["code"], "database_unavailable");
        assert!(!body.to_string().contains("no_such_database"), "{body}");
        assert_eq!(headers["retry-after"], "1");
        let (status, body) = send(&app.router, get("/readyz")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["error"]["code"], "not_ready");
    }
}

#[tokio::test]
async fn every_response_carries_a_request_id_given_or_generated() {
    let app = setup(&Settings::default()).await;
    let given = axum::http::Request::get("/healthz")
        .header("x-request-id", "client-chosen-42")
        .body(axum::body::Body::empty())
        .unwrap();
    let (_, headers, _) = send_full(&app.router, given).await;
    assert_eq!(headers["x-request-id"], "client-chosen-42");
    for uri in ["/healthz", "/api/v1/user", "/no/such/route"] {
        let (_, headers, _) = send_full(&app.router, get(uri)).await;
        let id = headers["x-request-id"].to_str().unwrap();
        assert_eq!(id.len(), 36, "{uri}: a generated UUID, got {id:?}");
    }
}
