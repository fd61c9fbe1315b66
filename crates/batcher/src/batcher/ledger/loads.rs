//! The ledger's loads: what starting one takes from the lanes, who waits
//! for each of its keys while it runs, and what its end hands back.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

use super::{earliest, policy, Finished, Group, Ledger, LoadId, Request, Took, Waiters};

/// Keys past which a load takes no other scope's batch. Each scope of a
/// load costs the loader a transaction of its own (for Postgres, about what
/// a round trip costs), so filling pays where scopes have a key or two
/// waiting each, and not where one scope's batch already spreads that cost
/// over several keys: taking other scopes then only leaves every scope
/// fewer keys to gather for its next load. (The `scopes` benchmark, 300
/// callers, loads of up to 4 scopes: filled whatever their size, they read
/// 0.85x loads of one scope at 10 tenants; filled below 8 keys, 0.95x
/// at 100 tenants; below 16, about 1.2x at 100 and 1.6x at 1,000, with
/// loads at 10 tenants holding one scope's batch as before.)
pub(crate) const FILLED: usize = 16;

impl<S, K, W> Ledger<S, K, W>
where
    S: Clone + Eq + Hash,
    K: Clone + Eq + Hash,
    W: Request,
{
    /// Every caller load `id` serves.
    pub(crate) fn waiters(&self, id: LoadId) -> impl Iterator<Item = &W> {
        self.running.waiters(id)
    }

    /// Takes the next load, with `running` loads of the `limit` that may
    /// run, of at most [`policy::load_cap`] keys: the batch of the scope
    /// whose turn it is (or as many of its keys), and, where a load may
    /// serve several scopes, the batches of the scopes after it while they
    /// fit and the load holds fewer than [`FILLED`] keys.
    /// [`waiters`](Self::waiters) then lists whom the load serves.
    pub(crate) fn start(
        &mut self,
        now: Instant,
        running: usize,
        limit: usize,
    ) -> Took<S, K, W::Tag> {
        let cap = policy::load_cap(&self.config, running, limit, self.pending_keys());
        let expiry = self.pending_expiry;
        let (mut taken, mut seen, mut keys, mut abandoned) = (Vec::new(), Vec::new(), 0, 0);
        while let Some(i) = self.lanes.next() {
            let room = cap - keys;
            let fits = self.lanes.get(i).pending.len() <= room;
            if seen.contains(&i) || (!seen.is_empty() && !fits) {
                break;
            }
            seen.push(i);
            // Callers that went away are not loaded for, unless someone
            // else waits for the same key; a batch of them only does not
            // end the scope's turn, so the callers behind it are not passed
            // over for it.
            let mut batch = HashMap::new();
            while batch.is_empty() && !self.lanes.get(i).pending.is_empty() {
                batch = self.lanes.take(i, room);
                batch.retain(|_, waiters| {
                    let before = waiters.len();
                    waiters.retain(|w| !w.is_gone());
                    abandoned += before - waiters.len();
                    !waiters.is_empty()
                });
            }
            if batch.is_empty() {
                self.lanes.release_if_idle(i);
            } else {
                keys += batch.len();
                taken.push((i, batch));
            }
            // One scope per load: a batch whose callers all went leaves
            // the slot unused, and the next scope waits for its own turn
            // to be due.
            let full = taken.len() >= self.groups_per_load || keys >= cap;
            if full || self.groups_per_load == 1 || keys >= FILLED {
                break;
            }
        }
        self.held -= abandoned;
        if self.pending_keys() == 0 {
            self.pending_expiry = None;
        }
        if taken.is_empty() {
            return Took::Nothing { abandoned };
        }
        let id = LoadId(self.next_id);
        self.next_id += 1;
        let mut groups = Vec::with_capacity(taken.len());
        for (i, batch) in &taken {
            let lane = self.lanes.get_mut(*i);
            lane.loads += 1;
            let mut tagged = Vec::new();
            for (key, waiters) in batch {
                let tag = waiters.iter().filter_map(Request::tag).max();
                if let Some(tag) = tag {
                    tagged.push((key.clone(), tag));
                }
                if self.tracks {
                    lane.in_flight
                        .entry(key.clone())
                        // A plain load beside a tagged request's running
                        // load (the cache bypassed meanwhile) leaves the
                        // tagged one joinable: `None` orders first.
                        .and_modify(|e| {
                            if e.1 <= tag {
                                *e = (id, tag);
                            }
                        })
                        .or_insert((id, tag));
                }
            }
            groups.push(Group {
                scope: lane.scope.clone(),
                keys: batch.keys().cloned().collect(),
                tagged,
            });
        }
        self.running.insert(id, Load::new(taken, expiry, now));
        Took::Load {
            id,
            groups,
            abandoned,
        }
    }

    /// Load `id` ended at `now`; `ok` unless it failed as a whole (its
    /// loader panicked or timed out). Returns its waiters to answer.
    pub(crate) fn finished(
        &mut self,
        id: LoadId,
        now: Instant,
        ok: bool,
    ) -> Option<Finished<K, W>> {
        let load = self.running.remove(id)?;
        let (started, groups) = load.into_parts();
        let (mut served, mut keys, mut response) = (0, 0, Duration::ZERO);
        let mut lanes = Vec::with_capacity(groups.len());
        let mut answer = Vec::with_capacity(groups.len());
        for (i, waiters) in groups {
            let lane = self.lanes.get_mut(i);
            lane.loads -= 1;
            if !lane.in_flight.is_empty() {
                for key in waiters.keys() {
                    if lane.in_flight.get(key).is_some_and(|(l, _)| *l == id) {
                        lane.in_flight.remove(key);
                    }
                }
            }
            keys += waiters.len();
            for w in waiters.values().flatten() {
                served += 1;
                response += now.saturating_duration_since(w.asked_at());
            }
            lanes.push(i);
            answer.push(waiters);
        }
        self.held -= served;
        for i in lanes {
            self.lanes.release_if_idle(i);
        }
        let (mut limit, mut load_times) = (None, None);
        if let (true, Some(auto)) = (ok, &mut self.auto_limit) {
            let ran = now.saturating_duration_since(started);
            limit = auto.completed(served, keys, response, ran, now);
            load_times = Some(auto.load_times());
        }
        Some(Finished {
            groups: answer,
            limit,
            load_times,
        })
    }
}

