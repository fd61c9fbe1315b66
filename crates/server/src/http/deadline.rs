//! Every request's deadline: [`Deadlines::enforce`] (run by
//! [`crate::http::guard`]) answers 504 when a request (its token lookup
//! included) runs past the deadline of its kind, and drops the handler so
//! nothing keeps waiting for it.
//!
//! The deadline starts once the request's body has arrived. A body is read
//! whole first, under its own bounds ([`Upload`]): a pause between two
//! chunks longer than the idle timeout, or an upload longer than the total
//! one, is 408 `body_timeout`, a body over the size limit 413. So a client
//! on a slow link that takes two seconds to send a batch stat gets its
//! answer, and a client that stops sending is answered without waiting
//! for the deadline of work that has not started. Imports stream their
//! body into the database instead, so their deadline (upload included) and
//! idle timeout are their own (`crate::domain::import`).
//!
//! A client-side timer is needed even though the pools' connections carry
//! a `statement_timeout`: a frozen or partitioned database answers nothing,
//! not even its own timeout. The statement timeout makes Postgres give up
//! on the work too, whenever it is alive to do so.

use std::future::Future;
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody as _};
use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;

use crate::domain::failure::{Failure, Work};
use crate::http::error::AppError;
use crate::settings::Settings;

/// The import route, whose requests have their own (long) deadline.
pub const IMPORT_ROUTE: &str = "/api/v1/repositories/{repo}/objects/import";

/// The deadline of each kind of request, and the bounds of the body that
/// comes before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// Lookups and other reads (including `POST .../objects/stat`).
    pub read: Duration,
    /// Upserts, deletes, repository changes.
    pub write: Duration,
    /// Imports, upload included.
    pub import: Duration,
    /// How a (non-import) request body must arrive.
    pub upload: Upload,
}

/// The bounds on receiving a request body before its deadline starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Upload {
    /// Longest pause between two chunks.
    pub idle: Duration,
    /// Longest time for the whole body.
    pub total: Duration,
    /// Largest body, in bytes.
    pub max_bytes: usize,
}

impl Upload {
    /// `req` with its body read whole within these bounds.
    ///
    /// # Errors
    ///
    /// [`Failure::BodyStalled`] or [`Failure::BodyTooSlow`] (408),
    /// [`Failure::TooLarge`] (413), or [`Failure::Invalid`] when the body
    /// breaks off.
    pub async fn receive(&self, req: Request) -> Result<Request, Failure> {
        if req.body().size_hint().exact() == Some(0) {
            return Ok(req);
        }
        let (parts, body) = req.into_parts();
        let most = u64::try_from(self.max_bytes).unwrap_or(u64::MAX);
        if body.size_hint().lower() > most {
            return Err(Failure::TooLarge(self.max_bytes));
        }
        let collect = async {
            let mut body = body;
            let mut bytes = Vec::new();
            loop {
                let frame = match tokio::time::timeout(self.idle, body.frame()).await {
                    Err(_) => return Err(Failure::BodyStalled(self.idle)),
                    Ok(None) => return Ok(Bytes::from(bytes)),
                    Ok(Some(Err(e))) => {
                        return Err(Failure::invalid(
                            "invalid_body",
                            format!("the request body could not be read: {e}"),
                        ))
                    }
                    Ok(Some(Ok(frame))) => frame,
                };
                if let Ok(data) = frame.into_data() {
                    if bytes.len() + data.len() > self.max_bytes {
                        return Err(Failure::TooLarge(self.max_bytes));
                    }
                    bytes.extend_from_slice(&data);
                }
            }
        };
        let bytes = tokio::time::timeout(self.total, collect)
            .await
            .map_err(|_| Failure::BodyTooSlow(self.total))??;
        Ok(Request::from_parts(parts, Body::from(bytes)))
    }
}

/// Which deadline a route's request runs under: the one rule both the
/// guard and the OpenAPI document's 504s follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Reads (and a batch stat, though it is a POST).
    Read,
    /// Writes.
    Write,
    /// An import, under its own, longer deadline.
    Import,
}

impl Kind {
    /// The kind of a `method` request to `route` (a route template).
    pub fn of(method: &Method, route: &str) -> Self {
        if route == IMPORT_ROUTE {
            Self::Import
        } else if method == Method::GET
            || method == Method::HEAD
            || route.ends_with("/objects/stat")
        {
            Self::Read
        } else {
            Self::Write
        }
    }

    /// `read`, `write` or `import`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Import => "import",
        }
    }
}

impl Deadlines {
    /// The deadlines `settings` ask for.
    pub fn of(settings: &Settings) -> Self {
        Self {
            read: settings.read.timeout,
            write: settings.write.timeout,
            import: settings.import.timeout,
            upload: Upload {
                idle: settings.limits.body_idle_timeout,
                total: settings.limits.body_timeout,
                max_bytes: settings.limits.max_body_bytes,
            },
        }
    }

    /// The deadline of a `method` request to `route`, and what kind of
    /// work it is.
    pub fn for_route(&self, method: &Method, route: &str) -> (Duration, Work) {
        match Kind::of(method, route) {
            Kind::Read => (self.read, Work::Read),
            Kind::Write => (self.write, Work::Write),
            Kind::Import => (self.import, Work::Write),
        }
    }

    /// Receives `req`'s body (but an import's), then runs `inner` on it
    /// under its route's deadline; past it, 504 `timeout`, and `inner` is
    /// dropped. Leaves the request's kind of [`Work`] in its extensions,
    /// for the steps inside that treat writes apart (see
    /// [`crate::http::position`]).
    pub async fn enforce<F, Fut>(&self, req: Request, inner: F) -> Response
    where
        F: FnOnce(Request) -> Fut,
        Fut: Future<Output = Response>,
    {
        let route = req
            .extensions()
            .get::<MatchedPath>()
            .map_or("", MatchedPath::as_str);
        let (limit, work) = self.for_route(req.method(), route);
        let mut req = if route == IMPORT_ROUTE {
            req
        } else {
            match self.upload.receive(req).await {
                Ok(req) => req,
                Err(failure) => return AppError::from(failure).into_response(),
            }
        };
        req.extensions_mut().insert(work);
        match tokio::time::timeout(limit, inner(req)).await {
            Ok(response) => response,
            Err(_) => AppError::from(Failure::Timeout(work)).into_response(),
        }
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
            upload: Upload {
                idle: Duration::from_secs(1),
                total: Duration::from_secs(2),
                max_bytes: 10,
            },
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
