//! Every way a request can fail, as a domain error: the bottom layer, which
//! knows nothing of HTTP (`error` maps it to responses).
//!
//! The library's errors become a [`Failure`] through one classification:
//! [`Failure::from_batcher`], [`Failure::from_pg`] and the
//! [`ImportError`] conversion all sort database errors with
//! [`pgbatch::pg::classify`].

use pgbatch::pg::copy::ImportError;
use pgbatch::pg::{DbErrorKind, PgError, RowError};

/// What kind of work ran past its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// A lookup: nothing changed.
    Read,
    /// A write: it may still be committed.
    Write,
}

/// Why a request was not served.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The request's input is invalid; `code` names the rule, the message
    /// the problem.
    #[error("{message}")]
    Invalid {
        /// Machine-readable, such as `invalid_path`.
        code: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The caller may not do this; the message names the user and action.
    #[error("{0}")]
    Forbidden(String),
    /// The repository does not exist.
    #[error("repository `{0}` does not exist")]
    NoSuchRepository(String),
    /// The repository exists; the object does not.
    #[error("no object at `{path}` in repository `{repository}`")]
    NoSuchObject {
        /// The repository name.
        repository: String,
        /// The object's path.
        path: String,
    },
    /// The repository has no such ref (the lakeFS surface: its one branch
    /// is the only one).
    #[error("repository `{repository}` has no ref `{reference}`")]
    NoSuchRef {
        /// The repository name.
        repository: String,
        /// The ref asked for.
        reference: String,
    },
    /// The caller has no token with this id.
    #[error("no token with id `{0}`")]
    NoSuchToken(String),
    /// No user has this name.
    #[error("no user named `{0}`")]
    NoSuchUser(String),
    /// No `random_read_test` row has this key.
    #[error("no row with key `{0}`")]
    NoSuchRow(String),
    /// The repository already exists (create).
    #[error("repository `{0}` already exists")]
    RepositoryExists(String),
    /// An import with policy `fail` met an existing key; the message names
    /// it.
    #[error("{0}")]
    Conflict(String),
    /// The database refused a row that passed validation; the message is
    /// the server's.
    #[error("{0}")]
    Rejected(String),
    /// An import line is malformed; nothing of the import was committed.
    #[error("line {line}: {message}")]
    BadImportLine {
        /// The line's number, from 1.
        line: u64,
        /// What is wrong with it.
        message: String,
    },
    /// A body is larger than allowed.
    #[error("the body is larger than {0} bytes")]
    TooLarge(usize),
    /// The client paused longer than allowed between two chunks of a body.
    #[error("the request body stalled: nothing arrived for {0:?}")]
    BodyStalled(std::time::Duration),
    /// The whole body took longer to arrive than allowed.
    #[error("the request body did not arrive within {0:?}")]
    BodyTooSlow(std::time::Duration),
    /// Too much work queued already, or no connection free in time: shed
    /// load.
    #[error("the server is overloaded; retry later")]
    Overloaded,
    /// The deadline passed.
    #[error("{}", match .0 {
        Work::Read => "the lookup did not complete within its deadline",
        Work::Write => "the write did not complete within its deadline; it may still be applied",
    })]
    Timeout(Work),
    /// The database failed or is unreachable. The cause is for the log, not
    /// for the client.
    #[error("the database is unavailable; retry later")]
    Unavailable(#[source] anyhow::Error),
    /// A statement needed session state its database connection did not
    /// have (a prepared statement, a startup parameter): a transaction-mode
    /// pooler stands between the service and the database, and the service
    /// was told there is none. A setting to fix, not an outage; the cause
    /// is for the log.
    #[error(
        "the database connection lost its session state: the service is not set up for \
         the connection pooler in front of the database"
    )]
    SessionStateLost(#[source] anyhow::Error),
}

