//! One classification of the server's error reports, so the loaders, the
//! writer, the COPY import and the service built on them agree on what a
//! SQLSTATE means.

use tokio_postgres::error::{DbError, SqlState};

/// SQLSTATE class 22: a value the column cannot hold.
const DATA_EXCEPTION_CLASS: &str = "22";
/// SQLSTATE class 08: connection exceptions.
const CONNECTION_EXCEPTION_CLASS: &str = "08";
/// admin_shutdown, crash_shutdown, cannot_connect_now,
/// read_only_sql_transaction.
const UNAVAILABLE_CODES: [&str; 4] = ["57P01", "57P02", "57P03", "25006"];
/// SQLSTATE class 23: a constraint the row breaks.
const INTEGRITY_CONSTRAINT_VIOLATION_CLASS: &str = "23";

/// What kind of failure a database error is, as far as a caller can act on
/// it. From [`classify`], or [`DbErrorKind::of`] for a server report.
///
/// ```
/// use pgbatch::pg::DbErrorKind;
///
/// assert!(DbErrorKind::UniqueViolation.is_row_fault());
/// assert!(!DbErrorKind::StatementTimeout.is_row_fault());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DbErrorKind {
    /// A row's key already exists (SQLSTATE 23505).
    UniqueViolation,
    /// A row refers to a row that does not exist (SQLSTATE 23503).
    ForeignKeyViolation,
    /// Another integrity constraint violation (class 23) or data exception
    /// (class 22): the row's fault, not the connection's or the server's.
    OtherRowFault,
    /// The server cancelled the statement, which `statement_timeout` does
    /// when it fires (SQLSTATE 57014): a deadline, not a failure.
    StatementTimeout,
    /// The statement needed session state the server connection does not
    /// have: a prepared statement that does not exist there (SQLSTATE
    /// 26000) or one that already does (42P05), or a startup parameter
    /// refused (08P01 "unsupported startup parameter", PgBouncer's answer
    /// to `options`). The mark of a transaction-mode pooler between the
    /// client and the server, which hands each transaction any server
    /// connection; use [`StatementMode::Unnamed`](super::StatementMode::Unnamed).
    SessionStateLost,
    /// The node is gone, going, or no longer what the connection needs:
    /// the connection was lost or closed (no server report), a connection
    /// exception (class 08), the server shutting down or not yet accepting
    /// connections (57P01, 57P02, 57P03), or a write refused by a node that
    /// is now a standby (25006, `read_only_sql_transaction`: what a
    /// connection to a demoted primary gets after a failover). Discard the
    /// connection; the statement may be run again on a new one where that
    /// is safe.
    Unavailable,
    /// Anything else, including errors without a server report that are
    /// not a lost connection (a protocol or conversion error).
    Other,
}

impl DbErrorKind {
    /// The kind of the server's report `db`.
    pub fn of(db: &DbError) -> Self {
        Self::of_code(db.code().code(), db.message())
    }

    /// The kind of a report with SQLSTATE `code` and `message`.
    fn of_code(code: &str, message: &str) -> Self {
        if code == SqlState::UNIQUE_VIOLATION.code() {
            Self::UniqueViolation
        } else if code == SqlState::FOREIGN_KEY_VIOLATION.code() {
            Self::ForeignKeyViolation
        } else if code == SqlState::QUERY_CANCELED.code() {
            Self::StatementTimeout
        } else if code == SqlState::INVALID_SQL_STATEMENT_NAME.code()
            || code == SqlState::DUPLICATE_PSTATEMENT.code()
            || (code == SqlState::PROTOCOL_VIOLATION.code()
                && message.contains("unsupported startup parameter"))
        {
            Self::SessionStateLost
        } else if code.starts_with(CONNECTION_EXCEPTION_CLASS) || UNAVAILABLE_CODES.contains(&code)
        {
            Self::Unavailable
        } else if code.starts_with(DATA_EXCEPTION_CLASS)
            || code.starts_with(INTEGRITY_CONSTRAINT_VIOLATION_CLASS)
        {
            Self::OtherRowFault
        } else {
            Self::Other
        }
    }

    /// Whether the database refused the data rather than failing: an
    /// integrity constraint violation (class 23) or a data exception (22).
    pub fn is_row_fault(self) -> bool {
        matches!(
            self,
            Self::UniqueViolation | Self::ForeignKeyViolation | Self::OtherRowFault
        )
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
    fn each_sqlstate_has_its_kind() {
        use DbErrorKind as K;
        for (code, message, kind) in [
            ("23505", "", K::UniqueViolation),
            ("23503", "", K::ForeignKeyViolation),
            ("23502", "", K::OtherRowFault),
            ("22001", "", K::OtherRowFault),
            ("57014", "", K::StatementTimeout),
            ("26000", "", K::SessionStateLost),
            ("42P05", "", K::SessionStateLost),
            (
                "08P01",
                "unsupported startup parameter: options",
                K::SessionStateLost,
            ),
            ("08P01", "invalid message format", K::Unavailable),
            ("08006", "", K::Unavailable),
            ("08004", "", K::Unavailable),
            (
                "57P01",
                "terminating connection due to administrator command",
                K::Unavailable,
            ),
            ("57P02", "", K::Unavailable),
            (
                "57P03",
                "the database system is starting up",
                K::Unavailable,
            ),
            (
                "25006",
                "cannot execute UPDATE in a read-only transaction",
                K::Unavailable,
            ),
            ("42601", "syntax error", K::Other),
            ("42501", "permission denied", K::Other),
            ("40001", "", K::Other),
        ] {
            assert_eq!(
                DbErrorKind::of_code(code, message),
                kind,
                "{code} {message}"
            );
        }
    }

    #[test]
    fn a_timeout_of_tokio_postgres_is_a_lost_connection() {
        let e = tokio_postgres::Error::__private_api_timeout();
        assert_eq!(classify(&e), DbErrorKind::Unavailable);
    }
}
