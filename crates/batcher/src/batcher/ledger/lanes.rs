//! The worker's keys by scope: each scope's pending batch and the keys of
//! its running loads (its lane), and whose turn it is to load next.
//!
//! A load serves one scope, so keys of different scopes never share one.
//! Lanes with waiting keys take turns in the order they started waiting:
//! the lane at the front gets the next free slot, and goes to the back if
//! keys are still waiting after its load took a batch. So one busy scope
//! cannot starve the others: every scope with waiting keys gets a load
//! before any scope gets a second one. Unscoped, there is one lane.
//!
//! A lane's pending batch holds at most a batch of keys; keys that come
//! while it is full wait behind it in arrival order, and fill the next
//! batch when this one is taken. So under a backlog (every slot busy, keys
//! still coming) taking a batch costs the batch, not the backlog: were a
//! key dearer the longer the backlog, an overloaded batcher would fall
//! further behind the more it fell behind.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::mem;
use std::time::Duration;

use tokio::time::Instant;

use super::{LoadId, Request, Waiters};

/// Room made for a batch before its keys come: batches may hold up to
/// 1024 keys by default, but most hold a few, and a lane is made for each
/// scope that asks.
const SMALL_BATCH: usize = 64;

/// One scope's keys.
pub(crate) struct Lane<S, K, W: Request> {
    pub(crate) scope: S,
    /// Keys of the scope's next batch (at most a batch), and who waits for
    /// each.
    pub(crate) pending: HashMap<K, Waiters<W>>,
    /// Keys asked for while the pending batch was full, and who waits for
    /// each: they fill the next batches, in [`order`](Self::order).
    later: HashMap<K, Waiters<W>>,
    /// `later`'s keys in the order they were first asked for, with when.
    order: VecDeque<(K, Instant)>,
    /// How much earlier than a caller queued before it a caller behind the
    /// batch asked, at most. Callers stamp a request before they queue it,
    /// and a cache's miss before its lookups, so `order` is in time order
    /// only to within this, and a caller joining a key behind the batch
    /// may have asked before the key's first; expiry allows for it.
    skew: Duration,
    /// When the latest caller behind the batch asked, since none waited
    /// there: what each caller added is measured against for `skew`.
    latest: Option<Instant>,
    /// When the pending batch's first key was asked for: the flush delay
    /// counts from here.
    pub(crate) first_at: Option<Instant>,
    /// Which running load of this scope has each key, and the latest tag
    /// of its tagged requests; kept only where running loads are joined.
    pub(crate) in_flight: HashMap<K, (LoadId, Option<W::Tag>)>,
    /// Loads of this scope running.
    pub(crate) loads: usize,
    /// Whether the lane is in [`Lanes::turns`].
    queued: bool,
}

impl<S, K: Eq + Hash, W: Request> Lane<S, K, W> {
    /// Moves the keys behind the pending batch into it, first asked for
    /// first, until it holds `batch_size` keys.
    fn fill(&mut self, batch_size: usize) {
        while self.pending.len() < batch_size {
            let Some((key, _)) = self.order.pop_front() else {
                break;
            };
            let Some((key, waiters)) = self.later.remove_entry(&key) else {
                debug_assert!(false, "`order` holds `later`'s keys");
                continue;
            };
            if let Some(w) = waiters.first() {
                // `order` is in time order only to within `skew`: the
                // earliest, to be exact.
                let at = self.first_at.map_or(w.asked_at(), |f| f.min(w.asked_at()));
                self.first_at = Some(at);
            }
            self.pending.insert(key, waiters);
        }
        self.forget_skew_if_empty();
    }

    /// Records that a caller behind the batch asked `at`. Measured against
    /// the latest caller before it, not only the key queued last: after
    /// callers at 30, 20 and 10 ms, the first key's sweep must allow for
    /// 20 ms, not 10.
    fn behind_at(&mut self, at: Instant) {
        let latest = self.latest.map_or(at, |l| l.max(at));
        self.skew = self.skew.max(latest - at);
        self.latest = Some(latest);
    }

    /// Once no caller waits behind the batch, its order is exact again.
    fn forget_skew_if_empty(&mut self) {
        if self.later.is_empty() {
            self.skew = Duration::ZERO;
            self.latest = None;
        }
    }

