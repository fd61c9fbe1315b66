//! Which database a read goes to, and the read's retry on the primary
//! when a replica fails it.

use std::future::Future;
use std::sync::atomic::Ordering;

use pgbatch::pg::PgError;
use tokio_postgres::types::PgLsn;

use super::{ReadRouter, Replica};

/// SQLSTATE class 40, which a replica uses to cancel a query that
/// conflicts with the WAL it replays.
const TRANSACTION_ROLLBACK_CLASS: &str = "40";

/// What a read needs of the database that answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Anything within the replica lag bound.
    Any,
    /// A value that will be cached: nothing older than the invalidations
    /// already applied.
    CacheFill,
    /// Every change committed up to this WAL position (a client's
    /// read-your-writes position).
    Position(PgLsn),
    /// Both: what [`CacheFill`](Self::CacheFill) needs and this position.
    /// For credentials read at a client's position: an old (or forged)
    /// position must not let a replica answer that has not replayed a
    /// revocation this instance has applied.
    CacheFillAt(PgLsn),
}

/// Why a read went to the primary although replicas are configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Every replica is down, out of recovery, or lags past the bound.
    NoneUsable,
    /// No usable replica had replayed the position the read presented.
    PositionNotReplayed,
    /// A cache fill while an invalidation is settling or the listener is
    /// down, or no replica had replayed the last invalidation.
    CacheFill,
    /// The replica chosen failed the read; it ran again on the primary.
    ReplicaFailed,
}

impl Fallback {
    /// Every reason, in declaration order (`reason as usize` indexes it).
    pub const ALL: [Self; 4] = [
        Self::NoneUsable,
        Self::PositionNotReplayed,
        Self::CacheFill,
        Self::ReplicaFailed,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::NoneUsable => "none_usable",
            Self::PositionNotReplayed => "position_not_replayed",
            Self::CacheFill => "cache_fill",
            Self::ReplicaFailed => "replica_failed",
        }
    }
}

impl ReadRouter {
    /// Runs `attempt` on the pool chosen for `needs` (its index in
    /// [`pools`](Self::pools)); if a replica was chosen and fails or takes
    /// longer than its budget, runs it again on the primary.
    ///
    /// # Errors
    ///
    /// The primary's error (a replica's is logged and retried).
    pub async fn read<T, F, Fut>(&self, needs: Needs, attempt: F) -> Result<T, PgError>
    where
        F: Fn(usize) -> Fut,
        Fut: Future<Output = Result<T, PgError>>,
    {
        let Some(i) = self.choose(needs) else {
            self.0.primary_reads.fetch_add(1, Ordering::Relaxed);
            return attempt(0).await;
        };
        let replica = &self.0.replicas[i];
        match tokio::time::timeout(self.0.replica_budget, attempt(i + 1)).await {
            Ok(Ok(value)) => {
                replica.reads.fetch_add(1, Ordering::Relaxed);
                return Ok(value);
            }
            Ok(Err(e)) => {
                // A query cancelled by a conflict with recovery says
                // nothing about the replica's health; anything else does.
                let conflict = e
                    .as_db_error()
                    .is_some_and(|db| db.code().code().starts_with(TRANSACTION_ROLLBACK_CLASS));
                if !conflict {
                    self.replica_failed(replica, &e.to_string());
                }
            }
            Err(_) => self.replica_failed(replica, "slower than its read budget"),
        }
        self.count_fallback(Fallback::ReplicaFailed);
        self.0.primary_reads.fetch_add(1, Ordering::Relaxed);
        attempt(0).await
    }

    fn replica_failed(&self, replica: &Replica, why: &str) {
        replica.failures.fetch_add(1, Ordering::Relaxed);
        if replica.usable.swap(false, Ordering::AcqRel) {
            tracing::warn!(replica = %replica.name, error = why,
                "a replica failed a read; reads go elsewhere until it answers a poll");
        }
    }

    /// The replica (index into the replicas) for a read that `needs`,
    /// or `None` for the primary (counted, with why, when replicas exist).
    fn choose(&self, needs: Needs) -> Option<usize> {
        let inner = &*self.0;
        let n = inner.replicas.len();
        if n == 0 {
            return None;
        }
        let floor = match needs {
            Needs::Any => 0,
            Needs::Position(lsn) => u64::from(lsn),
            Needs::CacheFill | Needs::CacheFillAt(_) => {
                let settled = inner.settled.load(Ordering::Acquire);
                if !inner.coherence.caches_usable()
                    || settled < inner.invalidations.load(Ordering::Acquire)
                {
                    self.count_fallback(Fallback::CacheFill);
                    return None;
                }
                let floor = inner.fill_floor.load(Ordering::Acquire);
                match needs {
                    Needs::CacheFillAt(lsn) => floor.max(u64::from(lsn)),
                    _ => floor,
                }
            }
        };
        // Round robin from a moving start, over the usable replicas that
        // have replayed far enough.
        let start = inner.next.fetch_add(1, Ordering::Relaxed);
        let mut any_usable = false;
        for step in 0..n {
            let i = (start + step) % n;
            let replica = &inner.replicas[i];
            if !replica.usable.load(Ordering::Acquire) {
                continue;
            }
            any_usable = true;
            if replica.replay.load(Ordering::Acquire) >= floor {
                return Some(i);
            }
        }
        self.count_fallback(match (any_usable, needs) {
            (false, _) => Fallback::NoneUsable,
            (true, Needs::CacheFill | Needs::CacheFillAt(_)) => Fallback::CacheFill,
            (true, _) => Fallback::PositionNotReplayed,
        });
        None
    }

    /// Counts why a read goes to the primary (which [`read`](Self::read)
    /// counts as a primary read).
    fn count_fallback(&self, why: Fallback) {
        self.0.fallbacks[why as usize].fetch_add(1, Ordering::Relaxed);
    }
}
