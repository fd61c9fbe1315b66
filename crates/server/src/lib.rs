//! An object-metadata HTTP service on Postgres (modeled on lakeFS), reading
//! through the micro-batcher, so the whole stack can be load-tested end to
//! end.
//!
//! Data flows one way: HTTP ([`api`]) → authentication ([`auth`]) → input
//! checks ([`input`]) → the read path ([`read_path`]: naive, batched through
//! a [`batcher::Batcher`], or cached in front of it) → the Postgres loaders
//! ([`queries`]) → Postgres ([`db`]).
//!
//! [`app`] builds the router from an [`AppState`]; `main` reads the
//! configuration, opens the database, and serves it.

pub mod api;
pub mod auth;
pub mod config;
pub mod db;
pub mod error;
pub mod input;
pub mod metrics;
pub mod queries;
pub mod read_path;
pub mod seed;
pub mod write_path;

use std::any::Any;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use batcher::pg::Pool;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

use crate::auth::Authenticator;
use crate::config::ServeArgs;
use crate::error::AppError;
use crate::metrics::Metrics;
use crate::read_path::Reader;
use crate::write_path::Writes;

/// Request limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most paths in one `POST .../objects/stat`.
    pub max_stat_paths: usize,
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: usize,
}

/// What every handler shares. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Inner>);

/// The contents of [`AppState`].
#[derive(Debug)]
pub struct Inner {
    /// The read path.
    pub reader: Reader,
    /// Resolves bearer tokens.
    pub auth: Authenticator,
    /// The write path.
    pub writes: Writes,
    /// The connection pool (readiness checks).
    pub pool: Pool,
    /// The metrics registry.
    pub metrics: Metrics,
    /// Request limits.
    pub limits: Limits,
}

impl std::ops::Deref for AppState {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    /// State for serving from `pool` with the settings in `args`; starts the
    /// batchers on the current runtime when the read path is batched.
    ///
    /// # Errors
    ///
    /// When a batcher setting is invalid.
    pub fn new(pool: Pool, args: &ServeArgs) -> anyhow::Result<Self> {
        let reader = Reader::new(pool.clone(), args)?;
        let auth = Authenticator::new(pool.clone(), args.auth_cache())?;
        let writes = Writes::new(pool.clone(), reader.clone(), args)?;
        let metrics = Metrics::new(reader.clone(), writes.clone(), auth.clone(), pool.clone());
        Ok(Self(Arc::new(Inner {
            reader,
            auth,
            writes,
            pool,
            metrics,
            limits: Limits {
                max_stat_paths: args.max_stat_paths,
                max_body_bytes: args.max_body_bytes,
            },
        })))
    }
}

/// The service's router.
pub fn app(state: AppState) -> Router {
    let stat = get(api::stat_object).post(api::stat_objects);
    let repos = get(api::list_repositories).post(api::create_repository);
    let object = axum::routing::put(api::put_object).delete(api::delete_object);
    // Every /api route needs a token; health and metrics stay open.
    let api = Router::new()
        .route("/api/v1/repositories", repos)
        .route(
            "/api/v1/repositories/{repo}",
            axum::routing::delete(api::delete_repository),
        )
        .route("/api/v1/repositories/{repo}/objects", object)
        .route(
            "/api/v1/repositories/{repo}/objects/import",
            axum::routing::post(api::import_objects),
        )
        .route("/api/v1/repositories/{repo}/objects/stat", stat)
        .route("/api/v1/kv/{pk}", get(api::kv_row))
        .route("/api/v1/user", get(api::current_user))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ));
    Router::new()
        .merge(api)
        .route("/healthz", get(api::healthz))
        .route("/readyz", get(api::readyz))
        .route("/metrics", get(api::metrics))
        .fallback(api::no_route)
        .method_not_allowed_fallback(api::wrong_method)
        .layer(DefaultBodyLimit::max(state.limits.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            metrics::track,
        ))
        .layer(TraceLayer::new_for_http())
        // A bug must cost one request a 500, not the connection or process.
        .layer(CatchPanicLayer::custom(panic_response))
        .with_state(state)
}

fn panic_response(panic: Box<dyn Any + Send + 'static>) -> Response {
    let detail = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    tracing::error!(panic = %detail, "handler panicked");
    AppError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "internal server error",
    )
    .into_response()
}