    /// Runs `sweep` over the waiters of the keys behind the pending batch
    /// that may have a caller asked for at a `due` moment, first asked for
    /// first, and stops at the first key that may not: the ones after it
    /// may not either. Keys left with no waiter go; the others keep their
    /// place. Returns a moment no caller behind the batch asked before.
    pub(crate) fn sweep_later(
        &mut self,
        due: impl Fn(Instant) -> bool,
        mut sweep: impl FnMut(&mut Waiters<W>),
    ) -> Option<Instant> {
        let skew = self.skew;
        let earliest = |at: Instant| at.checked_sub(skew).unwrap_or(at);
        let mut kept = Vec::new();
        let mut next = None;
        while let Some((_, at)) = self.order.front() {
            let at = earliest(*at);
            if !due(at) {
                next = Some(at);
                break;
            }
            let (key, first) = self.order.pop_front().expect("just seen");
            let Some(waiters) = self.later.get_mut(&key) else {
                debug_assert!(false, "`order` holds `later`'s keys");
                continue;
            };
            sweep(waiters);
            if waiters.is_empty() {
                self.later.remove(&key);
            } else {
                kept.push((key, first));
            }
        }
        // Back at the front, in their order: a key whose first callers
        // timed out keeps its place, so its later callers are swept with
        // the keys around it (at most `later`'s keys are kept each sweep).
        for entry in kept.into_iter().rev() {
            self.order.push_front(entry);
        }
        // Every key that leaves `later` leaves `order` with it, so a
        // stalled lane's expiries cannot pile entries up.
        debug_assert_eq!(self.order.len(), self.later.len());
        self.forget_skew_if_empty();
        next
    }

    /// Whether a caller waits for `key`, in the pending batch or behind it.
    pub(crate) fn waits_for(&self, key: &K) -> bool {
        self.pending.contains_key(key) || (!self.later.is_empty() && self.later.contains_key(key))
    }
}

/// How [`Lanes::add`] placed a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Added {
    /// A new key of the pending batch, or behind it when it is full.
    New,
    /// Joined its key's waiters; `tagged` if one of them carries a tag (an
    /// observer's request).
    Joined { tagged: bool },
}

/// Every scope's lane, by index (stable while the lane lives).
pub(crate) struct Lanes<S, K, W: Request> {
    slots: Vec<Option<Lane<S, K, W>>>,
    index: HashMap<S, usize>,
    free: Vec<usize>,
    /// Lanes with pending keys, front first.
    turns: VecDeque<usize>,
    /// Pending keys of every lane, with the requests waiting behind them.
    pending_keys: usize,
    /// The lane found last: most requests come from the scope of the one
    /// before (all of them unscoped), so it is tried before the index.
    recent: usize,
    /// The most keys of a pending batch.
    batch_size: usize,
}

