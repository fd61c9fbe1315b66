//! State shared by every [`Batcher`](super::Batcher) handle and the worker,
//! and the guards that keep its counters honest when a future is dropped.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::config::Config;
use crate::stats::Stats;

/// State shared by every handle and the worker.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) stats: Stats,
    /// Cancelled by [`Batcher::shutdown`](super::Batcher::shutdown); the
    /// worker then stops taking new requests and answers the queued ones.
    pub(crate) shutdown: CancellationToken,
    /// Cancelled when the worker is gone (finished, or dropped unrun), so
    /// `shutdown` can wait for it without a handle to the task.
    pub(crate) done: CancellationToken,
    /// Requests in progress in `load` and `load_many` calls: zero means
    /// idle.
    outstanding: AtomicUsize,
    /// Loads running, the worker's and direct ones: the slots of
    /// `max_concurrent_batches`. Only [`LoadSlot`] changes it.
    running: AtomicUsize,
    /// Set once the worker runs: an unrun worker answers nothing, and direct
    /// loads must not pretend otherwise.
    worker_running: AtomicBool,
}

impl Shared {
    pub(crate) fn new(config: Config) -> Self {
        Self {
            config,
            stats: Stats::new(),
            shutdown: CancellationToken::new(),
            done: CancellationToken::new(),
            outstanding: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            worker_running: AtomicBool::new(false),
        }
    }

    /// Counts a request in progress until the returned guard is dropped;
    /// `alone` says whether no other request was in progress.
    pub(crate) fn start_request(&self) -> Outstanding<'_> {
        let alone = self.outstanding.fetch_add(1, SeqCst) == 0;
        Outstanding {
            counter: &self.outstanding,
            alone,
        }
    }

    /// How many of the `max_concurrent_batches` load slots are taken.
    pub(crate) fn running_loads(&self) -> usize {
        self.running.load(SeqCst)
    }

    pub(crate) fn mark_worker_running(&self) {
        self.worker_running.store(true, SeqCst);
    }

    pub(crate) fn is_worker_running(&self) -> bool {
        self.worker_running.load(SeqCst)
    }
}

/// One request in progress, counted in [`Shared`] until dropped, so a
/// cancelled caller releases what it counted.
#[derive(Debug)]
pub(crate) struct Outstanding<'a> {
    counter: &'a AtomicUsize,
    /// No other request was in progress when this one started.
    pub(crate) alone: bool,
}

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, SeqCst);
    }
}

/// One of the `max_concurrent_batches` load slots, shared by the worker and
/// callers that load directly; freed when dropped, so a load that fails,
/// panics, times out or is cancelled cannot leak its slot.
#[derive(Debug)]
pub(crate) struct LoadSlot {
    shared: Arc<Shared>,
}

impl LoadSlot {
    /// Takes a slot if one is free.
    pub(crate) fn try_take(shared: &Arc<Shared>) -> Option<Self> {
        let max = shared.config.max_concurrent_batches;
        shared
            .running
            .fetch_update(SeqCst, SeqCst, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| Self {
                shared: Arc::clone(shared),
            })
    }
}

impl Drop for LoadSlot {
    fn drop(&mut self) {
        self.shared.running.fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(slots: usize) -> Arc<Shared> {
        Arc::new(Shared::new(Config {
            max_concurrent_batches: slots,
            ..Config::default()
        }))
    }

    #[test]
    fn slots_are_capped_and_freed_on_drop() {
        let s = shared(2);
        let a = LoadSlot::try_take(&s).expect("first slot");
        let b = LoadSlot::try_take(&s).expect("second slot");
        assert!(LoadSlot::try_take(&s).is_none(), "only two slots");
        assert_eq!(s.running_loads(), 2);
        drop(a);
        assert_eq!(s.running_loads(), 1);
        let c = LoadSlot::try_take(&s).expect("a freed slot is taken again");
        drop((b, c));
        assert_eq!(s.running_loads(), 0);
    }

    #[test]
    fn only_the_first_of_overlapping_requests_is_alone() {
        let s = shared(1);
        let first = s.start_request();
        let second = s.start_request();
        assert!(first.alone && !second.alone);
        drop((first, second));
        assert!(s.start_request().alone, "dropped guards uncount");
    }
}
