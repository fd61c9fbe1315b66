//! sqlx's errors sorted into the [`DbErrorKind`]s the whole crate uses.

use crate::db::{Classify, DbErrorKind};

/// The kind of `e`, as a caller can act on it.
///
/// | `sqlx::Error` | kind | why |
/// |---|---|---|
/// | `Database` | by its SQLSTATE and message, as `pg::classify` sorts a server report | the server said what happened: 23505 is [`UniqueViolation`](DbErrorKind::UniqueViolation), 40001 [`Conflict`](DbErrorKind::Conflict), 57P01 (shutdown, or `pg_terminate_backend`) [`Unavailable`](DbErrorKind::Unavailable), and so on |
/// | `Io`, but not of kind `InvalidData` | [`Unavailable`](DbErrorKind::Unavailable) | the socket failed or the server closed it (sqlx reports an end of stream as `UnexpectedEof`): the connection is lost, not the statement at fault |
/// | `WorkerCrashed` | [`Unavailable`](DbErrorKind::Unavailable) | the task that owned the connection is gone, and the connection with it |
/// | `PoolTimedOut` | [`Other`](DbErrorKind::Other) | the pool had no connection to give within `acquire_timeout`: usually a saturated pool, not a lost node, so the loader does not run the batch again at once; [`is_retryable`] still says yes (later, after a pause); see [`is_pool_timeout`] |
/// | `Tls` | [`Other`](DbErrorKind::Other) | a TLS handshake refused (a certificate, a host name, no TLS on the server) is a setting to fix, not an outage, as `pg::classify` also says |
/// | `Protocol` | [`Other`](DbErrorKind::Other) | a message sqlx did not expect: the connection is out of step (a bug, or a proxy in between), not lost; sqlx reports a lost connection as `Io` or as the server's own report |
/// | `PoolClosed` | [`Other`](DbErrorKind::Other) | `PgPool::close` was called (the service is shutting down): another attempt on this pool fails the same way, so it is not retryable |
/// | anything else | [`Other`](DbErrorKind::Other) | configuration, encoding and decoding errors, a missing column: the program's to fix |
///
/// A `Database` error without a SQLSTATE (which Postgres always sends) is
/// [`Other`](DbErrorKind::Other).
pub fn classify(e: &::sqlx::Error) -> DbErrorKind {
    match e {
        ::sqlx::Error::Database(db) => match db.code() {
            Some(code) => DbErrorKind::of_code(&code, db.message()),
            None => DbErrorKind::Other,
        },
        ::sqlx::Error::Io(io) if io.kind() != std::io::ErrorKind::InvalidData => {
            DbErrorKind::Unavailable
        }
        ::sqlx::Error::WorkerCrashed => DbErrorKind::Unavailable,
        _ => DbErrorKind::Other,
    }
}

/// Whether the pool had no connection to give within its
/// `acquire_timeout` (`sqlx::Error::PoolTimedOut`): the pool, or the
/// database behind it, is saturated, and the caller should shed load.
///
/// sqlx reports the same error when it could not open a connection in
/// that time because the server refused the TCP connection (sqlx retries
/// that until the timeout, taking it for a server still starting): a node
/// that is down looks like a saturated pool here.
pub fn is_pool_timeout(e: &::sqlx::Error) -> bool {
    matches!(e, ::sqlx::Error::PoolTimedOut)
}

/// Whether the same work may succeed if run again: a pool timeout (see
/// [`is_pool_timeout`]), or an error whose kind
/// [`is_retryable`](DbErrorKind::is_retryable) (a lost connection, a
/// serialization failure or deadlock, a server with no connection to
/// spare).
///
/// Retry only work that may run twice: a read, an idempotent write, or a
/// whole transaction, and with a pause that grows, so that retries do not
/// add to the load that made the pool time out.
pub fn is_retryable(e: &::sqlx::Error) -> bool {
    is_pool_timeout(e) || classify(e).is_retryable()
}

impl Classify for ::sqlx::Error {
    fn kind(&self) -> DbErrorKind {
        classify(self)
    }

    fn is_retryable(&self) -> bool {
        is_retryable(self)
    }
}

/// `e` as an error of this driver the crate sorts, if it is one.
pub(crate) fn classified<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e dyn Classify> {
    e.downcast_ref::<::sqlx::Error>()
        .map(|e| e as &dyn Classify)
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    #[test]
    fn errors_without_a_server_report_have_their_kind() {
        use DbErrorKind as K;
        let cases: Vec<(::sqlx::Error, DbErrorKind, bool)> = vec![
            (
                io::Error::from(io::ErrorKind::ConnectionReset).into(),
                K::Unavailable,
                true,
            ),
            (
                io::Error::new(io::ErrorKind::UnexpectedEof, "expected 5 bytes, got 0").into(),
                K::Unavailable,
                true,
            ),
            (
                io::Error::from(io::ErrorKind::NotFound).into(),
                K::Unavailable,
                true,
            ),
            (
                io::Error::from(io::ErrorKind::InvalidData).into(),
                K::Other,
                false,
            ),
            (::sqlx::Error::PoolClosed, K::Other, false),
            (::sqlx::Error::WorkerCrashed, K::Unavailable, true),
            (::sqlx::Error::PoolTimedOut, K::Other, true),
            (
                ::sqlx::Error::Tls("certificate not trusted".into()),
                K::Other,
                false,
            ),
            (
                ::sqlx::Error::Protocol("unexpected message".to_owned()),
                K::Other,
                false,
            ),
            (::sqlx::Error::RowNotFound, K::Other, false),
            (
                ::sqlx::Error::ColumnNotFound("name".to_owned()),
                K::Other,
                false,
            ),
        ];
        for (e, kind, retryable) in &cases {
            assert_eq!(classify(e), *kind, "{e:?}");
            assert_eq!(is_retryable(e), *retryable, "{e:?}");
            assert_eq!(
                is_pool_timeout(e),
                matches!(e, ::sqlx::Error::PoolTimedOut),
                "{e:?}"
            );
        }
    }
}
