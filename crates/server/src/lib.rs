//! An object-metadata HTTP service on Postgres (modeled on lakeFS), reading
//! through the micro-batcher, so the whole stack can be load-tested end to
//! end.
//!
//! [`app`] builds the router from an [`AppState`]; `main` reads the
//! configuration, opens the database, and serves it.
//!
//! # Layers
//!
//! A module imports only from modules below it:
//!
//! ```text
//! lib            the route table, layers and fallbacks
//! openapi        the OpenAPI document, gathered from the handlers' annotations
//! routes/*       one handler module per resource
//! deadline       every request's deadline, by kind (read, write, import)
//! extract        extractors (caller, repository, object path, JSON) and the token middleware
//! position       read-your-writes over HTTP: x-pgbatch-lsn on writes' answers, read back from reads
//! error          AppError: a Failure or rejection as an HTTP response
//! state          AppState and Pools (read, write, import, replicas), built from Settings; starts
//!                the listener and the replica poller
//! invalidation   the LISTEN/NOTIFY listener applying other instances' changes to the caches
//! testing        a seeded database for tests and benchmarks
//! metrics        the registry, the scrape-time collector, the `track` middleware
//! process        `process_*` metrics from /proc
//! writes         upserts, deletes, imports, repositories; invalidates through `reads`
//! import         the NDJSON body as a COPY row source
//! reads          the registry of lookups, one per query kind
//! lookup         Lookup<Q>: get / get_many over naive, batched or cached
//! auth           tokens, principals, grants, the authenticator, user admin
//! replicas       ReadRouter: which database a read goes to (replicas that keep up, else the primary)
//! coherence      whether the caches may be used (off while the listener is down)
//! input          validation and strict query decoding
//! seed, db       demo data; the database, migrations and pool
//! config         clap flags to Settings and EdgeSettings (for `main`; benches reuse PolicyArg)
//! serve          the HTTP/1 edge: header-read timeout, head size, connection cap, graceful shutdown
//! queries/*      all SQL, one module per table or concern
//! failure        Failure, the domain error, from one classification
//! settings       typed settings with their defaults
//! tls            TLS to Postgres on rustls: libpq's sslmode and sslrootcert
//! ```
//!
//! A read goes `routes` → `reads` → [`Lookup`](lookup::Lookup) → a
//! [`pgbatch::Batcher`] (and cache) or the pool → a [`queries`] statement;
//! a write goes `routes` → [`Writes`](writes::Writes) → the micro-batched
//! writer or COPY → `queries`, then invalidates through `reads`.

pub mod auth;
pub mod coherence;
pub mod config;
pub mod db;
pub mod deadline;
pub mod error;
pub mod extract;
pub mod failure;
pub mod import;
pub mod input;
pub mod invalidation;
pub mod listing;
pub mod lookup;
pub mod metrics;
pub mod openapi;
pub mod position;
pub mod process;
pub mod queries;
pub mod reads;
pub mod replicas;
mod routes;
pub mod seed;
pub mod serve;
pub mod settings;
pub mod state;
pub mod testing;
pub mod tls;
pub mod writes;

use std::time::Duration;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::middleware::from_fn_with_state;
use axum::response::Response;
use axum::routing::{delete, get, post, put};
use axum::Router;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::classify::{ServerErrorsAsFailures, SharedClassifier};
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::{DefaultOnRequest, MakeSpan, OnResponse, TraceLayer};

pub use crate::state::AppState;

/// The service's router.
pub fn app(state: AppState) -> Router {
    use routes::{health, kv, lakefs, objects, repositories, user};
    // Every /api route needs a token; health and metrics stay open.
    let api = Router::new()
        .route(
            "/api/v1/repositories",
            get(repositories::list).post(repositories::create),
        )
        .route("/api/v1/repositories/{repo}", delete(repositories::delete))
        .route(
            "/api/v1/repositories/{repo}/objects",
            put(objects::put).delete(objects::delete),
        )
        .route(deadline::IMPORT_ROUTE, post(objects::import))
        .route(
            "/api/v1/repositories/{repo}/objects/stat",
            get(objects::stat).post(objects::stat_many),
        )
        .route("/api/v1/kv/{pk}", get(kv::get))
        .route("/api/v1/user", get(user::current))
        .route("/api/v1/user/tokens", get(user::tokens))
        .route("/api/v1/user/tokens/{id}", delete(user::revoke));
    let api = protected(api, &state);
    let lakefs = protected(lakefs::routes(), &state).merge(lakefs::open_routes());
    Router::new()
        .merge(api)
        .nest("/lakefs", lakefs.clone())
        .nest("/lakefs/api/v1", lakefs)
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .route("/api/openapi.json", get(openapi::document_route))
        .fallback(health::no_route)
        .method_not_allowed_fallback(health::wrong_method)
        .layer(DefaultBodyLimit::max(state.settings.limits.max_body_bytes))
        .layer(from_fn_with_state(state.metrics.clone(), metrics::track))
        .layer(request_log())
        // A bug must cost one request a 500, not the connection or process.
        .layer(CatchPanicLayer::custom(error::panic_response))
        // Outermost, so every response carries the id, a panic's included.
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(RandomRequestId))
        .with_state(state)
}

