//! The batching ledger: every decision of the engine, and no I/O.
//!
//! The ledger owns the lanes (each scope's pending keys, and the keys
//! waiting behind a full batch), the running loads and who waits for each
//! of their keys, the deadlines, the count of waiters held, and the
//! automatic concurrency limit. It has no tokio, no channels and no tasks,
//! and never reads a clock: time is passed in. The worker (its async
//! shell) turns what happens into calls, and carries out what they return:
//!
//! | event | call | what it returns |
//! | --- | --- | --- |
//! | a request arrives | [`request`](Ledger::request), [`queue`](Ledger::queue) | where it went ([`Placed`]) |
//! | a slot may be free | [`due`](Ledger::due), then [`start`](Ledger::start) | a load to start: its groups and keys ([`Took`]) |
//! | a load ended | [`finished`](Ledger::finished) | its waiters, group by group, to answer ([`Finished`]) |
//! | a timer fired | [`expire`](Ledger::expire) | the waiters whose deadline passed |
//! | any of them | [`flush_at`](Ledger::flush_at), [`expiry_at`](Ledger::expiry_at) | when to wake next |
//!
//! A caller that goes away (its future dropped) is not an event: the
//! ledger asks each waiter [`is_gone`](Request::is_gone) before loading
//! for it, and drops it then.
//!
//! # Invariants
//!
//! Checked after every step by the seeded simulation (`sim`):
//!
//! - every request is answered exactly once: by a load of its key, by
//!   [`expire`](Ledger::expire) once its deadline passed, or refused;
//! - a load's group holds keys of one scope only, and each key's waiters
//!   are answered from that group's result only;
//! - within a scope, a key is in one running load at a time, unless
//!   plain requests do not join running loads (the default), where a key
//!   asked for again while its load runs is loaded again;
//! - at most [`held_limit`](policy::held_limit) waiters are held;
//! - a scope with pending keys gets a load before any scope gets a second
//!   one;
//! - whenever keys wait and no load will start by itself, a timer is due:
//!   [`flush_at`](Ledger::flush_at) is never later than the moment a
//!   pending batch becomes due.
//!
//! Whether a request may join a running load is one predicate the ledger
//! is given, [`JoinRule`]: it orders the requests' tags (a cache's
//! invalidation stamps), and knows nothing of what they mean.

mod expiry;
mod lanes;
mod loads;
#[cfg(test)]
mod sim;
#[cfg(test)]
pub(crate) mod tests;

use std::collections::HashMap;
use std::hash::Hash;

use tokio::time::Instant;

use self::lanes::{Added, Lanes};
use self::loads::Running;
use super::config::Config;
use super::limit::{AutoLimit, LoadTimes};
use super::policy::{self, Pending};
use crate::error::Waited;

/// What the ledger needs to know of a waiting caller.
pub(crate) trait Request {
    /// What orders requests for the [`JoinRule`] (a cache's stamp).
    type Tag: Copy + Ord;
    /// When the caller asked: its deadline and the flush delay count from
    /// here.
    fn asked_at(&self) -> Instant;
    /// The request's tag, if it has one.
    fn tag(&self) -> Option<Self::Tag>;
    /// Whether the caller went away: nothing is loaded for it alone.
    fn is_gone(&self) -> bool;
}

/// Who waits for one key: almost always one caller, kept inline.
pub(crate) type Waiters<W> = smallvec::SmallVec<[W; 1]>;

/// Whether a request tagged as the first argument may join a running load
/// of its key whose latest tag is the second (`None`: untagged).
pub(crate) type JoinRule<T> = Box<dyn Fn(Option<T>, Option<T>) -> bool + Send + Sync>;

/// A running load, as the ledger names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct LoadId(u64);

/// Where [`Ledger::request`] or [`Ledger::queue`] put a request.
#[derive(Debug)]
pub(crate) enum Placed<S, K, W> {
    /// Joined a running load of its key.
    Running,
    /// Joined the waiters of a key already waiting for a load; `tagged`
    /// if one of them carries a tag.
    Joined { tagged: bool },
    /// A key of its own, waiting for a load.
    New,
    /// The caller had gone before it was seen: nothing kept.
    Gone,
    /// The ledger holds all the waiters it may: answer it "overloaded".
    Refused(W),
    /// A tagged request with no load of its key to wait for or join,
    /// handed back: answer it from elsewhere, or [`queue`](Ledger::queue)
    /// it.
    Unheld(S, K, W),
}

/// One scope's part of a load.
#[derive(Debug)]
pub(crate) struct Group<S, K, T> {
    pub(crate) scope: S,
    pub(crate) keys: Vec<K>,
    /// Each tagged key with the latest tag of its requests (none where no
    /// request was tagged).
    pub(crate) tagged: Vec<(K, T)>,
}

