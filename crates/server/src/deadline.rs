//! Every request's deadline: a middleware that answers 504 when a request
//! (its token lookup included) runs past the deadline of its kind, and
//! drops the handler so nothing keeps waiting for it.
//!
//! A client-side timer is needed even though the pools' connections carry
//! a `statement_timeout`: a frozen or partitioned database answers nothing,
//! not even its own timeout. The statement timeout makes Postgres give up
//! on the work too, whenever it is alive to do so.

use std::time::Duration;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::AppError;
use crate::failure::{Failure, Work};
use crate::settings::Settings;

/// The import route, whose requests have their own (long) deadline.
pub const IMPORT_ROUTE: &str = "/api/v1/repositories/{repo}/objects/import";

/// The deadline of each kind of request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// Lookups and other reads (including `POST .../objects/stat`).
    pub read: Duration,
    /// Upserts, deletes, repository changes.
    pub write: Duration,
    /// Imports, upload included.
    pub import: Duration,
}

impl Deadlines {
    /// The deadlines `settings` ask for.
    pub fn of(settings: &Settings) -> Self {
        Self {
            read: settings.read.timeout,
            write: settings.write.timeout,
            import: settings.import.timeout,
        }
    }

    /// The deadline of a `method` request to `route`, and what kind of
    /// work it is.
    pub fn for_route(&self, method: &Method, route: &str) -> (Duration, Work) {
        if route == IMPORT_ROUTE {
            (self.import, Work::Write)
        } else if method == Method::GET || route.ends_with("/objects/stat") {
            (self.read, Work::Read)
        } else {
            (self.write, Work::Write)
        }
    }
}

/// Runs the request under its route's deadline; past it, 504 `timeout`.
/// Leaves the request's kind of [`Work`] in its extensions, for the layers
/// inside that treat writes apart (see [`crate::position`]).
pub async fn enforce(State(deadlines): State<Deadlines>, mut req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("", MatchedPath::as_str);
    let (limit, work) = deadlines.for_route(req.method(), route);
    req.extensions_mut().insert(work);
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(response) => response,
        Err(_) => AppError::from(Failure::Timeout(work)).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_route_kind_gets_its_deadline() {
        let d = Deadlines {
            read: Duration::from_millis(1),
            write: Duration::from_millis(2),
            import: Duration::from_millis(3),
        };
        let stat = "/api/v1/repositories/{repo}/objects/stat";
        assert_eq!(d.for_route(&Method::GET, stat), (d.read, Work::Read));
        assert_eq!(d.for_route(&Method::POST, stat), (d.read, Work::Read));
        assert_eq!(
            d.for_route(&Method::GET, "/api/v1/kv/{pk}"),
            (d.read, Work::Read)
        );
        let objects = "/api/v1/repositories/{repo}/objects";
        assert_eq!(d.for_route(&Method::PUT, objects), (d.write, Work::Write));
        assert_eq!(
            d.for_route(&Method::DELETE, objects),
            (d.write, Work::Write)
        );
        assert_eq!(
            d.for_route(&Method::POST, "/api/v1/repositories"),
            (d.write, Work::Write)
        );
        assert_eq!(
            d.for_route(&Method::POST, IMPORT_ROUTE),
            (d.import, Work::Write)
        );
    }
}
