//! The OpenAPI document of every route, served at `/api/openapi.json`.
//!
//! Each handler carries its own `#[utoipa::path]` next to its code; this
//! module registers each documented route from it (utoipa-axum's
//! `OpenApiRouter` and `routes!`, so a route's path and methods are
//! written once, in its annotation, and the router and the document
//! cannot disagree), gathers the document, and states on every parameter and field the rule
//! the server enforces on it (`Constraints`, from the constants of
//! [`crate::domain::input`], so the document and the checks cannot drift), and on
//! every operation the statuses any request may get (401 without a token,
//! 503 when overloaded, 504 past the deadline `deadline::Kind` gives the
//! route; 400, 408, 413 and 415 for a body). Annotations state only what
//! is particular to their operation, so these are written once. A test (`tests/http/openapi.rs`) probes the router and fails when a
//! route or method it serves is missing here, or the other way round;
//! another (`tests/http/openapi_fuzz.rs`) points schemathesis at the document.
//!
//! Lengths are stated in characters, as JSON Schema counts them; the
//! server counts bytes of UTF-8 (S3's and lakeFS's rule for paths), which
//! the descriptions say. A bad input is always 400, whether it is
//! malformed JSON, JSON of the wrong shape, or a value breaking a rule;
//! 422 is not used.

use axum::extract::State;
use axum::http::{header, Method};
use axum::response::IntoResponse;
use utoipa::openapi::path::{Operation, ParameterIn};
use utoipa::openapi::request_body::RequestBody;
use utoipa::openapi::schema::{
    AdditionalProperties, ArrayBuilder, Object, ObjectBuilder, Schema, SchemaFormat, SchemaType,
    Type,
};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, KnownFormat, Ref, RefOr, Required, ResponseBuilder};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::input::{
    CONFLICT_POLICIES, KEY_PATTERN, MAX_FIELD_BYTES, MAX_METADATA_ENTRIES, MAX_PATH_BYTES,
    MAX_PK_BYTES, NO_NUL_PATTERN, REPOSITORY_NAME_PATTERN, TOKEN_ID_PATTERN,
};
use crate::http::deadline;
use crate::http::error::{ErrorBody, ErrorDetail};
use crate::http::position::POSITION_PATTERN;
use crate::http::routes::{health, kv, metrics, objects, repositories, user};
use crate::service::state::AppState;
use crate::settings::Limits;

/// The document.
#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "pgbatch-server",
        description = "Object metadata (repositories, objects by path) on Postgres, read through a micro-batcher. \
            Every error is `{\"error\": {\"code\", \"message\"}}`; a 503 carries `Retry-After`.",
        license(name = "MIT OR Apache-2.0"),
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

/// The `/api` routes that need a token, each registered from its
/// handler's annotation: the route and its document are written once.
/// Routes sharing a path go in one `routes!`.
pub(crate) fn protected_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(repositories::list, repositories::create))
        .routes(routes!(repositories::delete))
        .routes(routes!(objects::put, objects::delete))
        .routes(routes!(objects::import))
        .routes(routes!(objects::stat, objects::stat_many))
        .routes(routes!(kv::get))
        .routes(routes!(user::current))
        .routes(routes!(user::tokens))
        .routes(routes!(user::revoke))
}

/// The documented routes open to every caller.
pub(crate) fn open_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(metrics::metrics))
        .routes(routes!(document_route))
}

/// The document, with this build's version and the request limits of
/// `limits`.
pub fn document(limits: &Limits) -> utoipa::openapi::OpenApi {
    let mut doc = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(protected_routes())
        .merge(open_routes())
        .into_openapi();
    env!("CARGO_PKG_VERSION").clone_into(&mut doc.info.version);
    Constraints { limits: *limits }.modify(&mut doc);
    doc
}

/// States the server's rules on the document (see the module docs).
struct Constraints {
    limits: Limits,
}

