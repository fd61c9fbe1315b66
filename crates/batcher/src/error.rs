//! The crate's error types.
//!
//! [`Error`] is what a single lookup can end with; [`BuildError`] is what an
//! invalid configuration is rejected with before anything is spawned.

use std::sync::Arc;
use std::time::Duration;

/// A boxed loader error, shared between every waiter of the failed batch.
pub type SharedError = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Why a lookup through a [`Batcher`](crate::Batcher) produced no value.
///
/// A key that the loader simply did not return is *not* an error: it is
/// reported as `Ok(None)`. Every variant here is cheap to clone, because a
/// single batch failure is delivered to every caller that was in that batch.
///
/// Its `Display` says why, cause included, once: `batch load failed:
/// database query failed: db error: ERROR: column "x" does not exist`. So
/// print it with `{}`; the loader's own error is
/// [`load_error`](Self::load_error)'s to give back, not `source()`'s,
/// which would have a reporter that walks the chain print the cause twice.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The loader returned an error for the batch this key was in (every
    /// waiter of that batch receives a clone of the same error), or failed
    /// this key alone.
    #[error("batch load failed: {}", Chain(&**.0))]
    Load(SharedError),

    /// The loader panicked while loading the batch this key was in. The
    /// worker caught the panic and keeps serving other batches.
    #[error("batch loader panicked: {0}")]
    LoaderPanicked(Arc<str>),

    /// The loader did not finish within the configured
    /// [`load_timeout`](crate::BatcherBuilder::load_timeout); the load was
    /// abandoned and its slot freed.
    #[error("batch load timed out after {0:?}: the database did not answer in time")]
    LoadTimeout(Duration),

    /// The caller's own deadline
    /// ([`timeout`](crate::BatcherBuilder::timeout)) passed before an answer
    /// arrived; [`TimedOut`] says what the request was waiting for.
    #[error("{0}")]
    Timeout(TimedOut),

    /// The request queue was full, or the worker already held as many
    /// waiters as it may, and the batcher is configured to reject rather
    /// than wait ([`Overflow::Reject`](crate::Overflow::Reject)).
    /// Callers should shed load (for example answer HTTP 503) and retry later.
    #[error("batcher queue is full")]
    Overloaded,

    /// The batcher was shut down, or its worker stopped, before this request
    /// could be answered.
    #[error("batcher worker closed")]
    Closed,
}

impl Error {
    /// Wraps a loader's own error as [`Error::Load`], for loaders (such as
    /// `Cache` loaders) that must return this type.
    pub fn load<E: std::error::Error + Send + Sync + 'static>(error: E) -> Self {
        Error::Load(Arc::new(error))
    }

    /// Returns `true` if the request was rejected because the queue was full.
    pub fn is_overloaded(&self) -> bool {
        matches!(self, Error::Overloaded)
    }

    /// Returns `true` if the caller's deadline or the batch's load timeout
    /// passed (both are also [retryable](Self::is_retryable)).
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout(_) | Error::LoadTimeout(_))
    }

    /// Whether asking again later may succeed:
    ///
    /// - [`Error::Overloaded`]: the batcher shed the request; retry after a
    ///   pause (or answer 503 with `Retry-After`);
    /// - [`Error::Timeout`] and [`Error::LoadTimeout`]: the deadline passed
    ///   while the batcher was busy or the database slow (the error says
    ///   which); a later attempt may find either free again. Retry after a
    ///   pause that grows, since asking again at once adds to what made it
    ///   slow;
    /// - [`Error::Load`] whose error, or an error in its source chain, is a
    ///   retryable database error of either driver: a lost or refusing node
    ///   (class 08, 57P01-57P03, 25006 after a failover, a reset
    ///   connection), a serialization failure (40001) or deadlock (40P01),
    ///   too many connections (53300), or a pool that had no connection
    ///   free in time (see `pg::PgError::is_retryable` and
    ///   `sqlx::is_retryable`); or a retryable `Error` of another batcher
    ///   the loader asked.
    ///
    /// Retry only work that may run twice: a read, an idempotent write, or
    /// a whole transaction. A write whose connection was lost during its
    /// `COMMIT` may have committed.
    ///
    /// False for everything else: rows the database refused, syntax and
    /// permission errors, a loader error the crate does not know, a
    /// panicking loader and a closed batcher.
    ///
    /// ```
    /// # use pgbatch::Error;
    /// assert!(Error::Overloaded.is_retryable());
    /// assert!(!Error::load(std::io::Error::other("bad row")).is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Overloaded | Error::Timeout(_) | Error::LoadTimeout(_) => true,
            Error::Load(e) => {
                std::iter::successors(Some(&**e as &dyn std::error::Error), |e| e.source())
                    .find_map(retryable_db_error)
                    .unwrap_or(false)
            }
            _ => false,
        }
    }

    /// Returns `true` if the batcher is shut down or its worker is gone.
    pub fn is_closed(&self) -> bool {
        matches!(self, Error::Closed)
    }

    /// Returns the loader's own error if this is [`Error::Load`] and the
    /// loader's error type is `E`.
    ///
    /// ```
    /// # use pgbatch::Error;
    /// # use std::sync::Arc;
    /// let err = Error::Load(Arc::new(std::io::Error::other("db down")));
    /// assert!(err.load_error::<std::io::Error>().is_some());
    /// assert!(err.load_error::<std::fmt::Error>().is_none());
    /// ```
    pub fn load_error<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            Error::Load(e) => e.downcast_ref::<E>(),
            _ => None,
        }
    }
}

/// What a request that timed out had waited for: its deadline, and whether
/// its key was still waiting for a load to start (the batcher was busy
/// with as many loads as it allows) or in a load that had not answered
/// (the database was slow, or not answering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedOut {
    after: Duration,
    waited: Waited,
}

