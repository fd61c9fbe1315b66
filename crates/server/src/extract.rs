//! Extractors, so a handler starts with what it needs: the authenticated
//! [`Caller`], a repository the caller may read or write, a validated
//! object path, a JSON body. Each rejects with an [`AppError`], in the
//! order the handler lists them.
//!
//! Also the `/api` middleware, [`require_token`], which resolves the bearer
//! token and puts the [`Caller`] into the request.

use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Path, RawQuery, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use axum::Json;
use serde::de::DeserializeOwned;

use crate::auth::{Action, Authenticator, Principal};
use crate::error::AppError;
use crate::input;
use crate::position::ReadPosition;

/// The authenticated user of an `/api` request, put there by
/// [`require_token`].
#[derive(Debug, Clone)]
pub struct Caller(pub Arc<Principal>);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, AppError> {
        // Missing only on a route outside the middleware: a bug.
        parts.extensions.get::<Caller>().cloned().ok_or_else(|| {
            tracing::error!("no caller: the route is not behind require_token");
            AppError::internal()
        })
    }
}

/// Path parameters, decoded as strictly as query strings (see
/// [`input::path_escapes`]).
#[derive(Debug)]
pub struct PathParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for PathParams<T> {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AppError> {
        input::path_escapes(parts.uri.path())?;
        let Path(params) = Path::<T>::from_request_parts(parts, state).await?;
        Ok(Self(params))
    }
}

/// The `{repo}` path parameter.
#[derive(Debug, serde::Deserialize)]
struct RepoParam {
    repo: String,
}

/// The repository named by `{repo}`, validated, with the caller allowed to
/// do `action` in it.
async fn repository(parts: &mut Parts, action: Action) -> Result<String, AppError> {
    let PathParams(RepoParam { repo }) = PathParams::from_request_parts(parts, &()).await?;
    input::repository(&repo)?;
    let Caller(caller) = Caller::from_request_parts(parts, &()).await?;
    caller.require(action, &repo)?;
    Ok(repo)
}

/// The `{repo}` of the path, which the caller may read.
#[derive(Debug)]
pub struct ReadableRepository(pub String);

impl<S: Send + Sync> FromRequestParts<S> for ReadableRepository {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, AppError> {
        repository(parts, Action::Read).await.map(Self)
    }
}

/// The `{repo}` of the path, which the caller may write.
#[derive(Debug)]
pub struct WritableRepository(pub String);

impl<S: Send + Sync> FromRequestParts<S> for WritableRepository {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, AppError> {
        repository(parts, Action::Write).await.map(Self)
    }
}

/// The required, validated query parameter `path`.
#[derive(Debug)]
pub struct ObjectPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for ObjectPath {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AppError> {
        let Ok(RawQuery(query)) = RawQuery::from_request_parts(parts, state).await;
        Ok(Self(input::required_path(query.as_deref())?))
    }
}

/// A JSON body whose rejection is an [`AppError`] (axum's
/// `customize-extractor-error` example, without the macro).
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = AppError;

    async fn from_request(req: Request, state: &S) -> Result<Self, AppError> {
        let Json(value) = Json::<T>::from_request(req, state).await?;
        Ok(Self(value))
    }
}

/// The longest token accepted; anything longer is malformed.
const MAX_TOKEN_BYTES: usize = 256;

/// Middleware for `/api`: resolves `Authorization: Bearer <token>` and puts
/// the [`Caller`] into the request's extensions.
///
/// # Errors
///
/// 401 for a missing, malformed or unknown token; 503 when the token cannot
/// be looked up.
pub async fn require_token(
    State(auth): State<Authenticator>,
    mut req: Request,
    next: Next,
) -> Result<Response, AppError> {
    let token = bearer_token(req.headers().get(header::AUTHORIZATION))?.to_owned();
    let ReadPosition(position) = ReadPosition::of(req.headers())?;
    let principal = auth
        .principal_at(&token, position)
        .await?
        .ok_or_else(|| AppError::unauthorized("unknown_token", "the bearer token is not valid"))?;
    if principal.expired(std::time::SystemTime::now()) {
        return Err(AppError::unauthorized(
            "expired_token",
            "the bearer token has expired; create a new one",
        ));
    }
    req.extensions_mut().insert(Caller(principal));
    Ok(next.run(req).await)
}

fn bearer_token(value: Option<&HeaderValue>) -> Result<&str, AppError> {
    let malformed = |msg: &str| AppError::unauthorized("malformed_token", msg);
    let value = value.ok_or_else(|| {
        AppError::unauthorized(
            "missing_token",
            "this route needs an `Authorization: Bearer <token>` header",
        )
    })?;
    let value = value
        .to_str()
        .map_err(|_| malformed("the Authorization header is not visible ASCII"))?;
    let (scheme, token) = value
        .split_once(' ')
        .ok_or_else(|| malformed("expected `Authorization: Bearer <token>`"))?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(malformed("expected `Authorization: Bearer <token>`"));
    }
    let token = token.trim();
    if token.is_empty() || token.len() > MAX_TOKEN_BYTES || token.contains(' ') {
        return Err(malformed(
            "the bearer token is empty, too long or contains spaces",
        ));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_parsed_strictly() {
        let h = |s: &str| HeaderValue::from_str(s).unwrap();
        assert_eq!(bearer_token(Some(&h("Bearer abc"))).unwrap(), "abc");
        assert_eq!(bearer_token(Some(&h("bearer abc"))).unwrap(), "abc");
        assert_eq!(bearer_token(None).unwrap_err().code(), "missing_token");
        for bad in ["Basic abc", "Bearer", "Bearer ", "abc", "Bearer a b"] {
            assert_eq!(
                bearer_token(Some(&h(bad))).unwrap_err().code(),
                "malformed_token",
                "{bad}"
            );
        }
        let long = format!("Bearer {}", "x".repeat(MAX_TOKEN_BYTES + 1));
        assert_eq!(
            bearer_token(Some(&h(&long))).unwrap_err().code(),
            "malformed_token"
        );
    }
}
