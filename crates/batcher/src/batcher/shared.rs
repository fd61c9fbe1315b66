//! State shared by every [`Batcher`](super::Batcher) handle and the worker,
//! and the guards that keep its counters honest when a future is dropped.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::config::{Concurrency, Config};
use super::limit::start;
use super::policy;
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
    /// Loads running, the worker's and direct ones. Only [`LoadSlot`]
    /// changes it.
    running: AtomicUsize,
    /// How many loads may run at once now: the fixed
    /// [`Concurrency`](super::config::Concurrency), or the automatic
    /// limit's current value, which only the worker sets.
    limit: AtomicUsize,
    /// Set once the worker runs: an unrun worker answers nothing, and direct
    /// loads must not pretend otherwise.
    worker_running: AtomicBool,
}

impl Shared {
    pub(crate) fn new(config: Config) -> Self {
        let limit = match config.concurrency {
            Concurrency::Fixed(n) => n,
            Concurrency::Auto { max } => start(policy::min_auto_limit(&config), max),
        };
        Self {
            limit: AtomicUsize::new(limit),
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

    /// How many load slots are taken.
    pub(crate) fn running_loads(&self) -> usize {
        self.running.load(SeqCst)
    }

    /// How many loads may run at once now.
    pub(crate) fn limit(&self) -> usize {
        self.limit.load(SeqCst)
    }

    /// Sets the automatic limit (the worker's job). Loads running beyond a
    /// lowered limit finish; no new one starts until they have.
    pub(crate) fn set_limit(&self, limit: usize) {
        self.limit.store(limit, SeqCst);
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

/// One of the load slots the limit allows, shared by the worker and
/// callers that load directly; freed when dropped, so a load that fails,
/// panics, times out or is cancelled cannot leak its slot.
#[derive(Debug)]
pub(crate) struct LoadSlot {
    shared: Arc<Shared>,
}

impl LoadSlot {
    /// Takes a slot if one is free.
    pub(crate) fn try_take(shared: &Arc<Shared>) -> Option<Self> {
        let max = shared.limit();
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
            concurrency: Concurrency::Fixed(slots),
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

    #[test]
    fn a_lowered_limit_stops_new_slots_until_running_ones_end() {
        let s = shared(4);
        let held: Vec<_> = (0..3).map(|_| LoadSlot::try_take(&s).unwrap()).collect();
        s.set_limit(2);
        assert!(LoadSlot::try_take(&s).is_none(), "3 running, limit 2");
        drop(held);
        let a = LoadSlot::try_take(&s).expect("room again");
        let b = LoadSlot::try_take(&s).expect("room again");
        assert!(LoadSlot::try_take(&s).is_none());
        drop((a, b));
    }
}