/// What [`Ledger::start`] took.
#[derive(Debug)]
pub(crate) enum Took<S, K, T> {
    /// A load to start, one group per scope.
    Load {
        id: LoadId,
        groups: Vec<Group<S, K, T>>,
        /// Callers that had gone, dropped.
        abandoned: usize,
    },
    /// Every caller had gone: nothing to load.
    Nothing { abandoned: usize },
}

/// A finished load's waiters, group by group in the order of its
/// [`Took::Load`], and what the automatic limit made of it.
#[derive(Debug)]
pub(crate) struct Finished<K, W> {
    pub(crate) groups: Vec<HashMap<K, Waiters<W>>>,
    /// The automatic limit's new value, if it changed.
    pub(crate) limit: Option<usize>,
    /// The automatic limit's least and latest mean load time.
    pub(crate) load_times: Option<LoadTimes>,
}

/// Waiters whose deadline passed, and where each waited.
pub(crate) type Expired<W> = Vec<(W, Waited)>;

/// The batching ledger (see the module docs).
pub(crate) struct Ledger<S, K, W: Request> {
    config: Config,
    /// How many scopes one load may serve.
    groups_per_load: usize,
    join: JoinRule<W::Tag>,
    lanes: Lanes<S, K, W>,
    running: Running<K, W>,
    next_id: u64,
    /// With [`policy::worker_enforces_deadlines`]: no deadline of a pending
    /// waiter, in any lane, is earlier. A bound, not always the minimum, so
    /// that keeping it costs one comparison per request;
    /// [`expire`](Self::expire) tightens it.
    pending_expiry: Option<Instant>,
    /// Waiters held in the lanes and running loads, bounded by
    /// [`policy::held_limit`].
    held: usize,
    /// Shutting down: every pending batch is due.
    draining: bool,
    /// A tagged request was seen: running loads are indexed by key from
    /// then on, so tagged requests can join them. Plain requests need the
    /// index only where they join running loads themselves.
    tracks: bool,
    auto_limit: Option<AutoLimit>,
}