impl Failure {
    /// [`Failure::Invalid`] with `code` and `message`.
    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid {
            code,
            message: message.into(),
        }
    }

    /// [`Failure::Unavailable`] caused by `cause`.
    pub fn unavailable(cause: impl Into<anyhow::Error>) -> Self {
        Self::Unavailable(cause.into())
    }

    /// A batcher's (or cache's) error, from `work`.
    pub fn from_batcher(e: pgbatch::Error, work: Work) -> Self {
        let classified = match &e {
            pgbatch::Error::Overloaded => Some(Self::Overloaded),
            pgbatch::Error::Timeout(_) | pgbatch::Error::LoadTimeout(_) => {
                Some(Self::Timeout(work))
            }
            _ => e
                .load_error::<PgError>()
                .and_then(|pg| Self::classify_pg(pg, work))
                .or_else(|| e.load_error::<RowError>().map(Self::refused)),
        };
        classified.unwrap_or_else(|| Self::unavailable(e))
    }

    /// A row the writer's statement refused.
    fn refused(row: &RowError) -> Self {
        Self::Rejected(
            row.as_db_error()
                .map_or_else(|| row.to_string(), |db| db.message().to_owned()),
        )
    }

    /// A loader's or pool's error, from `work`.
    pub fn from_pg(e: PgError, work: Work) -> Self {
        Self::classify_pg(&e, work).unwrap_or_else(|| Self::unavailable(e))
    }

    /// The failure `e` is other than the database being unavailable.
    fn classify_pg(e: &PgError, work: Work) -> Option<Self> {
        if e.is_pool_timeout() {
            return Some(Self::Overloaded);
        }
        match e.kind() {
            // The server's statement_timeout fired before our own deadline.
            DbErrorKind::StatementTimeout => Some(Self::Timeout(work)),
            DbErrorKind::SessionStateLost => Some(Self::SessionStateLost(anyhow::anyhow!(
                "{}",
                e.as_db_error()
                    .map_or_else(|| e.to_string(), |db| db.message().to_owned())
            ))),
            _ => None,
        }
    }
}

/// A lookup's error.
impl From<pgbatch::Error> for Failure {
    fn from(e: pgbatch::Error) -> Self {
        Self::from_batcher(e, Work::Read)
    }
}

/// A lookup's error.
impl From<PgError> for Failure {
    fn from(e: PgError) -> Self {
        Self::from_pg(e, Work::Read)
    }
}

/// An import's error; the source's own errors are already failures.
impl From<ImportError<Failure>> for Failure {
    fn from(e: ImportError<Failure>) -> Self {
        match e {
            ImportError::Source { error, .. } => error,
            ImportError::Conflict(ref db) | ImportError::Rejected(ref db) => {
                let message = db.as_db_error().map_or_else(
                    || db.to_string(),
                    |d| match d.detail() {
                        Some(detail) => format!("{}: {detail}", d.message()),
                        None => d.message().to_owned(),
                    },
                );
                if matches!(e, ImportError::Conflict(_)) {
                    Self::Conflict(message)
                } else {
                    Self::Rejected(message)
                }
            }
            ImportError::Db(db) => Self::from_pg(PgError::Query(db), Work::Write),
            other => Self::unavailable(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn batcher_errors_are_classified_once() {
        let read = |e| Failure::from(e);
        assert!(matches!(
            read(pgbatch::Error::Overloaded),
            Failure::Overloaded
        ));
        assert!(matches!(
            read(pgbatch::Error::Timeout(pgbatch::TimedOut::new(
                Duration::ZERO,
                pgbatch::Waited::ForALoad
            ))),
            Failure::Timeout(Work::Read)
        ));
        assert!(matches!(
            Failure::from_batcher(pgbatch::Error::LoadTimeout(Duration::ZERO), Work::Write),
            Failure::Timeout(Work::Write)
        ));
        assert!(matches!(
            read(pgbatch::Error::Closed),
            Failure::Unavailable(_)
        ));
        let io = pgbatch::Error::Load(Arc::new(std::io::Error::other("x")));
        assert!(matches!(read(io), Failure::Unavailable(_)));
    }

    #[test]
    fn messages_are_the_apis() {
        assert_eq!(
            Failure::NoSuchObject {
                repository: "demo".into(),
                path: "a/b".into()
            }
            .to_string(),
            "no object at `a/b` in repository `demo`"
        );
        assert_eq!(
            Failure::Timeout(Work::Write).to_string(),
            "the write did not complete within its deadline; it may still be applied"
        );
        assert_eq!(
            Failure::unavailable(anyhow::anyhow!("secret detail")).to_string(),
            "the database is unavailable; retry later"
        );
    }
}
