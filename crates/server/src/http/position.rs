//! Read-your-writes across instances and replicas, over HTTP: a write's
//! response carries the primary's WAL position after its commit in
//! [`HEADER`]; a read that sends it back is answered by a database that
//! has replayed that far (see [`crate::cluster::replicas`]), never from a cache.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::Response;
use tokio_postgres::types::PgLsn;

use crate::domain::failure::Failure;
use crate::domain::writes::Writes;
use crate::http::error::AppError;

/// The header that carries a write's commit position, in Postgres's
/// notation (`16/B374D848`), and in which a read presents it.
pub const HEADER: &str = "x-pgbatch-lsn";

/// [`HEADER`] as a header name: a `&str` key is checked and lowered byte
/// by byte on every lookup, and every authenticated request looks.
const HEADER_NAME: HeaderName = HeaderName::from_static(HEADER);

/// The position a read presents in [`HEADER`], if any.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadPosition(pub Option<PgLsn>);

impl ReadPosition {
    /// The position in `headers`.
    ///
    /// # Errors
    ///
    /// [`Failure::Invalid`] (`invalid_lsn`) when the header is present and
    /// not a WAL position.
    pub fn of(headers: &HeaderMap) -> Result<Self, Failure> {
        let Some(value) = headers.get(&HEADER_NAME) else {
            return Ok(Self(None));
        };
        let text = value.to_str().map_err(|_| {
            Failure::invalid("invalid_lsn", format!("`{HEADER}` is not a WAL position"))
        })?;
        parse_position(text)
            .map(|lsn| Self(Some(lsn)))
            .map_err(|e| Failure::invalid("invalid_lsn", format!("`{HEADER}`: {e}")))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ReadPosition {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, AppError> {
        Ok(Self::of(&parts.headers)?)
    }
}

/// Adds [`HEADER`] to the successful answer of a write (run by
/// [`crate::http::guard`] for requests whose kind of
/// [`Work`](crate::domain::failure::Work) is a write: not a `GET`, nor a batch
/// stat, which is a `POST` that reads). A write whose
/// position cannot be read is still answered, without the header: it is
/// committed, and the client can read from the primary's side of the
/// consistency model (see docs/instances.md) without it.
pub async fn stamp_write(writes: &Writes, mut response: Response) -> Response {
    if !response.status().is_success() {
        return response;
    }
    match writes.commit_position().await {
        Ok(lsn) => {
            if let Ok(value) = HeaderValue::from_str(&lsn.to_string()) {
                response.headers_mut().insert(HEADER_NAME, value);
            }
        }
        Err(e) => tracing::warn!(error = %e, "could not read the commit position for a write"),
    }
    response
}

/// Reads `position` from a header value such as `16/B374D848`.
///
/// # Errors
///
/// When the text is not a WAL position.
pub fn parse_position(text: &str) -> Result<PgLsn, String> {
    // Exactly what the OpenAPI document states (`POSITION_PATTERN`):
    // PgLsn's own parser also takes signs and leading zeros past 8 digits.
    let half = |h: &str| (1..=8).contains(&h.len()) && h.bytes().all(|b| b.is_ascii_hexdigit());
    text.split_once('/')
        .filter(|(hi, lo)| half(hi) && half(lo))
        .and_then(|_| text.parse::<PgLsn>().ok())
        .ok_or_else(|| format!("`{text}` is not a WAL position such as `16/B374D848`"))
}

/// What [`parse_position`] accepts, as a regular expression (for the
/// OpenAPI document).
pub const POSITION_PATTERN: &str = "^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_parse_as_postgres_prints_them() {
        assert_eq!(
            u64::from(parse_position("16/B374D848").unwrap()),
            0x16_B374_D848
        );
        assert!(parse_position("16-B374").is_err());
        assert!(parse_position("").is_err());
    }
}