/// Each group of a load: its lane, and who waits for each of its keys.
pub(super) type Groups<K, W> = Vec<(usize, HashMap<K, Waiters<W>>)>;

/// One running load.
pub(super) struct Load<K, W> {
    /// Each group's lane, and the waiters of each of its keys.
    groups: Groups<K, W>,
    /// No waiter's deadline is earlier (a bound: see [`Running::sweep`]).
    expiry: Option<Instant>,
    started: Instant,
}

impl<K, W> Load<K, W> {
    pub(super) fn new(groups: Groups<K, W>, expiry: Option<Instant>, started: Instant) -> Self {
        Self {
            groups,
            expiry,
            started,
        }
    }

    /// When it started, and its groups.
    pub(super) fn into_parts(self) -> (Instant, Groups<K, W>) {
        (self.started, self.groups)
    }
}

/// Every running load, by id.
pub(super) struct Running<K, W> {
    loads: HashMap<LoadId, Load<K, W>>,
}

impl<K, W> Default for Running<K, W> {
    fn default() -> Self {
        Self {
            loads: HashMap::new(),
        }
    }
}

impl<K: Eq + Hash, W> Running<K, W> {
    pub(super) fn len(&self) -> usize {
        self.loads.len()
    }

    pub(super) fn insert(&mut self, id: LoadId, load: Load<K, W>) {
        self.loads.insert(id, load);
    }

    pub(super) fn remove(&mut self, id: LoadId) -> Option<Load<K, W>> {
        self.loads.remove(&id)
    }

    /// The waiters of `key` in lane `lane`'s group of load `id`, for a
    /// caller joining them whose deadline is `deadline`.
    pub(super) fn join(
        &mut self,
        id: LoadId,
        lane: usize,
        key: &K,
        deadline: Option<Instant>,
    ) -> Option<&mut Waiters<W>> {
        let load = self.loads.get_mut(&id)?;
        let (_, group) = load.groups.iter_mut().find(|(l, _)| *l == lane)?;
        let waiters = group.get_mut(key)?;
        load.expiry = earliest(load.expiry, deadline);
        Some(waiters)
    }

    /// Every waiter of load `id`.
    pub(super) fn waiters(&self, id: LoadId) -> impl Iterator<Item = &W> {
        let groups = self.loads.get(&id).map(|l| &l.groups);
        groups
            .into_iter()
            .flatten()
            .flat_map(|(_, group)| group.values().flatten())
    }

    /// No deadline of a waiter in a running load is earlier.
    pub(super) fn expiry(&self) -> Option<Instant> {
        self.loads
            .values()
            .fold(None, |acc, l| earliest(acc, l.expiry))
    }

    /// Runs `sweep` over the waiters of every key of every load whose
    /// expiry has passed by `now`, with how long the load has run; `sweep`
    /// takes out the waiters it expires and lowers the bound it is given
    /// to the earliest deadline left. Keys whose waiters all left stay, so
    /// the load's answer still finds them.
    pub(super) fn sweep(
        &mut self,
        now: Instant,
        mut sweep: impl FnMut(&mut Waiters<W>, &mut Option<Instant>, Duration),
    ) {
        for load in self.loads.values_mut() {
            if load.expiry.is_some_and(|e| e <= now) {
                let mut left = None;
                let ran = now.saturating_duration_since(load.started);
                for (_, group) in &mut load.groups {
                    for waiters in group.values_mut() {
                        sweep(waiters, &mut left, ran);
                    }
                }
                load.expiry = left;
            }
        }
    }
}