impl<S, K, W> Lanes<S, K, W>
where
    S: Clone + Eq + Hash,
    K: Clone + Eq + Hash,
    W: Request,
{
    pub(crate) fn new(batch_size: usize) -> Self {
        Self {
            slots: Vec::new(),
            index: HashMap::new(),
            free: Vec::new(),
            turns: VecDeque::new(),
            pending_keys: 0,
            recent: 0,
            batch_size,
        }
    }

    /// The lane of `scope`, made if it has none.
    pub(crate) fn lane_of(&mut self, scope: S) -> usize {
        if let Some(Some(lane)) = self.slots.get(self.recent) {
            if lane.scope == scope {
                return self.recent;
            }
        }
        let i = match self.index.entry(scope) {
            Entry::Occupied(e) => *e.get(),
            Entry::Vacant(e) => {
                let lane = Lane {
                    scope: e.key().clone(),
                    pending: HashMap::with_capacity(self.batch_size.min(SMALL_BATCH)),
                    later: HashMap::new(),
                    order: VecDeque::new(),
                    skew: Duration::ZERO,
                    latest: None,
                    first_at: None,
                    in_flight: HashMap::new(),
                    loads: 0,
                    queued: false,
                };
                let i = match self.free.pop() {
                    Some(i) => {
                        self.slots[i] = Some(lane);
                        i
                    }
                    None => {
                        self.slots.push(Some(lane));
                        self.slots.len() - 1
                    }
                };
                *e.insert(i)
            }
        };
        self.recent = i;
        i
    }

    pub(crate) fn get(&self, i: usize) -> &Lane<S, K, W> {
        self.slots[i].as_ref().expect("a live lane")
    }

    pub(crate) fn get_mut(&mut self, i: usize) -> &mut Lane<S, K, W> {
        self.slots[i].as_mut().expect("a live lane")
    }

    /// Adds a caller waiting for `key` to lane `i`: to the key's waiters,
    /// as a new key of the pending batch, or behind it when it is full (or
    /// keys already wait behind it, whose turn comes first).
    pub(crate) fn add(&mut self, i: usize, key: K, waiter: W) -> Added {
        let at = waiter.asked_at();
        let lane = self.slots[i].as_mut().expect("a live lane");
        let joined = |waiters: &mut Waiters<W>, waiter| {
            let tagged = waiters.iter().any(|w| w.tag().is_some());
            waiters.push(waiter);
            Added::Joined { tagged }
        };
        if lane.pending.len() < self.batch_size && lane.later.is_empty() {
            match lane.pending.entry(key) {
                Entry::Occupied(mut e) => return joined(e.get_mut(), waiter),
                Entry::Vacant(e) => {
                    e.insert(smallvec::smallvec![waiter]);
                    lane.first_at.get_or_insert(at);
                }
            }
        } else if let Some(waiters) = lane.pending.get_mut(&key) {
            return joined(waiters, waiter);
        } else {
            lane.behind_at(at);
            match lane.later.entry(key) {
                Entry::Occupied(mut e) => return joined(e.get_mut(), waiter),
                Entry::Vacant(e) => {
                    // The one clone of a key past a full batch: the order
                    // it came in, so that taking a batch costs the batch.
                    lane.order.push_back((e.key().clone(), at));
                    e.insert(smallvec::smallvec![waiter]);
                }
            }
        }
        self.pending_keys += 1;
        if !lane.queued {
            lane.queued = true;
            self.turns.push_back(i);
        }
        Added::New
    }

    /// Pending keys, all lanes together.
    pub(crate) fn pending_keys(&self) -> usize {
        self.pending_keys
    }

    /// The lane whose turn it is to load, if any has pending keys.
    pub(crate) fn next(&mut self) -> Option<usize> {
        // A lane whose keys all expired keeps its place until here.
        while let Some(&i) = self.turns.front() {
            if !self.get(i).pending.is_empty() {
                return Some(i);
            }
            self.turns.pop_front();
            self.get_mut(i).queued = false;
            self.release_if_idle(i);
        }
        None
    }

    /// Takes lane `i`'s pending batch, or `most` of its keys, fills the
    /// next from the keys behind it (first asked for first, so a key is
    /// not passed over until it times out), and passes the lane's turn on:
    /// to the back if keys still wait.
    pub(crate) fn take(&mut self, i: usize, most: usize) -> HashMap<K, Waiters<W>> {
        let lane = self.slots[i].as_mut().expect("a live lane");
        let batch = if lane.pending.len() > most {
            // Part of the batch, to spread a burst over free slots: the
            // keys left keep the batch's `first_at`, no later than their
            // own.
            // (`HashMap::extract_if` would do it in place, but is newer
            // than the crate's minimum Rust.)
            let mut keys = mem::take(&mut lane.pending).into_iter();
            let batch: HashMap<_, _> = keys.by_ref().take(most).collect();
            lane.pending = keys.collect();
            batch
        } else {
            let room = if lane.later.is_empty() {
                lane.pending.len()
            } else {
                self.batch_size.min(SMALL_BATCH)
            };
            lane.first_at = None;
            mem::replace(&mut lane.pending, HashMap::with_capacity(room))
        };
        lane.fill(self.batch_size);
        self.pending_keys -= batch.len();
        if self.turns.front() == Some(&i) {
            self.turns.pop_front();
        } else if let Some(at) = self.turns.iter().position(|&t| t == i) {
            self.turns.remove(at);
        }
        let lane = self.get_mut(i);
        lane.queued = !lane.pending.is_empty();
        if lane.queued {
            self.turns.push_back(i);
        }
        batch
    }

    /// Runs `f` over every lane with pending keys (to expire some), fills
    /// the batches that lost keys from the keys behind them, and counts
    /// what is left.
    pub(crate) fn sweep_pending(&mut self, mut f: impl FnMut(&mut Lane<S, K, W>)) {
        let mut keys = 0;
        for &i in &self.turns {
            let lane = self.slots[i].as_mut().expect("a live lane");
            f(lane);
            if lane.pending.is_empty() {
                lane.first_at = None;
            }
            lane.fill(self.batch_size);
            keys += lane.pending.len() + lane.later.len();
        }
        self.pending_keys = keys;
    }

    /// Frees lane `i` if nothing of its scope waits or runs.
    pub(crate) fn release_if_idle(&mut self, i: usize) {
        // Released already (by `next`, while a completion flushed).
        let Some(lane) = self.slots[i].as_ref() else {
            return;
        };
        if lane.queued
            || lane.loads > 0
            || !lane.pending.is_empty()
            || !lane.later.is_empty()
            || !lane.in_flight.is_empty()
        {
            return;
        }
        let lane = self.slots[i].take().expect("a live lane");
        self.index.remove(&lane.scope);
        self.free.push(i);
    }

    /// How many scopes have a lane (pending keys or running loads).
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batcher::ledger::tests::Asked;

    fn waiter(at: Instant) -> Asked {
        Asked::at(at)
    }

    /// Sweeps the keys behind every lane's batch as if the callers who
    /// asked before `before` timed out: the number of waiters of each key
    /// looked at, and what `sweep_later` returned.
    fn sweep_before(
        lanes: &mut Lanes<&'static str, u32, Asked>,
        before: Instant,
    ) -> (Vec<usize>, Option<Instant>) {
        let mut swept = Vec::new();
        let mut next = None;
        lanes.sweep_pending(|lane| {
            next = lane.sweep_later(
                |first| first < before,
                |waiters| {
                    swept.push(waiters.len());
                    waiters.retain(|w| w.asked_at() >= before);
                },
            );
        });
        (swept, next)
    }

    fn add(
        lanes: &mut Lanes<&'static str, u32, Asked>,
        scope: &'static str,
        key: u32,
        at: Instant,
    ) -> Added {
        let i = lanes.lane_of(scope);
        lanes.add(i, key, waiter(at))
    }

    #[tokio::test(start_paused = true)]
    async fn scopes_take_turns_and_a_busy_one_goes_to_the_back() {
        let t = Instant::now();
        let mut lanes = Lanes::new(4);
        for k in 0..6 {
            add(&mut lanes, "busy", k, t);
        }
        add(&mut lanes, "a", 100, t);
        add(&mut lanes, "b", 200, t);
        assert_eq!(lanes.pending_keys(), 8);
        let mut served = Vec::new();
        while let Some(i) = lanes.next() {
            let scope = lanes.get(i).scope;
            let batch = lanes.take(i, usize::MAX);
            served.push((scope, batch.len()));
            lanes.release_if_idle(i);
        }
        assert_eq!(served, [("busy", 4), ("a", 1), ("b", 1), ("busy", 2)]);
        assert_eq!(lanes.pending_keys(), 0);
        assert_eq!(lanes.len(), 0, "idle lanes are released");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lane_with_loads_stays_and_its_index_is_reused_after() {
        let t = Instant::now();
        let mut lanes = Lanes::new(4);
        add(&mut lanes, "a", 1, t);
        let a = lanes.next().unwrap();
        let _ = lanes.take(a, usize::MAX);
        lanes.get_mut(a).loads += 1;
        lanes.release_if_idle(a);
        assert_eq!(lanes.len(), 1, "a load still runs");
        assert_eq!(lanes.lane_of("a"), a);
        lanes.get_mut(a).loads -= 1;
        lanes.release_if_idle(a);
        assert_eq!(lanes.len(), 0);
        let b = lanes.lane_of("b");
        assert_eq!(b, a, "the freed place is reused");
    }

    #[tokio::test(start_paused = true)]
    async fn keys_past_a_batch_wait_behind_it_in_order_and_fill_the_next() {
        let t = Instant::now();
        let mut lanes = Lanes::new(4);
        let at = |k: u32| t + Duration::from_micros(u64::from(k));
        for k in 0..10 {
            assert_eq!(add(&mut lanes, "a", k, at(k)), Added::New, "key {k}");
        }
        // A key of the pending batch joins it, even with keys behind it...
        let joined = Added::Joined { tagged: false };
        assert_eq!(add(&mut lanes, "a", 2, at(10)), joined);
        // ...and one behind it joins there: still one load for both.
        assert_eq!(add(&mut lanes, "a", 5, at(11)), joined);
        assert_eq!(lanes.pending_keys(), 10, "4 pending, 6 behind");
        let i = lanes.lane_of("a");
        let mut batches = Vec::new();
        while lanes.next().is_some() {
            let batch = lanes.take(i, usize::MAX);
            let mut keys: Vec<(u32, usize)> = batch.iter().map(|(k, w)| (*k, w.len())).collect();
            keys.sort_unstable();
            batches.push(keys);
        }
        assert_eq!(
            batches,
            [
                vec![(0, 1), (1, 1), (2, 2), (3, 1)],
                vec![(4, 1), (5, 2), (6, 1), (7, 1)],
                vec![(8, 1), (9, 1)],
            ],
            "first asked for first, a batch at most"
        );
        assert_eq!(lanes.pending_keys(), 0);
        assert_eq!(lanes.len(), 1, "a lane goes only when released");
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_batch_waits_from_its_oldest_request() {
        let t = Instant::now();
        let mut lanes = Lanes::new(2);
        let at = |us: u64| t + Duration::from_micros(us);
        add(&mut lanes, "a", 1, at(0));
        add(&mut lanes, "a", 2, at(5));
        // Queued out of order by a few microseconds.
        add(&mut lanes, "a", 3, at(9));
        add(&mut lanes, "a", 4, at(7));
        let i = lanes.lane_of("a");
        assert_eq!(lanes.get(i).first_at, Some(at(0)));
        let _ = lanes.take(i, usize::MAX);
        assert_eq!(lanes.get(i).first_at, Some(at(7)));
        // A take of exactly the batch is a whole one too: the next batch
        // waits from its own oldest request, not the one before.
        add(&mut lanes, "a", 5, at(20));
        assert_eq!(lanes.get(i).pending.len(), 2, "3 and 4 filled the batch");
        let _ = lanes.take(i, 2);
        assert_eq!(lanes.get(i).first_at, Some(at(20)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sweep_answers_the_oldest_keys_behind_and_fills_a_batch_that_lost_keys() {
        let t = Instant::now();
        let mut lanes = Lanes::new(2);
        let at = |ms: u64| t + Duration::from_millis(ms);
        for k in 0..6 {
            add(&mut lanes, "a", k, at(u64::from(k)));
        }
        add(&mut lanes, "a", 3, at(9)); // a second caller of key 3
        let mut swept = Vec::new();
        let mut next = None;
        lanes.sweep_pending(|lane| {
            // As if both pending keys timed out; due: asked for before 4 ms.
            lane.pending.clear();
            next = lane.sweep_later(
                |first| first < at(4),
                |waiters| {
                    swept.push(waiters.len());
                    waiters.retain(|w| w.asked_at() >= at(4));
                },
            );
        });
        assert_eq!(
            swept,
            [1, 2],
            "keys 2 and 3 swept; key 3's later caller stays"
        );
        assert_eq!(next, Some(at(4)), "key 4 is the first not due");
        let i = lanes.lane_of("a");
        let mut pending: Vec<u32> = lanes.get(i).pending.keys().copied().collect();
        pending.sort_unstable();
        assert_eq!(pending, [3, 4], "the batch refilled, first asked for first");
        assert_eq!(lanes.pending_keys(), 3, "two pending, key 5 behind");
        assert_eq!(lanes.get(i).first_at, Some(at(4)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_whose_first_callers_timed_out_keeps_its_place_behind_the_batch() {
        let t = Instant::now();
        let mut lanes = Lanes::new(1);
        let at = |ms: u64| t + Duration::from_millis(ms);
        add(&mut lanes, "a", 0, at(0)); // the pending batch
        add(&mut lanes, "a", 1, at(1));
        add(&mut lanes, "a", 2, at(2));
        // Key 1's second caller.
        add(&mut lanes, "a", 1, at(50));
        assert_eq!(sweep_before(&mut lanes, at(10)), (vec![2, 1], None));
        assert_eq!(lanes.pending_keys(), 2, "0 pending, 1 behind");
        add(&mut lanes, "a", 3, at(60));
        // Key 1 is swept by its place (first asked for at 1 ms), not by its
        // caller left (50 ms): key 3 behind it is not passed over.
        assert_eq!(
            sweep_before(&mut lanes, at(70)),
            (vec![1, 1], None),
            "key 1's second caller, then key 3"
        );
        assert_eq!(lanes.pending_keys(), 1, "only the pending batch");
        assert_eq!(sweep_before(&mut lanes, at(0)), (vec![], None));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_asked_for_before_the_one_queued_ahead_of_it_is_still_swept() {
        let t = Instant::now();
        let mut lanes = Lanes::new(1);
        let at = |ms: u64| t + Duration::from_millis(ms);
        add(&mut lanes, "a", 0, at(0)); // the pending batch
        add(&mut lanes, "a", 1, at(20));
        // A cache miss stamped before its lookups, queued after key 1.
        add(&mut lanes, "a", 2, at(5));
        add(&mut lanes, "a", 3, at(30));
        let (swept, next) = sweep_before(&mut lanes, at(10));
        // Key 1 (20 ms) may hide a caller up to 15 ms older behind it:
        // looked at, kept; key 2 (5 ms) swept; key 3 (30 ms, so 15 ms at
        // the earliest) is where it stops.
        assert_eq!(swept, [1, 1]);
        assert_eq!(next, Some(at(15)), "a bound, allowing for the skew");
        assert_eq!(lanes.pending_keys(), 3, "0 pending, 1 and 3 behind");
        let i = lanes.lane_of("a");
        let _ = lanes.take(i, usize::MAX);
        let _ = lanes.take(i, usize::MAX);
        let _ = lanes.take(i, usize::MAX);
        assert_eq!(
            lanes.get(i).skew,
            Duration::ZERO,
            "forgotten once none wait"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_joining_a_key_behind_the_batch_is_swept_by_when_it_asked() {
        let t = Instant::now();
        let mut lanes = Lanes::new(1);
        let at = |ms: u64| t + Duration::from_millis(ms);
        add(&mut lanes, "a", 0, at(0)); // the pending batch
        add(&mut lanes, "a", 3, at(20));
        // A cache miss for key 3 stamped before its lookups, at 5 ms,
        // joins it after the caller of 20 ms.
        add(&mut lanes, "a", 3, at(5));
        assert_eq!(
            sweep_before(&mut lanes, at(4)),
            (vec![], Some(at(5))),
            "no caller behind the batch asked before 5 ms, not 20"
        );
        assert_eq!(sweep_before(&mut lanes, at(10)), (vec![2], None));
    }

    #[tokio::test(start_paused = true)]
    async fn keys_asked_for_in_falling_order_are_each_allowed_for() {
        let t = Instant::now();
        let mut lanes = Lanes::new(1);
        let at = |ms: u64| t + Duration::from_millis(ms);
        add(&mut lanes, "a", 0, at(0)); // the pending batch
        add(&mut lanes, "a", 1, at(30));
        add(&mut lanes, "a", 2, at(20));
        add(&mut lanes, "a", 3, at(10));
        // Each step is 10 ms, but key 3 asked 20 ms before key 1.
        assert_eq!(sweep_before(&mut lanes, at(5)), (vec![], Some(at(10))));
        assert_eq!(sweep_before(&mut lanes, at(15)), (vec![1, 1, 1], None));
        assert_eq!(lanes.pending_keys(), 3, "0 pending, 1 and 2 behind");
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_behind_the_batch_is_waited_for() {
        let t = Instant::now();
        let mut lanes = Lanes::new(1);
        add(&mut lanes, "a", 0, t);
        add(&mut lanes, "a", 1, t);
        let i = lanes.lane_of("a");
        let lane = lanes.get(i);
        // A cache must not answer key 1 from its store: a load of it is
        // coming, and its callers get that load's answer.
        assert!(lane.waits_for(&0) && lane.waits_for(&1));
        assert!(!lane.waits_for(&2));
    }
}
