//! The worker's keys by scope: each scope's pending batch and the keys of
//! its running loads (its lane), and whose turn it is to load next.
//!
//! A load serves one scope, so keys of different scopes never share one.
//! Lanes with waiting keys take turns in the order they started waiting:
//! the lane at the front gets the next free slot, and goes to the back if
//! keys are still waiting after its load took a batch. So one busy scope
//! cannot starve the others: every scope with waiting keys gets a load
//! before any scope gets a second one. Unscoped, there is one lane.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::mem;

use tokio::task;
use tokio::time::Instant;

use super::message::Waiters;
use super::observer::Stamp;

/// One scope's keys.
pub(crate) struct Lane<S, K, V> {
    pub(crate) scope: S,
    /// Keys of the scope's next batch, and who waits for each.
    pub(crate) pending: HashMap<K, Waiters<V>>,
    /// When the pending batch's first key was asked for: the flush delay
    /// counts from here.
    pub(crate) first_at: Option<Instant>,
    /// Which running load of this scope has each key, and the latest stamp
    /// of its stamped requests; kept only where running loads are joined.
    pub(crate) in_flight: HashMap<K, (task::Id, Option<Stamp>)>,
    /// Loads of this scope running.
    pub(crate) loads: usize,
    /// Whether the lane is in [`Lanes::turns`].
    queued: bool,
}

/// Every scope's lane, by index (stable while the lane lives).
pub(crate) struct Lanes<S, K, V> {
    slots: Vec<Option<Lane<S, K, V>>>,
    index: HashMap<S, usize>,
    free: Vec<usize>,
    /// Lanes with pending keys, front first.
    turns: VecDeque<usize>,
    /// Pending keys of every lane.
    pending_keys: usize,
    /// The lane found last: most requests come from the scope of the one
    /// before (all of them unscoped), so it is tried before the index.
    recent: usize,
    /// What a new lane's pending batch makes room for.
    batch_size: usize,
}

impl<S, K, V> Lanes<S, K, V>
where
    S: Clone + Eq + Hash,
    K: Clone + Eq + Hash,
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
                    pending: HashMap::with_capacity(self.batch_size),
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

    pub(crate) fn get(&self, i: usize) -> &Lane<S, K, V> {
        self.slots[i].as_ref().expect("a live lane")
    }

    pub(crate) fn get_mut(&mut self, i: usize) -> &mut Lane<S, K, V> {
        self.slots[i].as_mut().expect("a live lane")
    }

    /// Lane `i`'s pending batch has one key more, first asked for `at`.
    pub(crate) fn added(&mut self, i: usize, at: Instant) {
        self.pending_keys += 1;
        let lane = self.slots[i].as_mut().expect("a live lane");
        lane.first_at.get_or_insert(at);
        if !lane.queued {
            lane.queued = true;
            self.turns.push_back(i);
        }
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

    /// Takes lane `i`'s pending batch, at most `capacity` keys (the ones
    /// asked for first, if more wait), and passes its turn on: to the back
    /// if keys still wait.
    pub(crate) fn take(&mut self, i: usize, capacity: usize) -> HashMap<K, Waiters<V>> {
        let lane = self.slots[i].as_mut().expect("a live lane");
        let batch = if lane.pending.len() <= capacity {
            lane.first_at = None;
            let room = lane.pending.len();
            mem::replace(&mut lane.pending, HashMap::with_capacity(room))
        } else {
            // Only while deadlines are enforced and every slot was busy.
            // The oldest keys go first, as they would have from the
            // channel, so a key is not passed over until it times out.
            let mut by_age: Vec<(Instant, K)> = lane
                .pending
                .iter()
                .filter_map(|(k, ws)| ws.first().map(|w| (w.enqueued_at, k.clone())))
                .collect();
            by_age.select_nth_unstable_by_key(capacity - 1, |(at, _)| *at);
            by_age.truncate(capacity);
            let batch: HashMap<K, Waiters<V>> = by_age
                .into_iter()
                .filter_map(|(_, k)| lane.pending.remove_entry(&k))
                .collect();
            lane.first_at = lane
                .pending
                .values()
                .filter_map(|ws| ws.first().map(|w| w.enqueued_at))
                .min();
            batch
        };
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

    /// Runs `f` over every lane with pending keys (to expire some), then
    /// counts what is left.
    pub(crate) fn sweep_pending(&mut self, mut f: impl FnMut(&mut Lane<S, K, V>)) {
        let mut keys = 0;
        for &i in &self.turns {
            let lane = self.slots[i].as_mut().expect("a live lane");
            f(lane);
            if lane.pending.is_empty() {
                lane.first_at = None;
            }
            keys += lane.pending.len();
        }
        self.pending_keys = keys;
    }

    /// Frees lane `i` if nothing of its scope waits or runs.
    pub(crate) fn release_if_idle(&mut self, i: usize) {
        // Released already (by `next`, while a completion flushed).
        let Some(lane) = self.slots[i].as_ref() else {
            return;
        };
        if lane.queued || lane.loads > 0 || !lane.pending.is_empty() || !lane.in_flight.is_empty() {
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
    use crate::batcher::message::Waiter;

    fn waiter(at: Instant) -> Waiter<u32> {
        let (tx, _rx) = tokio::sync::oneshot::channel();
        Waiter {
            tx,
            enqueued_at: at,
            span: tracing::Span::none(),
            stamp: None,
        }
    }

    fn add(lanes: &mut Lanes<&'static str, u32, u32>, scope: &'static str, key: u32, at: Instant) {
        let i = lanes.lane_of(scope);
        lanes
            .get_mut(i)
            .pending
            .insert(key, smallvec::smallvec![waiter(at)]);
        lanes.added(i, at);
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
            let batch = lanes.take(i, 4);
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
        let _ = lanes.take(a, 4);
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
}