impl Modify for Constraints {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (route, item) in &mut openapi.paths.paths {
            let operations = [
                (Method::GET, &mut item.get),
                (Method::PUT, &mut item.put),
                (Method::POST, &mut item.post),
                (Method::DELETE, &mut item.delete),
            ];
            for (method, op) in operations {
                let Some(op) = op else { continue };
                self.parameters(op);
                self.bodies(route, op);
                common_statuses(&method, route, op);
            }
        }
        let components = openapi.components.get_or_insert_with(Default::default);
        let schemas = &mut components.schemas;
        if let Some(RefOr::T(Schema::Object(repo))) = schemas.get_mut("NewRepository") {
            set(repo, "name", repository_name());
            set(
                repo,
                "storage_namespace",
                text(1, MAX_FIELD_BYTES, "Where the repository's data lives"),
            );
        }
        if let Some(RefOr::T(Schema::Object(req))) = schemas.get_mut("StatRequest") {
            let paths = ArrayBuilder::new()
                .items(object_path())
                .min_items(Some(1))
                .max_items(Some(self.limits.max_stat_paths))
                .description(Some(format!(
                    "1 to {} object paths (`--max-stat-paths`)",
                    self.limits.max_stat_paths
                )));
            set(req, "paths", paths.build().into());
        }
        // `ObjectBody` is two shapes on the wire: a PUT's fields (no
        // `path`: it is in the query string) and an import line (with it).
        if let Some(RefOr::T(Schema::Object(mut body))) = schemas.remove("ObjectBody") {
            object_fields(&mut body);
            let mut line = body.clone();
            body.properties.remove("path");
            body.required.retain(|f| f != "path");
            body.description =
                Some("An object's fields: the body of `PUT .../objects?path=P`".into());
            set(&mut line, "path", object_path());
            if !line.required.iter().any(|f| f == "path") {
                line.required.push("path".into());
            }
            line.description =
                Some("One line of an import: an object's fields and its `path`".into());
            schemas.insert("ObjectFields".into(), Schema::Object(body).into());
            schemas.insert("ImportLine".into(), Schema::Object(line).into());
        }
    }
}

impl Constraints {
    /// Each parameter's rule, by name: the same name means the same rule
    /// on every route.
    fn parameters(&self, op: &mut Operation) {
        for p in op.parameters.iter_mut().flatten() {
            let schema = match (&p.parameter_in, p.name.as_str()) {
                (ParameterIn::Path, "repo") => repository_name(),
                (ParameterIn::Query, "path") => object_path(),
                (ParameterIn::Path, "pk") => pattern(
                    1,
                    MAX_PK_BYTES,
                    KEY_PATTERN,
                    &format!("1 to {MAX_PK_BYTES} bytes, no control characters"),
                ),
                (ParameterIn::Path, "id") => pattern(
                    16,
                    16,
                    TOKEN_ID_PATTERN,
                    "A token's id: 16 lowercase hex digits",
                ),
                (ParameterIn::Header, "x-pgbatch-lsn") => pattern(
                    3,
                    17,
                    POSITION_PATTERN,
                    "A WAL position such as `16/B374D848`",
                ),
                (ParameterIn::Query, "policy") => ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(CONFLICT_POLICIES.map(|(name, _)| name)))
                    .build()
                    .into(),
                _ => continue,
            };
            p.schema = Some(schema);
        }
    }

    /// The request bodies whose schemas [`Constraints::modify`] renames.
    fn bodies(&self, route: &str, op: &mut Operation) {
        let Some(body) = op.request_body.as_mut() else {
            return;
        };
        if route.ends_with("/objects") {
            set_body(
                body,
                "application/json",
                Ref::from_schema_name("ObjectFields").into(),
            );
        } else if route.ends_with("/objects/import") {
            // A sequence of JSON values, described as OpenAPI 3.2 describes
            // sequential media types: `schema` as if the lines were an array.
            let lines = ArrayBuilder::new()
                .items(RefOr::Ref(Ref::from_schema_name("ImportLine")))
                .description(Some(
                    "One `ImportLine` per line (newline-delimited JSON); empty lines are skipped",
                ));
            set_body(body, "application/x-ndjson", lines.build().into());
            // No body is no lines: an import of nothing, answered 200.
            body.required = Some(Required::False);
        }
    }
}

