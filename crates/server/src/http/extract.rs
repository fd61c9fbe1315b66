//! Extractors, so a handler starts with what it needs: the authenticated
//! [`Caller`], a repository the caller may read or write, a validated
//! object path, a JSON body. Each rejects with an [`AppError`], in the
//! order the handler lists them.
//!
//! Also [`authenticate`], which resolves the bearer token and puts the
//! [`Caller`] into the request (run by [`crate::http::guard`]).

use std::borrow::Cow;
use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Path, RawQuery, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue};
use axum::Json;
use base64::Engine as _;
use serde::de::DeserializeOwned;

use crate::domain::auth::{Action, Authenticator, Principal};
use crate::domain::input;
use crate::http::error::AppError;
use crate::http::position::ReadPosition;

/// The authenticated user of an `/api` request, put there by
/// [`authenticate`].
#[derive(Debug, Clone)]
pub struct Caller(pub Arc<Principal>);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, AppError> {
        // Missing only on a route outside the middleware: a bug.
        parts.extensions.get::<Caller>().cloned().ok_or_else(|| {
            tracing::error!("no caller: the route is not behind the guard");
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

/// Resolves `Authorization: Bearer <token>`, or `Basic` with a token's id
/// as the user name and the token as the password (what lakeFS's clients
/// send as access key id and secret), and puts the [`Caller`] into the
/// request's extensions. Run for every `/api` and `/lakefs` request by
/// [`crate::http::guard`].
///
/// # Errors
///
/// 401 for a missing, malformed or unknown token; 503 when the token cannot
/// be looked up.
pub async fn authenticate(auth: &Authenticator, mut req: Request) -> Result<Request, AppError> {
    let token = credential(req.headers().get(header::AUTHORIZATION))?;
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
    Ok(req)
}

/// The token an `Authorization` header carries: a bearer token (borrowed
/// from the header, as every request has one), or a Basic pair of the
/// token's id and the token.
fn credential(value: Option<&HeaderValue>) -> Result<Cow<'_, str>, AppError> {
    let is_basic = value
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case("basic"));
    if !is_basic {
        return bearer_token(value).map(Cow::Borrowed);
    }
    let malformed = |msg: &str| AppError::unauthorized("malformed_token", msg);
    let encoded = value
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .map_or("", |(_, rest)| rest.trim());
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(|| malformed("the Basic credentials are not base64 of `id:token`"))?;
    let (id, token) = decoded
        .split_once(':')
        .ok_or_else(|| malformed("the Basic credentials are not base64 of `id:token`"))?;
    if token.is_empty() || token.len() > MAX_TOKEN_BYTES || token.contains(' ') {
        return Err(malformed("the token is empty, too long or contains spaces"));
    }
    // Compared in constant time: the id is not secret, but it is derived
    // from the token.
    let expected = crate::domain::auth::token_id(token);
    if !constant_time_eq(expected.as_bytes(), id.to_ascii_lowercase().as_bytes()) {
        return Err(AppError::unauthorized(
            "unknown_token",
            "the access key id is not the id of this secret (`token list` shows ids)",
        ));
    }
    Ok(Cow::Owned(token.to_owned()))
}

/// Whether `a` and `b` are equal, taking as long whatever their contents.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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

    #[test]
    fn basic_credentials_are_a_token_id_and_its_token() {
        use base64::Engine as _;
        let h = |s: &str| HeaderValue::from_str(s).unwrap();
        let basic = |user: &str, pass: &str| {
            let pair = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
            h(&format!("Basic {pair}"))
        };
        let token = "pgb_secret";
        let id = crate::domain::auth::token_id(token);
        assert_eq!(credential(Some(&basic(&id, token))).unwrap(), token);
        assert_eq!(
            credential(Some(&basic(&id.to_uppercase(), token))).unwrap(),
            token,
            "ids are hex, any case"
        );
        assert_eq!(credential(Some(&h("Bearer abc"))).unwrap(), "abc");
        assert_eq!(
            credential(Some(&basic("0123456789abcdef", token)))
                .unwrap_err()
                .code(),
            "unknown_token"
        );
        for bad in ["Basic", "Basic !!!", "basic aGVsbG8="] {
            assert_eq!(
                credential(Some(&h(bad))).unwrap_err().code(),
                "malformed_token",
                "{bad}"
            );
        }
        assert_eq!(
            credential(Some(&basic(&id, ""))).unwrap_err().code(),
            "malformed_token"
        );
    }
}
