//! The OpenAPI document of every route, served at `/api/openapi.json`.
//!
//! Each handler carries its own `#[utoipa::path]` next to its code; this
//! module gathers them. A test (`tests/openapi.rs`) probes the router and
//! fails when a route or method it serves is missing here, or the other
//! way round.

use std::sync::OnceLock;

use axum::http::header;
use axum::response::IntoResponse;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::error::{ErrorBody, ErrorDetail};
use crate::routes::{health, kv, objects, repositories, user};

/// The document.
#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "pgbatch-server",
        description = "Object metadata (repositories, objects by path) on Postgres, read through a micro-batcher. \
            Every error is `{\"error\": {\"code\", \"message\"}}`; a 503 carries `Retry-After`.",
        license(name = "MIT OR Apache-2.0"),
    ),
    paths(
        objects::stat,
        objects::stat_many,
        objects::put,
        objects::delete,
        objects::import,
        repositories::create,
        repositories::list,
        repositories::delete,
        kv::get,
        user::current,
        user::tokens,
        user::revoke,
        health::healthz,
        health::readyz,
        health::metrics,
        document_route,
    ),
    components(schemas(ErrorBody, ErrorDetail, health::StatusBody)),
    modifiers(&BearerAuth),
    tags(
        (name = "objects", description = "Objects of a repository, by path"),
        (name = "repositories", description = "Repositories"),
        (name = "kv", description = "The seed benchmark's table over HTTP"),
        (name = "user", description = "The caller and their tokens"),
        (name = "health", description = "Liveness, readiness, metrics and this document: no token needed"),
    )
)]
pub struct ApiDoc;

/// Adds the `bearer` security scheme the `/api` routes name.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The document, with this build's version.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    env!("CARGO_PKG_VERSION").clone_into(&mut doc.info.version);
    doc
}

/// `GET /api/openapi.json`: this document (no token needed).
#[utoipa::path(
    get,
    path = "/api/openapi.json",
    tag = "health",
    responses((status = 200, description = "This OpenAPI document", content_type = "application/json"))
)]
pub(crate) async fn document_route() -> impl IntoResponse {
    // Rendered once: the document is fixed for the process's life.
    static JSON: OnceLock<String> = OnceLock::new();
    let json = JSON.get_or_init(|| {
        document()
            .to_pretty_json()
            .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    });
    ([(header::CONTENT_TYPE, "application/json")], json.as_str())
}
