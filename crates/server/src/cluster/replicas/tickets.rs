//! Invalidation tickets: after a cache entry is dropped, cache fills go to
//! the primary until the listener has read the primary's position, and then
//! only to replicas that replayed that far.

use std::sync::atomic::Ordering;

use tokio_postgres::types::PgLsn;

use super::ReadRouter;

impl ReadRouter {
    /// A cache entry is about to be dropped (a local write, or a
    /// notification): until the invalidation listener has read the
    /// primary's position after it ([`settle`](Self::settle)), cache fills
    /// go to the primary, and after, only to replicas past that position.
    pub fn begin_invalidation(&self) {
        if self.has_replicas() {
            self.0.invalidations.fetch_add(1, Ordering::AcqRel);
            self.0.position_wanted.notify_one();
        }
    }

    /// The last invalidation begun, for [`settle`](Self::settle).
    pub fn ticket(&self) -> u64 {
        self.0.invalidations.load(Ordering::Acquire)
    }

    /// Waits until an invalidation wants settling; returns its ticket for
    /// [`settle`](Self::settle). Never returns without replicas.
    pub async fn position_wanted(&self) -> u64 {
        if !self.has_replicas() {
            std::future::pending::<()>().await;
        }
        self.0.position_wanted.notified().await;
        self.0.invalidations.load(Ordering::Acquire)
    }

    /// The invalidations up to `ticket` are applied, and `position` is the
    /// primary's WAL position read after they were received: cache fills
    /// may use replicas that replayed that far.
    pub fn settle(&self, ticket: u64, position: PgLsn) {
        self.0
            .fill_floor
            .fetch_max(u64::from(position), Ordering::AcqRel);
        self.0.settled.fetch_max(ticket, Ordering::AcqRel);
    }
}
