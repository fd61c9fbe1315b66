//! One classification of the server's error reports, so the loaders, the
//! writer, the COPY import and the service built on them agree on what a
//! SQLSTATE means.

use tokio_postgres::error::DbError;

use crate::db::Classify;
pub use crate::db::DbErrorKind;

impl DbErrorKind {
    /// The kind of the server's report `db`.
    pub fn of(db: &DbError) -> Self {
        Self::of_code(db.code().code(), db.message())
    }
}

/// The kind of `e`. Without a server report it is
/// [`DbErrorKind::Unavailable`] when the connection was lost (closed, or
/// an I/O error), else [`DbErrorKind::Other`].
pub fn classify(e: &tokio_postgres::Error) -> DbErrorKind {
    match e.as_db_error() {
        Some(db) => DbErrorKind::of(db),
        None if is_connection_lost(e) => DbErrorKind::Unavailable,
        None => DbErrorKind::Other,
    }
}

impl Classify for tokio_postgres::Error {
    fn kind(&self) -> DbErrorKind {
        classify(self)
    }
}

impl Classify for deadpool_postgres::PoolError {
    fn kind(&self) -> DbErrorKind {
        use deadpool_postgres::{PoolError, TimeoutType};
        match self {
            PoolError::Backend(e) => classify(e),
            // Waiting for a connection: the pool is saturated, not gone.
            PoolError::Timeout(TimeoutType::Wait) => DbErrorKind::Other,
            PoolError::Timeout(_) => DbErrorKind::Unavailable,
            _ => DbErrorKind::Other,
        }
    }

    fn is_retryable(&self) -> bool {
        super::pool_error_is_retryable(self)
    }
}

/// `e` as an error of this driver the crate sorts, if it is one.
pub(crate) fn classified<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e dyn Classify> {
    if let Some(e) = e.downcast_ref::<super::PgError>() {
        return Some(e);
    }
    if let Some(e) = e.downcast_ref::<tokio_postgres::Error>() {
        return Some(e);
    }
    e.downcast_ref::<deadpool_postgres::PoolError>()
        .map(|e| e as &dyn Classify)
}

/// Whether `e` says the connection's node is gone or no longer fits.
pub(crate) fn is_unavailable(e: &tokio_postgres::Error) -> bool {
    classify(e) == DbErrorKind::Unavailable
}

/// A connection lost without a server report: closed, an I/O error, or a
/// timeout of tokio-postgres's own (connecting; no error of its carries a
/// timeout otherwise).
fn is_connection_lost(e: &tokio_postgres::Error) -> bool {
    use std::error::Error as _;
    // tokio-postgres's error kinds are private; its messages name them. A
    // failed TLS handshake (a certificate or name refused) is a setting to
    // fix, not an outage, though its cause is an I/O error too.
    let text = e.to_string();
    if text.starts_with("error performing TLS handshake") {
        return false;
    }
    e.is_closed()
        || e.source()
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some_and(|io| io.kind() != std::io::ErrorKind::InvalidData)
        || text == tokio_postgres::Error::__private_api_timeout().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_of_tokio_postgres_is_a_lost_connection() {
        let e = tokio_postgres::Error::__private_api_timeout();
        assert_eq!(classify(&e), DbErrorKind::Unavailable);
    }
}