/// Sets `content_type`'s schema in `body`.
fn set_body(body: &mut RequestBody, content_type: &str, schema: RefOr<Schema>) {
    let content = body
        .content
        .entry(content_type.to_owned())
        .or_insert_with(|| Content::new(None::<RefOr<Schema>>));
    content.schema = Some(schema);
}

/// Replaces property `name` of `object`.
fn set(object: &mut Object, name: &str, schema: RefOr<Schema>) {
    object.properties.insert(name.to_owned(), schema);
}

/// An object's fields as [`crate::domain::input::ObjectBody::into_row`] checks
/// them.
fn object_fields(body: &mut Object) {
    set(
        body,
        "physical_address",
        text(1, MAX_FIELD_BYTES, "Where the object's data is stored"),
    );
    set(
        body,
        "checksum",
        text(1, MAX_FIELD_BYTES, "The data's checksum"),
    );
    set(
        body,
        "content_type",
        nullable(text(
            1,
            MAX_FIELD_BYTES,
            "MIME type; `application/octet-stream` when absent or null",
        )),
    );
    let size = ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
        .minimum(Some(0))
        .maximum(Some(i64::MAX))
        .description(Some("Size of the data in bytes"));
    set(body, "size_bytes", size.build().into());
    let metadata = ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .max_properties(Some(MAX_METADATA_ENTRIES))
        .property_names(Some(text_schema(1, MAX_FIELD_BYTES, NO_NUL_PATTERN)))
        .additional_properties(Some(AdditionalProperties::RefOr(RefOr::T(Schema::Object(
            text_schema(0, MAX_FIELD_BYTES, NO_NUL_PATTERN),
        )))))
        .description(Some(format!(
            "User metadata: at most {MAX_METADATA_ENTRIES} entries of string values; \
             keys and values at most {MAX_FIELD_BYTES} bytes, keys not empty"
        )));
    set(body, "metadata", metadata.build().into());
}

/// A string of `min..=max` bytes without NUL, described.
fn text(min: usize, max: usize, what: &str) -> RefOr<Schema> {
    pattern(
        min,
        max,
        NO_NUL_PATTERN,
        &format!("{what}: {min} to {max} bytes of UTF-8, no NUL"),
    )
}

/// A string of `min..=max` bytes (characters, to JSON Schema) matching
/// `regex`, described.
fn pattern(min: usize, max: usize, regex: &str, what: &str) -> RefOr<Schema> {
    let mut schema = text_schema(min, max, regex);
    schema.description = Some(what.to_owned());
    Schema::Object(schema).into()
}

fn text_schema(min: usize, max: usize, regex: &str) -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(min))
        .max_length(Some(max))
        .pattern(Some(regex))
        .build()
}

/// `schema`, or null.
fn nullable(schema: RefOr<Schema>) -> RefOr<Schema> {
    match schema {
        RefOr::T(Schema::Object(mut o)) => {
            o.schema_type = SchemaType::from_iter([Type::String, Type::Null]);
            Schema::Object(o).into()
        }
        other => other,
    }
}

fn repository_name() -> RefOr<Schema> {
    pattern(
        3,
        63,
        REPOSITORY_NAME_PATTERN,
        "A repository name: 3 to 63 characters of a-z, 0-9 and '-', not starting with '-'",
    )
}

fn object_path() -> RefOr<Schema> {
    text(1, MAX_PATH_BYTES, "An object's path")
}

