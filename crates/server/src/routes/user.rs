//! The caller's own user.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;

use crate::auth::{Grant, TokenInfo};
use crate::error::AppError;
use crate::extract::{Caller, PathParams};
use crate::state::AppState;

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

/// The body of `GET /api/v1/user/tokens`.
#[derive(Debug, Serialize)]
pub(crate) struct TokensBody {
    tokens: Vec<TokenInfo>,
}

/// `GET /api/v1/user/tokens`: the caller's tokens (ids, never the tokens).
pub(crate) async fn tokens(
    State(state): State<AppState>,
    Caller(caller): Caller,
) -> Result<Json<TokensBody>, AppError> {
    let tokens = state.auth.tokens_of(&caller.user).await?;
    Ok(Json(TokensBody { tokens }))
}

/// `DELETE /api/v1/user/tokens/{id}`: revokes one of the caller's tokens
/// (an admin may revoke anyone's); refused by this instance at once.
pub(crate) async fn revoke(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathParams(id): PathParams<String>,
) -> Result<StatusCode, AppError> {
    state.auth.revoke(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}
