//! The caller's own user.

use axum::Json;
use serde::Serialize;

use crate::auth::Grant;
use crate::extract::Caller;

/// The body of `GET /api/v1/user`.
#[derive(Debug, Serialize)]
pub(crate) struct UserBody {
    user: String,
    grants: Vec<Grant>,
}

/// `GET /api/v1/user`: who the token belongs to and what they may do.
///
/// Answered from the authenticated principal alone, so with the auth cache
/// warm it does no database work: the HTTP benchmark's ceiling (the lakeFS
/// method of starting from an empty handler) is this route.
pub(crate) async fn current(Caller(caller): Caller) -> Json<UserBody> {
    Json(UserBody {
        user: caller.user.clone(),
        grants: caller.grants.clone(),
    })
}