/// `routes` behind the layers every authenticated route has, innermost
/// first: read-your-writes positions on writes, the token check, and the
/// deadline (outside the token check, so a token lookup on a cache miss
/// runs under the request's deadline too).
fn protected(routes: Router<AppState>, state: &AppState) -> Router<AppState> {
    routes
        .route_layer(from_fn_with_state(state.clone(), position::stamp_writes))
        // Behind an Arc: axum clones a middleware's state for every
        // request, and an `Authenticator` is several handles (BENCHMARKS.md
        // §7, the bare route's profile).
        .route_layer(from_fn_with_state(
            std::sync::Arc::new(state.auth.clone()),
            extract::require_token,
        ))
        .route_layer(from_fn_with_state(
            deadline::Deadlines::of(&state.settings),
            deadline::enforce,
        ))
}

/// Request ids as tower-http's `MakeRequestUuid` makes them (random UUIDs,
/// version 4), from the thread's random generator: `MakeRequestUuid` asks
/// the kernel for 16 bytes per request, a system call that took about 2%
/// of the server's CPU on the no-database route (BENCHMARKS.md §7).
#[derive(Debug, Clone, Copy)]
struct RandomRequestId;

impl MakeRequestId for RandomRequestId {
    fn make_request_id<B>(&mut self, _: &Request<B>) -> Option<RequestId> {
        // One `u128` draws 16 bytes of the generator's stream; an array of
        // 16 `u8`s would draw 4 bytes for each.
        let id = uuid::Builder::from_random_bytes(rand::random::<u128>().to_le_bytes()).into_uuid();
        let mut text = [0; uuid::fmt::Hyphenated::LENGTH];
        let text = id.hyphenated().encode_lower(&mut text);
        axum::http::HeaderValue::from_str(text)
            .ok()
            .map(RequestId::new)
    }
}

/// One log line per request, at `info`: method, matched route (never the
/// raw URI, whose query may name private paths), request id, status and
/// latency. Headers are never logged: they carry bearer tokens.
fn request_log() -> TraceLayer<
    SharedClassifier<ServerErrorsAsFailures>,
    impl MakeSpan<Body> + Clone,
    DefaultOnRequest,
    impl OnResponse<Body> + Clone,
> {
    TraceLayer::new_for_http()
        .make_span_with(|req: &Request<Body>| {
            let route = req
                .extensions()
                .get::<MatchedPath>()
                .map_or("(no route)", MatchedPath::as_str);
            let id = req
                .headers()
                .get("x-request-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            tracing::info_span!("request", method = %req.method(), route, request_id = id)
        })
        .on_response(
            |res: &Response<Body>, latency: Duration, _: &tracing::Span| {
                tracing::info!(
                    status = res.status().as_u16(),
                    latency_ms = latency.as_secs_f64() * 1e3,
                    "served"
                );
            },
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_distinct_random_uuids() {
        let req = Request::new(());
        let mut make = RandomRequestId;
        let ids: std::collections::HashSet<String> = (0..1000)
            .map(|_| {
                let id = make.make_request_id(&req).expect("an id");
                let text = id.header_value().to_str().unwrap().to_owned();
                let parsed = uuid::Uuid::parse_str(&text).expect("a UUID");
                assert_eq!(parsed.get_version(), Some(uuid::Version::Random), "{text}");
                assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122, "{text}");
                assert_eq!(
                    text,
                    parsed.hyphenated().to_string(),
                    "lowercase, hyphenated"
                );
                text
            })
            .collect();
        assert_eq!(ids.len(), 1000, "no repeats");
    }
}
