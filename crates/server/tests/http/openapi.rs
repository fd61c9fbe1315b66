//! The OpenAPI document against the router it describes: every route and
//! method the router serves is documented, every documented one is served,
//! and the documented bodies have the fields the real answers have.

use std::collections::BTreeSet;

use crate::support::{get, get_as, send, setup, stat_uri};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::Value;
use server::db::seed::object_path;
use server::settings::Settings;

/// The paths given to a plain `.route(...)` in the router's source (the
/// documented routes are registered from their annotations instead, see
/// `http::openapi`): string literals only.
fn plain_router_paths() -> Vec<String> {
    let source = include_str!("../../src/lib.rs");
    source
        .split(".route(")
        .skip(1)
        .map(|call| {
            let arg = call.trim_start();
            let rest = arg.strip_prefix('"').unwrap_or_else(|| {
                panic!(
                    "a route path this test cannot read: {}",
                    &arg[..40.min(arg.len())]
                )
            });
            rest[..rest.find('"').expect("a closed literal")].to_owned()
        })
        .collect()
}

/// A concrete URI for a route template.
fn concrete(template: &str) -> String {
    template
        .replace("{repo}", "demo")
        .replace("{pk}", "1")
        .replace("{id}", "0123456789abcdef")
}

const METHODS: [Method; 5] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::PATCH,
];

#[tokio::test]
async fn the_document_and_the_router_list_the_same_routes_and_methods() {
    let app = setup(&Settings::default()).await;
    let (status, doc) = send(&app.router, get_as("/api/openapi.json", None)).await;
    assert_eq!(status, StatusCode::OK, "served without a token");
    assert_eq!(doc["openapi"].as_str().map(|v| &v[..2]), Some("3."));
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));

    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .map(move |method| (method.to_uppercase(), path.clone()))
        })
        .collect();

    // Which methods the router answers on each path: without a token, a
    // served method is 401 (or its answer), an unserved one 405.
    // Every documented path and every plain route, probed with every
    // method: a method served but undocumented, or documented but not
    // served, fails below.
    let paths: BTreeSet<String> = documented
        .iter()
        .map(|(_, path)| path.clone())
        .chain(plain_router_paths())
        .collect();
    assert!(paths.len() >= 12, "the document's paths: {paths:?}");
    let mut served = BTreeSet::new();
    for path in &paths {
        for method in METHODS {
            let req = Request::builder()
                .method(method.clone())
                .uri(concrete(path))
                .body(Body::empty())
                .unwrap();
            let (status, body) = send(&app.router, req).await;
            assert_ne!(status, StatusCode::NOT_FOUND, "{method} {path}: {body}");
            if status != StatusCode::METHOD_NOT_ALLOWED {
                // Nothing here sends a token: an /api/v1 route that
                // answers anything else is not behind the guard.
                if path.starts_with("/api/v1/") {
                    assert_eq!(
                        status,
                        StatusCode::UNAUTHORIZED,
                        "{method} {path} without a token: {body}"
                    );
                }
                served.insert((method.to_string(), path.clone()));
            }
        }
    }
    let undocumented: Vec<_> = served.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "served, not documented: {undocumented:?}"
    );
    let unserved: Vec<_> = documented.difference(&served).collect();
    assert!(unserved.is_empty(), "documented, not served: {unserved:?}");

    // Every /api route but the document itself names the bearer scheme.
    for (method, path) in &documented {
        let op = &doc["paths"][path][method.to_lowercase()];
        let secured = op["security"][0].get("bearer").is_some();
        let open = !path.starts_with("/api/v1/");
        assert!(
            secured != open,
            "{method} {path}: security {}",
            op["security"]
        );
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
}

/// The property names of schema `name`.
fn properties(doc: &Value, name: &str) -> BTreeSet<String> {
    doc["components"]["schemas"][name]["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("schema {name}: {}", doc["components"]["schemas"][name]))
        .keys()
        .cloned()
        .collect()
}

fn keys(value: &Value) -> BTreeSet<String> {
    value.as_object().unwrap().keys().cloned().collect()
}

#[tokio::test]
async fn documented_bodies_have_the_fields_of_real_answers() {
    let app = setup(&Settings::default()).await;
    let doc = send(&app.router, get_as("/api/openapi.json", None)).await.1;

    let stat = send(&app.router, get(&stat_uri("demo", &object_path(3))))
        .await
        .1;
    assert_eq!(properties(&doc, "ObjectStats"), keys(&stat));

    let (status, error) = send(&app.router, get(&stat_uri("demo", "nope"))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(properties(&doc, "ErrorBody"), keys(&error));
    assert_eq!(properties(&doc, "ErrorDetail"), keys(&error["error"]));
    // A 404 of the stat route is documented with the error body.
    let not_found = &doc["paths"]["/api/v1/repositories/{repo}/objects/stat"]["get"]["responses"]
        ["404"]["content"]["application/json"]["schema"]["$ref"];
    assert_eq!(not_found, "#/components/schemas/ErrorBody");

    let repos = send(&app.router, get("/api/v1/repositories")).await.1;
    assert_eq!(properties(&doc, "RepositoryList"), keys(&repos));
    assert_eq!(
        properties(&doc, "Repository"),
        keys(&repos["repositories"][0])
    );

    let user = send(&app.router, get("/api/v1/user")).await.1;
    assert_eq!(properties(&doc, "UserBody"), keys(&user));
    assert_eq!(properties(&doc, "Grant"), keys(&user["grants"][0]));
    let tokens = send(&app.router, get("/api/v1/user/tokens")).await.1;
    assert_eq!(properties(&doc, "TokensBody"), keys(&tokens));
    assert_eq!(properties(&doc, "TokenInfo"), keys(&tokens["tokens"][0]));
}
