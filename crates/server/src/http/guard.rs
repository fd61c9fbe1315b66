//! The one middleware every authenticated route passes through, in this
//! order: the request's deadline ([`crate::http::deadline`], outside the token
//! check, so a token lookup on a cache miss runs under it too), the token
//! check ([`crate::http::extract::authenticate`]), the handler, and the commit
//! position on a write's answer ([`crate::http::position`]).
//!
//! One middleware rather than one layer per step: axum boxes each layer
//! it is given as a route of its own, and every request clones each of
//! those boxes, and everything inside it, once per layer above it
//! (BENCHMARKS.md §5, the no-database route's profile).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};

use crate::domain::failure::Work;
use crate::http::deadline::Deadlines;
use crate::http::extract;
use crate::http::position;
use crate::service::state::AppState;

/// What the guard needs: the deadlines and the service (its token
/// resolver and its writes' commit positions). Shared behind one `Arc`, as
/// axum clones a middleware's state for every request.
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
}

/// The middleware (for `axum::middleware::from_fn_with_state`).
pub async fn guard(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    guard
        .deadlines
        .enforce(req, |req| async {
            let req = match extract::authenticate(&guard.state.auth, req).await {
                Ok(req) => req,
                Err(refused) => return refused.into_response(),
            };
            let wrote = req.extensions().get::<Work>() == Some(&Work::Write);
            let response = next.run(req).await;
            if wrote {
                position::stamp_write(&guard.state.writes, response).await
            } else {
                response
            }
        })
        .await
}
