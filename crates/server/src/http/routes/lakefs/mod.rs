//! A lakeFS-compatible API, so that lakeFS's own clients (the `lakefs-sdk`
//! and `lakefs` Python packages, `lakectl`) work against this service
//! unchanged. It is mounted at `/lakefs` and `/lakefs/api/v1` (a client
//! whose host has a path uses it as given; one without adds `/api/v1`),
//! and speaks lakeFS's shapes (`api/swagger.yml`) over the same reads and
//! writes as the service's own API: the batched, cached object-stat
//! lookup, the micro-batched writer, the same authentication, deadlines,
//! admission, metrics and read-your-writes.
//!
//! - Each repository has one branch, named at creation (`main` unless
//!   given). It is the only ref: any other ref or branch is 404. There are
//!   no commits, so reading a branch shows its writes at once.
//! - Credentials: `Authorization: Bearer <token>`, or Basic with a token's
//!   id (`token list` shows it) as the access key id and the token as the
//!   secret, which is what lakeFS's clients send. A new pair comes from
//!   the CLI (`token create`) or from lakeFS's `createCredentials`.
//! - Errors carry lakeFS's `{"message"}` (beside this service's `error`
//!   object); a `HEAD` answers with its status alone.
//! - Objects carry metadata only: there is no upload or download of data.
//!   `getPhysicalAddress` hands out a fresh address in the repository's
//!   namespace and `linkPhysicalAddress` registers the object there.

mod errors;
mod objects;
mod query;
mod repositories;
mod setup;
mod shapes;
mod unserved;

use axum::routing::{get, head, post, put};
use axum::Router;

use crate::service::state::AppState;

/// Now in Unix seconds, as lakeFS's shapes give times.
fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The routes that need credentials, relative to the mount point: those
/// served, and a 501 for every other operation of lakeFS's API.
pub(crate) fn routes() -> Router<AppState> {
    unserved::add_to(served())
}

fn served() -> Router<AppState> {
    Router::new()
        .route("/config", get(setup::config))
        .route("/config/version", get(setup::version))
        .route("/config/storage", get(setup::storage))
        .route("/user", get(setup::current_user))
        .route(
            "/auth/users/{userId}/credentials",
            post(setup::create_credentials),
        )
        .route("/statistics", post(setup::statistics))
        .route(
            "/repositories",
            get(repositories::list).post(repositories::create),
        )
        .route(
            "/repositories/{repository}",
            get(repositories::get).delete(repositories::delete),
        )
        .route(
            "/repositories/{repository}/branches",
            get(repositories::branches),
        )
        .route(
            "/repositories/{repository}/branches/{branch}",
            get(repositories::branch),
        )
        .route(
            "/repositories/{repository}/refs/{ref}/objects/stat",
            get(objects::stat),
        )
        .route(
            "/repositories/{repository}/refs/{ref}/objects",
            head(objects::head),
        )
        .route(
            "/repositories/{repository}/refs/{ref}/objects/ls",
            get(objects::list),
        )
        .route(
            "/repositories/{repository}/branches/{branch}/objects",
            put(objects::stage).delete(objects::delete),
        )
        .route(
            "/repositories/{repository}/branches/{branch}/objects/delete",
            post(objects::delete_many),
        )
        .route(
            "/repositories/{repository}/branches/{branch}/staging/backing",
            get(objects::physical_address).put(objects::link),
        )
}

/// The routes open to anyone, relative to the mount point.
pub(crate) fn open_routes() -> Router<AppState> {
    Router::new().route("/healthcheck", get(setup::healthcheck))
}
