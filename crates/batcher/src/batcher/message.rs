//! What travels from a [`Batcher`](super::Batcher) handle to its worker.

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::ledger::Request;
use super::observer::Stamp;
use crate::Error;

/// What one caller eventually receives: the value, "not found", or why not.
pub(crate) type Reply<V> = Result<Option<V>, Error>;
/// The worker's half of a caller's reply channel.
pub(crate) type Tx<V> = oneshot::Sender<Reply<V>>;
/// The caller's half of its reply channel.
pub(crate) type Rx<V> = oneshot::Receiver<Reply<V>>;

/// One caller's request for one key, as one scope (`()` unscoped).
#[derive(Debug)]
pub(crate) struct Message<S, K, V> {
    pub(crate) scope: S,
    pub(crate) key: K,
    pub(crate) tx: Tx<V>,
    /// When the caller enqueued it, for the queue-wait histogram.
    pub(crate) enqueued_at: Instant,
    /// The caller's span, linked from the batch span so a trace shows which
    /// requests a batch served.
    pub(crate) span: tracing::Span,
    /// Set by an observer's request (a cache miss, see [`super::observer`]);
    /// `None` for a plain load.
    pub(crate) stamp: Option<Stamp>,
}

/// A caller waiting for a key, as the worker keeps it in its
/// [ledger](super::ledger).
#[derive(Debug)]
pub(crate) struct Waiter<V> {
    pub(crate) tx: Tx<V>,
    pub(crate) enqueued_at: Instant,
    pub(crate) span: tracing::Span,
    pub(crate) stamp: Option<Stamp>,
}

impl<V> Request for Waiter<V> {
    type Tag = Stamp;

    fn asked_at(&self) -> Instant {
        self.enqueued_at
    }

    fn tag(&self) -> Option<Stamp> {
        self.stamp
    }

    /// The caller dropped its future (cancelled or timed out).
    fn is_gone(&self) -> bool {
        self.tx.is_closed()
    }
}