impl<S, K, W> Ledger<S, K, W>
where
    S: Clone + Eq + Hash,
    K: Clone + Eq + Hash,
    W: Request,
{
    /// A ledger for `config`, whose loads may serve `groups_per_load`
    /// scopes each, and whose requests join running loads as `join` says.
    pub(crate) fn new(
        config: Config,
        groups_per_load: usize,
        join: JoinRule<W::Tag>,
        now: Instant,
    ) -> Self {
        let auto_limit = config.concurrency.is_auto().then(|| {
            AutoLimit::new(
                policy::min_auto_limit(&config),
                config.concurrency.max(),
                // Loads past the spread size are full: they grew because
                // keys waited for a slot.
                config.spread_batch_size.min(config.max_batch_size),
                now,
            )
        });
        Self {
            groups_per_load: groups_per_load.max(1),
            join,
            lanes: Lanes::new(config.max_batch_size),
            running: Running::default(),
            next_id: 0,
            pending_expiry: None,
            held: 0,
            draining: false,
            tracks: config.join_in_flight,
            auto_limit,
            config,
        }
    }

    /// Distinct keys waiting for a load, every scope together.
    pub(crate) fn pending_keys(&self) -> usize {
        self.lanes.pending_keys()
    }

    /// Scopes with waiting keys or running loads.
    pub(crate) fn scopes(&self) -> usize {
        self.lanes.len()
    }

    /// Loads running.
    #[cfg(test)]
    pub(crate) fn loads(&self) -> usize {
        self.running.len()
    }

    /// Waiters held.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// Nothing waits and nothing runs.
    pub(crate) fn is_idle(&self) -> bool {
        self.pending_keys() == 0 && self.running.len() == 0
    }

    /// From now on every pending batch is due at once (shutting down).
    pub(crate) fn drain(&mut self) {
        self.draining = true;
    }

    /// How many requests to take in the next receive: up to a batch; none
    /// while the pending keys fill a batch or the ledger holds all it may,
    /// which leaves requests in the bounded queue to push back on callers,
    /// unless the worker [enforces deadlines](policy::worker_enforces_deadlines)
    /// and so must see every request.
    pub(crate) fn receive_limit(&self) -> usize {
        let c = &self.config;
        let pending = self.pending_keys();
        if policy::worker_enforces_deadlines(c) {
            c.max_batch_size
        } else if policy::may_accept(c, pending, self.held) {
            (c.max_batch_size - pending).min(policy::held_limit(c) - self.held)
        } else {
            0
        }
    }

    /// A caller asks for `key` as `scope`: it joins a running load of the
    /// key if the [`JoinRule`] lets it, else waits for a load. A tagged
    /// request that finds no load of its key to join or wait for comes
    /// back [`Placed::Unheld`].
    pub(crate) fn request(&mut self, scope: S, key: K, waiter: W) -> Placed<S, K, W> {
        self.place(scope, key, waiter, true)
    }

    /// As [`request`](Self::request), but a request is never handed back.
    pub(crate) fn queue(&mut self, scope: S, key: K, waiter: W) -> Placed<S, K, W> {
        self.place(scope, key, waiter, false)
    }

    fn place(&mut self, scope: S, key: K, waiter: W, hand_back: bool) -> Placed<S, K, W> {
        if waiter.is_gone() {
            return Placed::Gone;
        }
        let config = &self.config;
        if policy::worker_enforces_deadlines(config) && self.held >= policy::held_limit(config) {
            // Receiving anyway keeps every caller's deadline in sight.
            return Placed::Refused(waiter);
        }
        let deadline = self.deadline_of(&waiter);
        let tag = waiter.tag();
        self.tracks |= tag.is_some();
        let i = self.lanes.lane_of(scope);
        let lane = self.lanes.get_mut(i);
        if let Some(&(id, load_tag)) = lane.in_flight.get(&key) {
            if (self.join)(tag, load_tag) {
                if let Some(waiters) = self.running.join(id, i, &key, deadline) {
                    waiters.push(waiter);
                    self.held += 1;
                    return Placed::Running;
                }
            }
        }
        if hand_back && tag.is_some() && !lane.waits_for(&key) {
            let scope = lane.scope.clone();
            self.lanes.release_if_idle(i);
            return Placed::Unheld(scope, key, waiter);
        }
        self.held += 1;
        self.pending_expiry = earliest(self.pending_expiry, deadline);
        match self.lanes.add(i, key, waiter) {
            Added::Joined { tagged } => Placed::Joined { tagged },
            Added::New => Placed::New,
        }
    }

    /// Whether a load should start now, with `running` loads (the
    /// worker's and callers' direct ones) of the `limit` that may run.
    /// Taking a free slot is still the caller's job.
    pub(crate) fn due(&mut self, now: Instant, running: usize, limit: usize) -> bool {
        let Some(i) = self.lanes.next() else {
            return false;
        };
        let config = &self.config;
        let lane = self.lanes.get(i);
        let pending = Pending {
            // Loads that serve several scopes fill from all of them.
            keys: if self.groups_per_load > 1 {
                self.lanes.pending_keys()
            } else {
                lane.pending.len()
            },
            // Measured from the request, not from its receipt, so time
            // spent in the queue counts toward the delay.
            deadline_passed: policy::arms_timer(config)
                && lane.first_at.is_some_and(|at| at + config.max_delay <= now),
            draining: self.draining,
        };
        if let Some(auto) = &mut self.auto_limit {
            if policy::held_by_limit(config, pending, running, limit) {
                auto.held_back();
            }
        }
        policy::is_due(config, pending, running, limit)
    }

    /// When the next pending batch's delay ends, if the flush policy
    /// waits at all. A delay already passed by `now` is not returned:
    /// [`due`](Self::due) saw it pass at the same `now`, so its batch went
    /// out, or waits for a slot, which a load's end frees.
    pub(crate) fn flush_at(&mut self, now: Instant) -> Option<Instant> {
        if !policy::arms_timer(&self.config) {
            return None;
        }
        let max_delay = self.config.max_delay;
        self.lanes
            .next()
            .and_then(|i| self.lanes.get(i).first_at)
            .map(|at| at + max_delay)
            .filter(|at| *at > now)
    }
}

/// What a caller sees of the batcher as it asks, for
/// [`loads_directly`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Idle {
    /// The worker runs, and has not begun to shut down.
    pub(crate) serving: bool,
    /// Keys waiting at the worker, and requests queued for it.
    pub(crate) waiting: usize,
}

/// Whether a caller runs its one-key load itself, in its own task: only
/// where the settings allow it, and when it finds the batcher idle (no
/// load `running`, and `idle` says nothing waits), so a direct load never
/// passes requests already queued. `idle` is read only when no load runs:
/// under load a slot is nearly always taken, and the queue's lock is not
/// reached. The caller still has to take the first slot.
pub(crate) fn loads_directly(config: &Config, running: usize, idle: impl FnOnce() -> Idle) -> bool {
    if !policy::allows_direct_loads(config) || running != 0 {
        return false;
    }
    let idle = idle();
    idle.serving && idle.waiting == 0
}

/// The earlier of two optional instants, `None` meaning none at all.
pub(crate) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
