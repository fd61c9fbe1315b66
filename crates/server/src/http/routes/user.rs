//! The caller's own user.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;

use crate::http::error::AppError;
use crate::http::extract::{Caller, PathParams};
use crate::model::auth::{Grant, TokenInfo};
use crate::service::state::AppState;

/// The body of `GET /api/v1/user`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct UserBody {
    user: String,
    grants: Vec<Grant>,
}

/// `GET /api/v1/user`: who the token belongs to and what they may do.
///
/// Answered from the authenticated principal alone, so with the auth cache
/// warm it does no database work: the HTTP benchmark's ceiling (the lakeFS
/// method of starting from an empty handler) is this route.
#[utoipa::path(
    get,
    path = "/api/v1/user",
    tag = "user",
    responses(
        (status = 200, description = "The token's owner and their grants", body = UserBody),
        (status = 503, description = "`overloaded` or `database_unavailable` (token lookup)", body = crate::http::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn current(Caller(caller): Caller) -> Json<UserBody> {
    Json(UserBody {
        user: caller.user.clone(),
        grants: caller.grants.clone(),
    })
}

/// The body of `GET /api/v1/user/tokens`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct TokensBody {
    tokens: Vec<TokenInfo>,
}

/// `GET /api/v1/user/tokens`: the caller's tokens (ids, never the tokens).
#[utoipa::path(
    get,
    path = "/api/v1/user/tokens",
    tag = "user",
    responses(
        (status = 200, description = "The caller's tokens: ids, never the tokens", body = TokensBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn tokens(
    State(state): State<AppState>,
    Caller(caller): Caller,
) -> Result<Json<TokensBody>, AppError> {
    let tokens = state.auth.tokens_of(&caller.user).await?;
    Ok(Json(TokensBody { tokens }))
}

/// `DELETE /api/v1/user/tokens/{id}`: revokes one of the caller's tokens
/// (an admin may revoke anyone's); refused by this instance at once.
#[utoipa::path(
    delete,
    path = "/api/v1/user/tokens/{id}",
    tag = "user",
    params(("id" = String, Path, description = "The token's id: 16 lowercase hex digits")),
    responses(
        (status = 204, description = "Revoked: refused by this instance at once"),
        (status = 400, description = "`invalid_token_id`", body = crate::http::error::ErrorBody),
        (status = 404, description = "`token_not_found`: the caller has no such token", body = crate::http::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn revoke(
    State(state): State<AppState>,
    Caller(caller): Caller,
    PathParams(id): PathParams<String>,
) -> Result<StatusCode, AppError> {
    state.auth.revoke(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}
