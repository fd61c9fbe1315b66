//! The one middleware every authenticated route passes through, in this
//! order: the request's deadline ([`crate::http::deadline`], outside the token
//! check, so a token lookup on a cache miss runs under it too), the token
//! check ([`crate::http::extract::authenticate`]), the handler, and the commit
//! position on a write's answer ([`crate::http::position`]).
//!
//! One middleware rather than one layer per step: axum boxes each layer
//! it is given as a route of its own, and every request clones each of
//! those boxes, and everything inside it, once per layer above it
//! (BENCHMARKS.md, "Over HTTP", the no-database route's profile).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::response::{IntoResponse as _, Response};
use futures_util::future::BoxFuture;
use tower::{Layer, Service};

use crate::domain::failure::Work;
use crate::http::deadline::Deadlines;
use crate::http::extract;
use crate::http::position;
use crate::service::state::AppState;

/// What the guard needs: the deadlines and the service (its token
/// resolver and its writes' commit positions). Shared behind one `Arc`, as
/// every route's guard holds it.
#[derive(Debug)]
pub struct Guard {
    deadlines: Deadlines,
    state: AppState,
}

impl Guard {
    /// The guard of `state`'s routes, with the deadlines its settings ask
    /// for.
    pub fn new(state: &AppState) -> Arc<Self> {
        Arc::new(Self {
            deadlines: Deadlines::of(&state.settings),
            state: state.clone(),
        })
    }

    /// The request through the steps the module names, `inner` being the
    /// handler.
    async fn run<S>(&self, req: Request, mut inner: S) -> Response
    where
        S: Service<Request, Response = Response, Error = Infallible>,
    {
        self.deadlines
            .enforce(req, |req| async {
                let req = match extract::authenticate(&self.state.auth, req).await {
                    Ok(req) => req,
                    Err(refused) => return refused.into_response(),
                };
                let wrote = req.extensions().get::<Work>() == Some(&Work::Write);
                let Ok(response) = inner.call(req).await;
                if wrote {
                    position::stamp_write(&self.state.writes, response).await
                } else {
                    response
                }
            })
            .await
    }
}

/// The layer of the guard (for `Router::route_layer`).
///
/// A hand-written [`Service`] rather than `axum::middleware::from_fn`,
/// which also boxes the route it wraps again as `Next` on every request
/// (BENCHMARKS.md, "Over HTTP").
#[derive(Debug, Clone)]
pub struct GuardLayer(Arc<Guard>);

impl GuardLayer {
    /// The layer of `state`'s routes.
    pub fn new(state: &AppState) -> Self {
        Self(Guard::new(state))
    }
}

impl<S> Layer<S> for GuardLayer {
    type Service = Guarded<S>;

    fn layer(&self, inner: S) -> Guarded<S> {
        Guarded {
            inner,
            guard: Arc::clone(&self.0),
        }
    }
}

/// `S` behind the guard.
#[derive(Debug, Clone)]
pub struct Guarded<S> {
    inner: S,
    guard: Arc<Guard>,
}

impl<S> Service<Request> for Guarded<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        // The handler runs after the token check, in the future: it takes
        // the service that was polled ready and leaves a clone in its place.
        let fresh = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, fresh);
        let guard = Arc::clone(&self.guard);
        Box::pin(async move { Ok(guard.run(req, inner).await) })
    }
}
