//! What the crate needs of a driver's errors: their [`DbErrorKind`], and
//! the one rule for running work again after a lost connection.

use std::future::Future;

use super::sqlstate::DbErrorKind;

/// An error a driver (or a loader over one) reports, sorted into the kinds
/// every driver shares.
pub(crate) trait Classify {
    /// What kind of failure this is.
    fn kind(&self) -> DbErrorKind;

    /// Whether the same work may succeed if run again: by default, as its
    /// [kind](DbErrorKind::is_retryable) says.
    fn is_retryable(&self) -> bool {
        self.kind().is_retryable()
    }
}

/// `e` as an error the crate sorts, of whichever driver it came from: how
/// [`Error::is_retryable`](crate::Error::is_retryable) reads a loader's
/// error without naming each driver's types.
pub(crate) fn classified<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e dyn Classify> {
    #[cfg(feature = "postgres")]
    if let Some(c) = crate::pg::classified(e) {
        return Some(c);
    }
    #[cfg(feature = "sqlx")]
    if let Some(c) = crate::sqlx::classified(e) {
        return Some(c);
    }
    None
}

/// Runs `attempt`, and once more if it failed because its connection or
/// node was lost ([`DbErrorKind::Unavailable`]) and `repeatable` says the
/// work may run twice (a read, an idempotent write). Both drivers'
/// pools discard such a connection, so the second attempt gets another.
pub(crate) async fn again_if_lost<T, E, Fut>(
    what: &'static str,
    repeatable: bool,
    attempt: impl Fn() -> Fut,
) -> Result<T, E>
where
    E: Classify + std::fmt::Display,
    Fut: Future<Output = Result<T, E>>,
{
    match attempt().await {
        Err(e) if repeatable && e.kind() == DbErrorKind::Unavailable => {
            tracing::debug!(error = %e, "database connection lost; {what} again on a new one");
            attempt().await
        }
        done => done,
    }
}
