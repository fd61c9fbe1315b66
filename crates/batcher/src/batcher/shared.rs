//! State shared by every [`Batcher`](super::Batcher) handle and the worker,
//! and the guards that keep its counters honest when a future is dropped.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use tokio_util::sync::CancellationToken;

use super::config::{Concurrency, Config};
use super::limit::{start, LoadTimes};
use super::policy;
use crate::stats::Stats;

/// State shared by every handle and the worker.
///
/// Every caller reads `config` on every request. What is written often
/// lives on cache lines of its own ([`CachePadded`]): the load slots
/// (twice per load) and the statistics (by the worker, per key). Sharing a
/// line with them, each read of the settings missed the cache; the
/// in-memory profile put a third of a caller's own time there.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: Config,
    /// Cancelled by [`Batcher::shutdown`](super::Batcher::shutdown); the
    /// worker then stops taking new requests and answers the queued ones.
    pub(crate) shutdown: CancellationToken,
    /// Cancelled when the worker is gone (finished, or dropped unrun), so
    /// `shutdown` can wait for it without a handle to the task.
    pub(crate) done: CancellationToken,
    /// Set once the worker runs: an unrun worker answers nothing, and direct
    /// loads must not pretend otherwise.
    worker_running: AtomicBool,
    slots: CachePadded<Slots>,
    pub(crate) stats: CachePadded<Stats>,
}

/// The load slots: how many are taken, and how many may be.
#[derive(Debug)]
struct Slots {
    /// Loads running, the worker's and direct ones. Only [`LoadSlot`]
    /// changes it.
    running: AtomicUsize,
    /// How many loads may run at once now: the fixed
    /// [`Concurrency`](super::config::Concurrency), or the automatic
    /// limit's current value, which only the worker sets.
    limit: AtomicUsize,
}

impl Shared {
    pub(crate) fn new(config: Config) -> Self {
        let limit = match config.concurrency {
            Concurrency::Fixed(n) => n,
            Concurrency::Auto { max } => start(policy::min_auto_limit(&config), max),
        };
        Self {
            slots: CachePadded::new(Slots {
                running: AtomicUsize::new(0),
                limit: AtomicUsize::new(limit),
            }),
            config,
            stats: CachePadded::new(Stats::new()),
            shutdown: CancellationToken::new(),
            done: CancellationToken::new(),
            worker_running: AtomicBool::new(false),
        }
    }

    /// How many load slots are taken.
    pub(crate) fn running_loads(&self) -> usize {
        self.slots.running.load(SeqCst)
    }

    /// How many loads may run at once now.
    pub(crate) fn limit(&self) -> usize {
        self.slots.limit.load(SeqCst)
    }

    /// Sets the automatic limit (the worker's job). Loads running beyond a
    /// lowered limit finish; no new one starts until they have.
    pub(crate) fn set_limit(&self, limit: usize) {
        self.slots.limit.store(limit, SeqCst);
    }

    /// Takes in what the automatic limit made of a load: its new value,
    /// if it changed, and its least and latest mean load time.
    pub(crate) fn adopt(&self, limit: Option<usize>, load_times: Option<LoadTimes>) {
        if let Some(limit) = limit {
            self.set_limit(limit);
            tracing::debug!(batcher = %self.config.name, limit, "concurrency limit");
        }
        if let Some((least, recent)) = load_times {
            self.stats.set_load_times(least, recent);
        }
    }

    pub(crate) fn mark_worker_running(&self) {
        self.worker_running.store(true, SeqCst);
    }

    pub(crate) fn is_worker_running(&self) -> bool {
        self.worker_running.load(SeqCst)
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
            .slots
            .running
            .fetch_update(SeqCst, SeqCst, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| Self {
                shared: Arc::clone(shared),
            })
    }

    /// Takes the first slot: only when no load runs at all, which is how
    /// a caller finds the batcher idle. Callers read
    /// [`Shared::running_loads`] first: under load a slot is nearly always
    /// taken, and that read of a line that changes per load spares the
    /// compare-and-swap, a write that every core would contend on.
    pub(crate) fn try_take_first(shared: &Arc<Shared>) -> Option<Self> {
        shared
            .slots
            .running
            .compare_exchange(0, 1, SeqCst, SeqCst)
            .ok()
            .map(|_| Self {
                shared: Arc::clone(shared),
            })
    }
}

impl Drop for LoadSlot {
    fn drop(&mut self) {
        self.shared.slots.running.fetch_sub(1, SeqCst);
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
    fn the_first_slot_is_taken_only_when_no_load_runs() {
        let s = shared(3);
        let first = LoadSlot::try_take_first(&s).expect("idle: the first slot");
        assert!(LoadSlot::try_take_first(&s).is_none(), "a load runs");
        let other = LoadSlot::try_take(&s).expect("a second slot is free");
        drop(first);
        assert!(
            LoadSlot::try_take_first(&s).is_none(),
            "one load still runs"
        );
        drop(other);
        assert!(LoadSlot::try_take_first(&s).is_some(), "idle again");
        assert_eq!(s.running_loads(), 0, "dropped slots are freed");
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