/// What a timed-out request was waiting for; see [`TimedOut`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Waited {
    /// Its key waited for a load to start: every load the batcher allows
    /// was running.
    ForALoad,
    /// Its key was in a load that had run this long without answering.
    InALoad(Duration),
    /// What it waited for is not known (the caller's own timer fired, on
    /// paths the worker does not time).
    Unknown,
}

impl TimedOut {
    /// A request that timed out after `after`, having waited as `waited`
    /// says.
    pub fn new(after: Duration, waited: Waited) -> Self {
        Self { after, waited }
    }

    /// The request's deadline: how long it waited in all.
    pub fn after(&self) -> Duration {
        self.after
    }

    /// What it was waiting for when the deadline passed.
    pub fn waited(&self) -> Waited {
        self.waited
    }
}

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "request timed out after {:?}", self.after)?;
        match self.waited {
            Waited::ForALoad => f.write_str(
                " waiting for a load to start: every load the batcher allows was running",
            ),
            Waited::InALoad(running) => write!(
                f,
                " waiting for its load, which had run {running:.1?} without an answer from the \
                 database"
            ),
            Waited::Unknown => Ok(()),
        }
    }
}

/// Whether `e` is a database error of a driver the crate knows, and if so
/// whether it is retryable.
#[allow(unused_variables)] // `e`, with no driver feature on
fn retryable_db_error(e: &(dyn std::error::Error + 'static)) -> Option<bool> {
    // A loader that asks another batcher (a cache's fallible loader, say).
    if let Some(e) = e.downcast_ref::<Error>() {
        return Some(e.is_retryable());
    }
    #[cfg(any(feature = "postgres", feature = "sqlx"))]
    if let Some(e) = crate::db::classified(e) {
        return Some(e.is_retryable());
    }
    None
}

/// An invalid [`BatcherBuilder`](crate::BatcherBuilder) setting, reported by
/// `build` before anything is spawned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A numeric setting is below its minimum.
    #[error("`{setting}` must be at least {min}, got {value}")]
    TooSmall {
        /// The builder method that was given the value.
        setting: &'static str,
        /// The smallest accepted value.
        min: usize,
        /// The value that was given.
        value: usize,
    },

    /// A numeric setting is above its maximum.
    #[error("`{setting}` must be at most {max}, got {value}")]
    TooLarge {
        /// The builder method that was given the value.
        setting: &'static str,
        /// The largest accepted value.
        max: usize,
        /// The value that was given.
        value: usize,
    },

    /// A duration that must be positive was zero.
    #[error("`{setting}` must be greater than zero")]
    ZeroDuration {
        /// The builder method that was given the value.
        setting: &'static str,
    },

    /// `build` was called outside a Tokio runtime, so the worker task could
    /// not be spawned. Use `build_pair` to run the worker yourself.
    #[error("no Tokio runtime to spawn the batcher worker on")]
    NoRuntime,
}

/// Displays an error with its source chain, `outer: inner: root`, each
/// message once: a driver's error often prints its cause itself
/// (tokio-postgres's "db error: ERROR: ..." and then the same report as
/// its source), and such a cause is not printed again.
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut text = self.0.to_string();
        let mut source = self.0.source();
        while let Some(e) = source {
            let more = e.to_string();
            if !more.is_empty() && !text.contains(&more) {
                text.push_str(": ");
                text.push_str(&more);
            }
            source = e.source();
        }
        f.write_str(&text)
    }
}

/// The message of a caught panic, for [`Error::LoaderPanicked`].
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("database query failed")]
    struct Outer(#[source] std::io::Error);

    /// Prints its cause itself, and has it as its source too, as
    /// tokio-postgres's errors do.
    #[derive(Debug, thiserror::Error)]
    #[error("db error: {0}")]
    struct SaysItsCause(#[source] std::io::Error);

    #[test]
    fn a_timeout_says_what_it_waited_for() {
        let second = Duration::from_secs(1);
        for (waited, says) in [
            (Waited::ForALoad, "waiting for a load to start"),
            (
                Waited::InALoad(Duration::from_millis(900)),
                "waiting for its load, which had run 900.0ms without an answer",
            ),
        ] {
            let e = Error::Timeout(TimedOut::new(second, waited));
            let text = e.to_string();
            assert!(text.starts_with("request timed out after 1s"), "{text}");
            assert!(text.contains(says), "{text}");
        }
    }

    #[test]
    fn a_load_error_names_its_cause_once() {
        let e = Error::load(Outer(std::io::Error::other("connection reset by peer")));
        assert_eq!(
            e.to_string(),
            "batch load failed: database query failed: connection reset by peer"
        );
        assert!(std::error::Error::source(&e).is_none(), "not twice");
        let e = Error::load(SaysItsCause(std::io::Error::other("ERROR: no such column")));
        assert_eq!(
            e.to_string(),
            "batch load failed: db error: ERROR: no such column"
        );
        assert!(e.load_error::<SaysItsCause>().is_some());
    }

    #[test]
    fn shed_requests_timeouts_and_known_database_errors_are_retryable() {
        for e in [
            Error::Overloaded,
            Error::Timeout(TimedOut::new(Duration::from_secs(1), Waited::ForALoad)),
            Error::LoadTimeout(Duration::from_secs(1)),
        ] {
            assert!(e.is_retryable(), "{e:?}");
        }
        for e in [
            Error::Closed,
            Error::LoaderPanicked("boom".into()),
            Error::load(Outer(std::io::Error::other("reset"))),
        ] {
            assert!(!e.is_retryable(), "{e:?}");
        }
    }
}
