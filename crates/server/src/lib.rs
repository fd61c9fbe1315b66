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
//! observe        every request's id, span, log line, metrics and caught panic
//! guard          the one middleware of authenticated routes: deadline, token check, write positions
//! deadline       every request's deadline, by kind (read, write, import)
//! extract        extractors (caller, repository, object path, JSON) and the token check
//! position       read-your-writes over HTTP: x-pgbatch-lsn on writes' answers, read back from reads
//! error          AppError: a Failure or rejection as an HTTP response
//! state          AppState and Pools (read, write, import, replicas), built from Settings; starts
//!                the listener and the replica poller
//! invalidation   the LISTEN/NOTIFY listener applying other instances' changes to the caches
//! testing        a seeded database for tests and benchmarks
//! metrics        the registry, the scrape-time collector
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
pub mod guard;
pub mod import;
pub mod input;
pub mod invalidation;
pub mod listing;
pub mod lookup;
pub mod metrics;
pub mod observe;
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

use axum::extract::DefaultBodyLimit;
use axum::middleware::from_fn_with_state;
use axum::routing::{delete, get, post, put};
use axum::Router;
use tower::ServiceBuilder;

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
        // One `layer` call for both: axum wraps each layer it is given in
        // a boxed route that every request clones (BENCHMARKS.md §7),
        // while a `ServiceBuilder` nests them unboxed.
        .layer(
            ServiceBuilder::new()
                .layer(from_fn_with_state(state.metrics.http(), observe::observe))
                .layer(DefaultBodyLimit::max(state.settings.limits.max_body_bytes)),
        )
        .with_state(state)
}

/// `routes` behind the [`guard`] every authenticated route passes: the
/// deadline, the token check, and read-your-writes positions on writes.
fn protected(routes: Router<AppState>, state: &AppState) -> Router<AppState> {
    routes.route_layer(from_fn_with_state(guard::Guard::new(state), guard::guard))
}
