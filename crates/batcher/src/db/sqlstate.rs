//! What a SQLSTATE means to a caller, for every driver the crate supports:
//! the tokio-postgres loaders (`pg`) and the sqlx ones (`sqlx`) sort their
//! errors into the same [`DbErrorKind`]s, so code acting on a kind works
//! with either.

/// What kind of failure a database error is, as far as a caller can act on
/// it: from `pg::classify` (tokio-postgres) or `sqlx::classify`.
///
/// ```
/// # #[cfg(feature = "postgres")] {
/// use pgbatch::pg::DbErrorKind;
///
/// assert!(DbErrorKind::UniqueViolation.is_row_fault());
/// assert!(!DbErrorKind::StatementTimeout.is_row_fault());
/// assert!(DbErrorKind::Conflict.is_retryable());
/// assert!(!DbErrorKind::UniqueViolation.is_retryable());
/// # }
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
    /// connection: send unnamed statements (`StatementMode::Unnamed` of
    /// `pg` or `sqlx`).
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
    /// The transaction lost to a concurrent one: a serialization failure
    /// (40001) or a deadlock (40P01). The server rolled it back; running
    /// the whole transaction again is how Postgres expects it handled.
    Conflict,
    /// The server refused a new connection because it has as many as
    /// `max_connections` allows (53300). Retry after a pause, or pool
    /// fewer connections.
    TooManyConnections,
    /// Anything else, including errors without a server report that are
    /// not a lost connection (a protocol or conversion error).
    Other,
}

impl DbErrorKind {
    /// The kind of a report with SQLSTATE `code` and `message`.
    pub(crate) fn of_code(code: &str, message: &str) -> Self {
        match code {
            "23505" => Self::UniqueViolation,
            "23503" => Self::ForeignKeyViolation,
            "57014" => Self::StatementTimeout, // query_canceled
            // invalid_sql_statement_name, duplicate_prepared_statement
            "26000" | "42P05" => Self::SessionStateLost,
            // A pooler refusing a startup parameter it does not pass on.
            "08P01" if message.contains("unsupported startup parameter") => Self::SessionStateLost,
            // admin_shutdown, crash_shutdown, cannot_connect_now,
            // read_only_sql_transaction; and class 08, connection exceptions.
            "57P01" | "57P02" | "57P03" | "25006" => Self::Unavailable,
            _ if code.starts_with("08") => Self::Unavailable,
            "40001" | "40P01" => Self::Conflict, // serialization_failure, deadlock_detected
            "53300" => Self::TooManyConnections,
            // Classes 22 (a value the column cannot hold) and 23 (a
            // constraint the row breaks).
            _ if code.starts_with("22") || code.starts_with("23") => Self::OtherRowFault,
            _ => Self::Other,
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

    /// Whether the same work may succeed if run again: the node was lost or
    /// is changing ([`Unavailable`](Self::Unavailable)), the transaction
    /// lost a race ([`Conflict`](Self::Conflict)), or the server had no
    /// connection to spare ([`TooManyConnections`](Self::TooManyConnections)).
    ///
    /// Rows the database refused, syntax and permission errors, and a
    /// [`StatementTimeout`](Self::StatementTimeout) are not: they fail the
    /// same way again (a statement that ran out of time would only load the
    /// server more). Retrying is safe only for work that may run twice: a
    /// read, an idempotent write, or a whole transaction that was rolled
    /// back.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Self::Unavailable | Self::Conflict | Self::TooManyConnections
        )
    }
}

#[cfg(test)]
mod tests {
    use super::DbErrorKind;

    #[test]
    fn each_sqlstate_has_its_kind() {
        use DbErrorKind as K;
        for (code, message, kind, retryable) in [
            ("23505", "", K::UniqueViolation, false),
            ("23503", "", K::ForeignKeyViolation, false),
            ("23502", "", K::OtherRowFault, false),
            ("22001", "", K::OtherRowFault, false),
            ("57014", "", K::StatementTimeout, false),
            ("26000", "", K::SessionStateLost, false),
            ("42P05", "", K::SessionStateLost, false),
            (
                "08P01",
                "unsupported startup parameter: options",
                K::SessionStateLost,
                false,
            ),
            ("08P01", "invalid message format", K::Unavailable, true),
            ("08006", "", K::Unavailable, true),
            ("08004", "", K::Unavailable, true),
            (
                "57P01",
                "terminating connection due to administrator command",
                K::Unavailable,
                true,
            ),
            ("57P02", "", K::Unavailable, true),
            (
                "57P03",
                "the database system is starting up",
                K::Unavailable,
                true,
            ),
            (
                "25006",
                "cannot execute UPDATE in a read-only transaction",
                K::Unavailable,
                true,
            ),
            ("40001", "could not serialize access", K::Conflict, true),
            ("40P01", "deadlock detected", K::Conflict, true),
            (
                "53300",
                "sorry, too many clients already",
                K::TooManyConnections,
                true,
            ),
            ("42601", "syntax error", K::Other, false),
            ("42501", "permission denied", K::Other, false),
            ("42P01", "relation does not exist", K::Other, false),
        ] {
            let got = DbErrorKind::of_code(code, message);
            assert_eq!(got, kind, "{code} {message}");
            assert_eq!(got.is_retryable(), retryable, "{code} {message}");
        }
    }
}
