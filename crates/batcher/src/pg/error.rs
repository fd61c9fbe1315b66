//! One classification of the server's error reports, so the loaders, the
//! writer, the COPY import and the service built on them agree on what a
//! SQLSTATE means.

use tokio_postgres::error::{DbError, SqlState};

/// SQLSTATE class 22: a value the column cannot hold.
const DATA_EXCEPTION_CLASS: &str = "22";
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
    /// Anything else, including errors without a server report (a lost
    /// connection, a protocol error).
    Other,
}

impl DbErrorKind {
    /// The kind of the server's report `db`.
    pub fn of(db: &DbError) -> Self {
        let code = db.code();
        if *code == SqlState::UNIQUE_VIOLATION {
            Self::UniqueViolation
        } else if *code == SqlState::FOREIGN_KEY_VIOLATION {
            Self::ForeignKeyViolation
        } else if *code == SqlState::QUERY_CANCELED {
            Self::StatementTimeout
        } else if *code == SqlState::INVALID_SQL_STATEMENT_NAME
            || *code == SqlState::DUPLICATE_PSTATEMENT
            || (*code == SqlState::PROTOCOL_VIOLATION
                && db.message().contains("unsupported startup parameter"))
        {
            Self::SessionStateLost
        } else if code.code().starts_with(DATA_EXCEPTION_CLASS)
            || code
                .code()
                .starts_with(INTEGRITY_CONSTRAINT_VIOLATION_CLASS)
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

/// The kind of `e`; [`DbErrorKind::Other`] when the server sent no report.
pub fn classify(e: &tokio_postgres::Error) -> DbErrorKind {
    e.as_db_error().map_or(DbErrorKind::Other, DbErrorKind::of)
}