/// Adds the statuses every request of `op` may get, with the error body,
/// where the annotation did not name them.
fn common_statuses(method: &Method, route: &str, op: &mut Operation) {
    let authenticated = route.starts_with("/api/v1");
    let mut add = |status: &str, why: &str| {
        op.responses
            .responses
            .entry(status.to_owned())
            .or_insert_with(|| error_response(why));
    };
    if authenticated {
        add("401", "No, a malformed, an unknown or an expired token");
        add("503", "`overloaded` (load shed before any work) or `database_unavailable`, with `Retry-After`");
        let kind = deadline::Kind::of(method, route).name();
        add("504", &format!("`timeout`: past the {kind} deadline"));
    }
    if op.request_body.is_some() {
        add("400", "`invalid_json` (malformed, or not of the documented shape) or a field breaking its rule");
        add(
            "408",
            "`body_timeout`: the body paused too long, or took too long in all",
        );
        add("413", "`payload_too_large`: the body is over the limit");
        add(
            "415",
            "`unsupported_media_type`: not the documented content type",
        );
    }
}

fn error_response(why: &str) -> RefOr<utoipa::openapi::Response> {
    ResponseBuilder::new()
        .description(why)
        .content(
            "application/json",
            Content::new(Some(RefOr::Ref(Ref::from_schema_name("ErrorBody")))),
        )
        .build()
        .into()
}

/// `GET /api/openapi.json`: this document (no token needed).
#[utoipa::path(
    get,
    path = "/api/openapi.json",
    tag = "health",
    responses((status = 200, description = "This OpenAPI document", content_type = "application/json"))
)]
pub(crate) async fn document_route(State(state): State<AppState>) -> impl IntoResponse {
    let limits = &state.settings.limits;
    let json = state.openapi_json.get_or_init(|| render(limits)).clone();
    ([(header::CONTENT_TYPE, "application/json")], json)
}

/// The document for `limits`, as JSON; rendered once per state (kept in
/// [`AppState`]'s `openapi_json`, since it is fixed for the state's life).
fn render(limits: &Limits) -> String {
    document(limits)
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document as a client reads it.
    fn json() -> serde_json::Value {
        serde_json::from_str(&render(&Limits::default())).unwrap()
    }

    #[test]
    fn a_read_position_header_is_stated_as_the_server_parses_it() {
        let doc = json();
        for (route, method) in [
            ("/api/v1/repositories/{repo}/objects/stat", "get"),
            ("/api/v1/repositories/{repo}/objects/stat", "post"),
        ] {
            let params = doc["paths"][route][method]["parameters"]
                .as_array()
                .unwrap_or_else(|| panic!("{method} {route}: no parameters"));
            let lsn = params
                .iter()
                .find(|p| p["name"] == "x-pgbatch-lsn")
                .unwrap_or_else(|| panic!("{method} {route}: no x-pgbatch-lsn"));
            assert_eq!(lsn["in"], "header");
            assert_eq!(lsn["schema"]["pattern"], POSITION_PATTERN, "{lsn}");
        }
    }

    /// The statuses every authenticated operation may get come from one
    /// place, with the deadline the guard applies to that route.
    #[test]
    fn every_authenticated_operation_states_401_503_and_its_deadline() {
        let doc = json();
        let mut checked = 0;
        for (route, item) in doc["paths"].as_object().unwrap() {
            if !route.starts_with("/api/v1") {
                continue;
            }
            for (method, op) in item.as_object().unwrap() {
                let responses = &op["responses"];
                for status in ["401", "503", "504"] {
                    assert!(
                        responses[status]["content"]["application/json"].is_object(),
                        "{method} {route}: no {status} with the error body"
                    );
                }
                let method: Method = method.to_uppercase().parse().unwrap();
                let kind = deadline::Kind::of(&method, route).name();
                let why = responses["504"]["description"].as_str().unwrap();
                assert!(
                    why.contains(&format!("{kind} deadline")),
                    "{method} {route}: {why}"
                );
                checked += 1;
            }
        }
        assert!(checked >= 12, "only {checked} operations");
    }
}
