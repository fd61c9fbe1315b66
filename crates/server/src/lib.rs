//! An object-metadata HTTP service on Postgres (modeled on lakeFS), reading
//! through the micro-batcher, so the whole stack can be load-tested end to
//! end.
//!
//! [`app()`] builds the router from an [`AppState`]; `main` reads the
//! configuration, opens the database, and serves it.
//!
//! # Layers
//!
//! Each folder is a subsystem, and a module imports only from the ones
//! below it (each folder's `mod.rs` says what it owns):
//!
//! ```text
//! lib        the route table, layers and fallbacks
//! testing    (feature `testing`) a seeded database for tests and benchmarks
//! http       the edge: connections (serve), observe, guard, deadlines, extractors, errors as
//!            responses, write positions, the handlers (routes/*) and the OpenAPI document
//! service    AppState and Pools, built from Settings; the listener applying other
//!            instances' changes to the caches (invalidation)
//! metrics    the registry, HTTP metrics, the scrape-time collector, process_* from /proc
//! domain     reads (the registry of lookups), lookup (naive, batched, cached), listing,
//!            writes (which invalidate through reads), import, auth, input validation, Failure
//! cluster    replicas (which database serves a read) and coherence (whether caches may be used)
//! db         the database, migrations and pool; queries/* (all SQL), TLS to Postgres, demo data
//! cli        clap flags and their conversion to Settings (for `main`; benches reuse PolicyArg)
//! settings   typed settings, the edge's included, with every default
//! logs       where log lines go: standard error, through a writer thread
//! model      the data handed out (objects, repositories, tokens, grants), with their JSON and
//!            OpenAPI shapes; imports nothing of the crate
//! ```
//!
//! A read goes `http::routes` → [`Reads`](domain::reads::Reads) →
//! [`Lookup`](domain::lookup::Lookup) → a [`pgbatch::Batcher`] (and cache)
//! or the pool → a [`db::queries`] statement; a write goes `http::routes` →
//! [`Writes`](domain::writes::Writes) → the micro-batched writer or COPY →
//! `db::queries`, then invalidates through `Reads`.

pub mod cli;
pub mod cluster;
pub mod db;
pub mod domain;
pub mod http;
pub mod logs;
pub mod metrics;
pub mod model;
pub mod service;
pub mod settings;
#[cfg(feature = "testing")]
pub mod testing;

use axum::extract::DefaultBodyLimit;
use axum::Router;
use tower::ServiceBuilder;

use crate::http::{guard, observe, openapi};

pub use crate::service::state::AppState;

/// The service's router.
pub fn app(state: AppState) -> Router {
    use http::routes::{fallback, lakefs};
    // Each documented route is registered from its handler's annotation
    // (`openapi::protected_routes`, `openapi::open_routes`), so its path
    // and methods are written once. Every /api route needs a token;
    // health, metrics and the document stay open.
    let (api, _) = openapi::protected_routes().split_for_parts();
    let (open, _) = openapi::open_routes().split_for_parts();
    let lakefs = protected(lakefs::routes(), &state).merge(lakefs::open_routes());
    Router::new()
        .merge(protected(api, &state))
        .merge(open)
        .nest("/lakefs", lakefs.clone())
        .nest("/lakefs/api/v1", lakefs)
        .fallback(fallback::no_route)
        .method_not_allowed_fallback(fallback::wrong_method)
        // One `layer` call for both: axum wraps each layer it is given in
        // a boxed route that every request clones (BENCHMARKS.md, "Over HTTP"),
        // while a `ServiceBuilder` nests them unboxed.
        .layer(
            ServiceBuilder::new()
                .layer(observe::ObserveLayer::new(state.metrics.http()))
                .layer(DefaultBodyLimit::max(state.settings.limits.max_body_bytes)),
        )
        .with_state(state)
}

/// `routes` behind the [`guard`] every authenticated route passes: the
/// deadline, the token check, and read-your-writes positions on writes.
fn protected(routes: Router<AppState>, state: &AppState) -> Router<AppState> {
    routes.route_layer(guard::GuardLayer::new(state))
}
