//! The worker task: receives requests, forms batches, runs loads, answers.
//!
//! All batching state is owned by this one task, so none of it needs a lock.
//! Loads run in their own tasks (a [`JoinSet`]): a caller that goes away, or a
//! loader that panics, cannot take a batch's other waiters down with it, and
//! the worker keeps receiving while loads run.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::mem;
use std::panic::AssertUnwindSafe;
use std::pin::{pin, Pin};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use tokio::task::{self, JoinError, JoinSet};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::DropGuard;
use tracing::Instrument;

use super::config::Config;
use super::fill::{FillSlot, Stamp};
use super::limit::AutoLimit;
use super::message::{Message, Reply, Waiter, Waiters};
use super::policy::{self, Pending};
use super::queue::Receiver;
use super::run::{self, LoadFn, Outcome};
use super::shared::{LoadSlot, Shared};
use crate::stats::Stats;
use crate::Error;

/// The task that serves a [`Batcher`](super::Batcher).
///
/// [`Batcher::new`](super::Batcher::new) and
/// [`BatcherBuilder::build`](super::BatcherBuilder::build) spawn it for you;
/// [`Batcher::pair`](super::Batcher::pair) and
/// [`BatcherBuilder::build_pair`](super::BatcherBuilder::build_pair) hand it
/// over so you can run it yourself.
///
/// Dropping a `Worker` without running it (or aborting its task) answers
/// every waiting caller with [`Error::Closed`]: no caller ever hangs.
#[must_use = "the batcher answers nothing until the worker runs"]
pub struct Worker<K, V> {
    rx: Receiver<Message<K, V>>,
    load: LoadFn<K, V>,
    shared: Arc<Shared>,
    fill: FillSlot<K, V>,
    done: DropGuard,
}

impl<K, V> fmt::Debug for Worker<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("name", &self.shared.config.name)
            .finish_non_exhaustive()
    }
}

impl<K, V> Worker<K, V>
where
    K: Clone + Eq + Hash + Send + 'static,
    V: Clone + Send + 'static,
{
    pub(crate) fn new(
        rx: Receiver<Message<K, V>>,
        load: LoadFn<K, V>,
        shared: Arc<Shared>,
        fill: FillSlot<K, V>,
    ) -> Self {
        let done = shared.done.clone().drop_guard();
        Self {
            rx,
            load,
            shared,
            fill,
            done,
        }
    }

    /// Runs the worker until shutdown, or until every [`Batcher`](super::Batcher)
    /// handle is dropped, and every queued request has been answered.
    pub async fn run(self) {
        self.shared.mark_worker_running();
        let mut state = State::new(self);
        let mut shutdown = pin!(state.shared.shutdown.clone().cancelled_owned());
        loop {
            let limit = state.receive_limit();
            let can_recv = !state.rx_done && limit > 0;
            let event = tokio::select! {
                // Completions first: they free load slots and memory.
                biased;
                Some(done) = state.in_flight.join_next_with_id(), if !state.in_flight.is_empty() => {
                    Event::Completed(done)
                }
                () = &mut shutdown, if !state.draining => Event::Shutdown,
                () = &mut state.timer, if state.timer_armed => Event::Deadline,
                () = &mut state.expiry_timer, if state.expiry_armed.is_some() => Event::Expiry,
                // One call takes a whole burst, in one swap of buffers.
                n = state.rx.take(&mut state.inbox, limit), if can_recv => Event::Received(n),
                // Unreachable while the invariants hold (a full batch is
                // always dispatched when no load runs); if it ever happens,
                // stopping drops every sender, which answers `Closed`.
                else => break,
            };
            match event {
                Event::Completed(done) => state.complete(done),
                Event::Shutdown => {
                    state.draining = true;
                    // New sends fail with `Closed`; already queued messages
                    // can still be received and will be answered.
                    state.rx.close();
                }
                Event::Deadline => {
                    state.timer_armed = false;
                    state.deadline_passed = true;
                }
                Event::Expiry => state.expire(),
                Event::Received(n) if n > 0 => state.accept_inbox(),
                Event::Received(_) => {
                    state.rx_done = true;
                    state.draining = true;
                }
            }
            state.flush_if_due();
            state.arm_expiry();
            state.publish_gauges();
            if state.rx_done && state.pending.is_empty() && state.in_flight.is_empty() {
                break;
            }
        }
        tracing::debug!(batcher = %state.config().name, "batcher worker stopped");
    }
}

enum Event<K, V> {
    Completed(Result<(task::Id, Outcome<K, V>), JoinError>),
    Shutdown,
    Deadline,
    Expiry,
    /// How many messages `take` put in the inbox; none means the queue is
    /// closed, or every handle gone, and empty.
    Received(usize),
}

/// A batch whose load is running.
struct Running<K, V> {
    waiters: HashMap<K, Waiters<V>>,
    /// No waiter's deadline is earlier (see [`State::pending_expiry`]).
    expiry: Option<Instant>,
    started: Instant,
    span: tracing::Span,
    /// Whether the load fills a cache (it has cache misses).
    fills: bool,
    /// Freed as the load completes, before its waiters are answered (see
    /// [`State::complete`]).
    slot: LoadSlot,
}

struct State<K, V> {
    rx: Receiver<Message<K, V>>,
    load: LoadFn<K, V>,
    shared: Arc<Shared>,
    /// Messages just received, before [`State::accept_inbox`].
    inbox: VecDeque<Message<K, V>>,
    /// Keys of the next batch and who waits for each.
    pending: HashMap<K, Waiters<V>>,
    /// With [`policy::worker_enforces_deadlines`]: no deadline of a pending
    /// waiter is earlier. A bound, not always the minimum, so that keeping
    /// it costs one comparison per request; [`State::expire`] makes it exact.
    pending_expiry: Option<Instant>,
    /// Fires at `expiry_armed`, the earliest waiter deadline it knows of.
    expiry_timer: Pin<Box<Sleep>>,
    expiry_armed: Option<Instant>,
    in_flight: JoinSet<Outcome<K, V>>,
    running: HashMap<task::Id, Running<K, V>>,
    /// Which running load has each key, and the latest stamp of its
    /// cache misses; kept only with `join_in_flight` or a cache's fill
    /// (see [`State::tracks_in_flight`]).
    in_flight_keys: HashMap<K, (task::Id, Option<Stamp>)>,
    /// The cache built over this batcher, if any.
    fill: FillSlot<K, V>,
    /// When the last load that filled the cache was answered: a cache
    /// miss enqueued before then may find its key stored by that load.
    last_fill: Option<Instant>,
    /// The cache's hashes of keys recent loads filled, each in the set its
    /// low bits name, in the order first filled (a fifth to the same set
    /// pushes out the oldest): a miss whose hash is not here is loaded without
    /// looking at the cache again, so misses of keys nobody just loaded
    /// (uniform keys over a large table) cost one read of 32 bytes, not a
    /// cache lookup. Four ways, not one: with one, a burst's later fills
    /// overwrote about one in thirty of its earlier keys (300 keys in
    /// 4,096 slots), and a miss of such a key loaded it again. Empty until
    /// a load fills.
    recent_fills: Vec<[u64; RECENT_FILL_WAYS]>,
    /// With `FixedDelay` and `Adaptive`: fires `max_delay` after the pending batch's first
    /// key. Only polled while armed, so an idle worker never wakes up.
    timer: Pin<Box<Sleep>>,
    timer_armed: bool,
    deadline_passed: bool,
    /// Shutting down: flush everything pending without waiting.
    draining: bool,
    /// The queue is closed, or every handle gone, and empty.
    rx_done: bool,
    /// Waiters held in `pending` and `running`, bounded by
    /// [`policy::held_limit`].
    held: usize,
    /// With [`Concurrency::Auto`](crate::Concurrency::Auto): the search for
    /// the limit, fed with every load's outcome; it publishes the limit in
    /// [`Shared`].
    auto_limit: Option<AutoLimit>,
    _done: DropGuard,
}

impl<K, V> State<K, V>
where
    K: Clone + Eq + Hash + Send + 'static,
    V: Clone + Send + 'static,
{
    fn new(worker: Worker<K, V>) -> Self {
        let c = &worker.shared.config;
        let auto_limit = c.concurrency.is_auto().then(|| {
            AutoLimit::new(policy::min_auto_limit(c), c.max_loads(), Instant::now())
                .with_batch_cap(c.max_batch_size)
        });
        Self {
            auto_limit,
            inbox: VecDeque::with_capacity(c.max_batch_size),
            pending: HashMap::with_capacity(c.max_batch_size),
            pending_expiry: None,
            expiry_timer: Box::pin(tokio::time::sleep_until(Instant::now())),
            expiry_armed: None,
            in_flight: JoinSet::new(),
            running: HashMap::new(),
            in_flight_keys: HashMap::new(),
            timer: Box::pin(tokio::time::sleep_until(Instant::now())),
            timer_armed: false,
            deadline_passed: false,
            draining: false,
            rx_done: false,
            held: 0,
            last_fill: None,
            recent_fills: Vec::new(),
            rx: worker.rx,
            load: worker.load,
            shared: worker.shared,
            fill: worker.fill,
            _done: worker.done,
        }
    }

    fn config(&self) -> &Config {
        &self.shared.config
    }

    /// Whether running loads are looked up by key: to join plain requests
    /// to them (`join_in_flight`), or a cache's misses, so that a key has
    /// one load at a time however many callers miss it.
    fn tracks_in_flight(&self) -> bool {
        self.shared.config.join_in_flight || self.fill.get().is_some()
    }

    /// How many messages to take in the next receive: up to a batch; none
    /// while the batch is full or the worker holds all it may, which leaves
    /// messages in the bounded channel to push back on callers, unless the
    /// worker [enforces deadlines](policy::worker_enforces_deadlines) and so
    /// must see every request.
    fn receive_limit(&self) -> usize {
        let c = self.config();
        if policy::worker_enforces_deadlines(c) {
            c.max_batch_size
        } else if policy::may_accept(c, self.pending.len(), self.held) {
            (c.max_batch_size - self.pending.len()).min(policy::held_limit(c) - self.held)
        } else {
            0
        }
    }

    fn accept_inbox(&mut self) {
        let mut inbox = mem::take(&mut self.inbox);
        for msg in inbox.drain(..) {
            self.accept(msg);
        }
        self.inbox = inbox; // keeps its allocation
    }

    fn accept(&mut self, msg: Message<K, V>) {
        let stats = &self.shared.stats;
        Stats::incr(&stats.requests, 1);
        if msg.tx.is_closed() {
            // Timed out or cancelled while still in the channel.
            Stats::incr(&stats.abandoned, 1);
            return;
        }
        let config = self.config();
        if policy::worker_enforces_deadlines(config) && self.held >= policy::held_limit(config) {
            // Receiving anyway keeps every caller's deadline in sight.
            Stats::incr(&stats.overloaded, 1);
            let _ = msg.tx.send(Err(Error::Overloaded)); // caller gone; nothing to do
            return;
        }
        let waiter = Waiter {
            tx: msg.tx,
            enqueued_at: msg.enqueued_at,
            span: msg.span,
            stamp: msg.stamp,
        };
        let deadline = self.deadline_of(&waiter);
        let join_plain = config.join_in_flight;
        self.held += 1;
        // A cache miss that shares another's load, for the cache's count.
        let fill = self.fill.get().filter(|_| msg.stamp.is_some());
        let coalesced = || {
            if let Some(fill) = fill {
                fill.coalesced();
            }
        };
        let joinable = |&(_, load_stamp): &(task::Id, Option<Stamp>)| match msg.stamp {
            // A cache miss joins a load that started after every
            // invalidation its caller had seen, and that fills the cache.
            Some(stamp) => load_stamp.is_some_and(|s| s >= stamp),
            None => join_plain,
        };
        if let Some((id, _)) = self.in_flight_keys.get(&msg.key).filter(|e| joinable(e)) {
            let joined = self.running.get_mut(id).and_then(|run| {
                run.expiry = earliest(run.expiry, deadline);
                run.waiters.get_mut(&msg.key)
            });
            if let Some(waiters) = joined {
                Stats::record_duration(&stats.queue_wait, waiter.enqueued_at.elapsed());
                waiters.push(waiter);
                Stats::incr(&stats.joined_in_flight, 1);
                coalesced();
                return;
            }
        }
        if let Some(answer) = self.filled_meanwhile(&msg.key, &waiter) {
            // A cache miss whose key a load stored while the miss waited
            // in the channel: answered from the cache, not loaded again.
            self.held -= 1;
            Stats::record_duration(&stats.queue_wait, waiter.enqueued_at.elapsed());
            coalesced();
            let _ = waiter.tx.send(Ok(answer)); // caller gone; nothing to do
            return;
        }
        self.pending_expiry = earliest(self.pending_expiry, deadline);
        let first_key = self.pending.is_empty();
        match self.pending.entry(msg.key) {
            Entry::Occupied(mut e) => {
                // Joined another miss (a key pending for plain loads only
                // is this miss's own load, as far as the cache counts).
                if e.get().iter().any(|w| w.stamp.is_some()) {
                    coalesced();
                }
                e.get_mut().push(waiter);
                Stats::incr(&stats.deduplicated, 1);
            }
            Entry::Vacant(e) => {
                let enqueued_at = waiter.enqueued_at;
                e.insert(smallvec::smallvec![waiter]);
                if first_key && policy::arms_timer(&self.shared.config) {
                    // Measured from the request, not from its receipt, so
                    // time spent in the channel counts toward the delay.
                    let at = enqueued_at + self.shared.config.max_delay;
                    self.timer.as_mut().reset(at);
                    self.timer_armed = true;
                }
            }
        }
    }

    /// Dispatches while a batch is due and a slot is free: more than once
    /// only when the pending keys outgrew one batch (see
    /// [`policy::may_accept`]), and each round takes keys out, so it ends.
    fn flush_if_due(&mut self) {
        loop {
            let pending = Pending {
                keys: self.pending.len(),
                deadline_passed: self.deadline_passed,
                draining: self.draining,
            };
            // Slots are shared with callers that load directly when idle.
            let (running, limit) = (self.shared.running_loads(), self.shared.limit());
            if let Some(auto) = &mut self.auto_limit {
                if policy::held_by_limit(&self.shared.config, pending, running, limit) {
                    auto.held_back();
                }
            }
            if !policy::is_due(self.config(), pending, running, limit) {
                return;
            }
            let Some(slot) = LoadSlot::try_take(&self.shared) else {
                return;
            };
            self.dispatch(slot);
        }
    }

    fn dispatch(&mut self, slot: LoadSlot) {
        let capacity = self.config().max_batch_size;
        let expiry = self.pending_expiry;
        let mut batch = if self.pending.len() <= capacity {
            self.pending_expiry = None;
            self.timer_armed = false;
            self.deadline_passed = false;
            mem::replace(&mut self.pending, HashMap::with_capacity(capacity))
        } else {
            // Only while deadlines are enforced and every slot was busy.
            // The oldest keys go first, as they would have from the
            // channel, so a key is not passed over until it times out; the
            // rest waits for the next slot (or, under `FixedDelay` and
            // `Adaptive`, for a full batch or the flush timer still armed).
            let mut by_age: Vec<(Instant, K)> = self
                .pending
                .iter()
                .filter_map(|(k, ws)| ws.first().map(|w| (w.enqueued_at, k.clone())))
                .collect();
            by_age.select_nth_unstable_by_key(capacity - 1, |(at, _)| *at);
            by_age.truncate(capacity);
            by_age
                .into_iter()
                .filter_map(|(_, k)| self.pending.remove_entry(&k))
                .collect()
        };

        // Callers that went away are not loaded for, unless someone else
        // waits for the same key.
        let mut abandoned = 0;
        batch.retain(|_, waiters| {
            let before = waiters.len();
            waiters.retain(|w| !w.is_abandoned());
            abandoned += before - waiters.len();
            !waiters.is_empty()
        });
        self.held -= abandoned;
        let stats = &self.shared.stats;
        Stats::incr(&stats.abandoned, abandoned as u64);
        if batch.is_empty() {
            return; // the slot goes unused
        }

        let span = run::batch_span(&self.shared.config.name, batch.len(), false);
        let now = Instant::now();
        let link = !span.is_disabled();
        for w in batch.values().flatten() {
            Stats::record_duration(&stats.queue_wait, now - w.enqueued_at);
            if link {
                span.follows_from(&w.span);
            }
        }
        Stats::incr(&stats.batches, 1);
        stats.batch_size.record(batch.len() as u64);

        let keys: Vec<K> = batch.keys().cloned().collect();
        let load = run::contain(self.load.start(keys), self.shared.config.load_timeout);
        // A cache's misses: their keys and stamps go with the load, so the
        // cache is filled in the load's task, before the worker answers.
        let fill = self.fill.get().cloned();
        let stamped: Vec<(K, Stamp)> = match fill {
            Some(_) => batch
                .iter()
                .filter_map(|(k, ws)| latest_stamp(ws).map(|s| (k.clone(), s)))
                .collect(),
            None => Vec::new(),
        };
        let fills = !stamped.is_empty();
        let task = async move {
            let outcome = load.await;
            if let Some(fill) = fill.filter(|_| !stamped.is_empty()) {
                // The cache's weigher is the caller's code: a panic there
                // must not fail the load that its waiters are owed.
                let stores = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    fill.fill(outcome.filled(stamped))
                }));
                let stored = match stores {
                    Ok(Some(stores)) => AssertUnwindSafe(stores).catch_unwind().await.is_ok(),
                    Ok(None) => true,
                    Err(_) => false,
                };
                if !stored {
                    tracing::error!("filling the cache panicked; the load's values are not stored");
                }
            }
            outcome
        };
        let id = self.in_flight.spawn(task.instrument(span.clone())).id();
        if self.tracks_in_flight() {
            for (key, waiters) in &batch {
                let stamp = latest_stamp(waiters);
                match self.in_flight_keys.entry(key.clone()) {
                    // A plain load beside a cache miss's running load (the
                    // cache bypassed meanwhile) leaves the miss's load
                    // joinable: `None` orders first.
                    Entry::Occupied(e) if e.get().1 > stamp => {}
                    Entry::Occupied(mut e) => *e.get_mut() = (id, stamp),
                    Entry::Vacant(e) => {
                        e.insert((id, stamp));
                    }
                }
            }
        }
        self.running.insert(
            id,
            Running {
                waiters: batch,
                expiry,
                started: now,
                span,
                fills,
                slot,
            },
        );
    }

    fn complete(&mut self, done: Result<(task::Id, Outcome<K, V>), JoinError>) {
        let (id, outcome) = match done {
            Ok((id, outcome)) => (id, Ok(outcome)),
            Err(e) => (e.id(), Err(e)),
        };
        let Some(run) = self.running.remove(&id) else {
            return;
        };
        if self.tracks_in_flight() {
            for key in run.waiters.keys() {
                if self.in_flight_keys.get(key).is_some_and(|(i, _)| *i == id) {
                    self.in_flight_keys.remove(key);
                }
            }
        }
        let stats = &self.shared.stats;
        let now = Instant::now();
        if run.fills {
            self.last_fill = Some(now);
            if self.recent_fills.is_empty() {
                self.recent_fills = vec![[0; RECENT_FILL_WAYS]; RECENT_FILL_SETS];
            }
            for stamp in run.waiters.values().filter_map(latest_stamp) {
                let set = &mut self.recent_fills[recent_fill_set(stamp.hash)];
                if !set.contains(&stamp.hash) {
                    set.rotate_right(1);
                    set[0] = stamp.hash;
                }
            }
        }
        let load_time = now - run.started;
        Stats::record_duration(&stats.load_duration, load_time);
        let Running {
            waiters,
            span,
            slot,
            ..
        } = run;
        let keys = waiters.len();
        let settled = span.in_scope(|| match outcome {
            Ok(outcome) => outcome.settle(stats, keys),
            // `run::contain` catches the loader's panics, so the task only
            // fails when it is cancelled: the runtime is shutting down.
            Err(_) => {
                Stats::incr(&stats.failed_keys, keys as u64);
                Err(Error::Closed)
            }
        });
        if let (Ok(_), Some(auto)) = (&settled, &mut self.auto_limit) {
            let (mut served, mut response) = (0, Duration::ZERO);
            for w in waiters.values().flatten() {
                served += 1;
                response += now.saturating_duration_since(w.enqueued_at);
            }
            if let Some(limit) = auto.completed(served, keys, response, load_time, now) {
                self.shared.set_limit(limit);
                tracing::debug!(batcher = %self.shared.config.name, limit, "concurrency limit");
            }
            let (least, recent) = auto.load_times();
            stats.set_load_times(least, recent);
        }
        // The next due batch goes out before this one's waiters are
        // answered: answering a batch of callers takes the worker a while,
        // and meanwhile the database would wait for its next load (at the
        // knee, with few loads in flight, that wait set pgbatch at 0.85 of
        // a hand-written batcher, whose loop owns its connection; 0.92
        // without it). With no keys waiting the slot is kept until the
        // answers are out: freed, it would let a caller answered first find
        // the batcher idle and load alone, beside the worker's next batch.
        let slot = if self.pending.is_empty() {
            Some(slot)
        } else {
            drop(slot);
            self.flush_if_due();
            None
        };
        let stats = &self.shared.stats;
        let _enter = span.enter();
        match settled {
            Ok(mut values) => {
                let mut found = 0;
                for (key, waiters) in waiters {
                    let value = values.remove(&key);
                    found += usize::from(self.load.found(value.as_ref()));
                    self.held -= waiters.len();
                    reply_all(waiters, Ok(value));
                }
                run::record_found(stats, found, keys);
            }
            Err(failure) => {
                for waiters in waiters.into_values() {
                    self.held -= waiters.len();
                    reply_all(waiters, Err(failure.clone()));
                }
            }
        }
        drop(slot);
    }

    /// For a cache miss that waited in the channel while a load filled
    /// the cache, and whose key is not pending: what the cache holds for
    /// it now, if anything. Under a burst of misses (a GraphQL query's
    /// N+1 lookups), many wait in the channel while the loads run; without
    /// this look they would load again keys a load just stored.
    fn filled_meanwhile(&self, key: &K, waiter: &Waiter<V>) -> Option<Option<V>> {
        let filled_at = self.last_fill?;
        let hash = waiter.stamp?.hash;
        if waiter.enqueued_at > filled_at
            || !self.recent_fills[recent_fill_set(hash)].contains(&hash)
            || self.pending.contains_key(key)
        {
            return None;
        }
        self.fill.get()?.cached(key)
    }

    /// The moment `waiter` times out, when this worker enforces it.
    fn deadline_of(&self, waiter: &Waiter<V>) -> Option<Instant> {
        let config = self.config();
        if !policy::worker_enforces_deadlines(config) {
            return None;
        }
        config.deadline(waiter.enqueued_at)
    }

    /// Answers [`Error::Timeout`] to every waiter whose deadline has passed,
    /// pending or in a running load (which goes on for the others), and
    /// makes the expiry bounds exact.
    fn expire(&mut self) {
        self.expiry_armed = None;
        let Some(timeout) = self.config().timeout else {
            return;
        };
        let now = Instant::now();
        let shared = Arc::clone(&self.shared);
        let deadline_of = |w: &Waiter<V>| shared.config.deadline(w.enqueued_at);
        let (mut expired, mut timed_out) = (0, 0);
        let mut sweep = |waiters: &mut Waiters<V>, earliest_left: &mut Option<Instant>| {
            // Most keys have nothing expired: leave those as they are.
            if !waiters
                .iter()
                .any(|w| deadline_of(w).is_some_and(|d| d <= now))
            {
                for w in waiters.iter() {
                    *earliest_left = earliest(*earliest_left, deadline_of(w));
                }
                return;
            }
            for w in mem::take(waiters) {
                let deadline = deadline_of(&w);
                if deadline.is_some_and(|d| d <= now) {
                    expired += 1;
                    // A caller already gone was abandoned, not timed out
                    // (and one that timed out by its own timer counted it).
                    if w.tx.send(Err(Error::Timeout(timeout))).is_ok() {
                        timed_out += 1;
                    }
                } else {
                    *earliest_left = earliest(*earliest_left, deadline);
                    waiters.push(w);
                }
            }
        };
        if self.pending_expiry.is_some_and(|e| e <= now) {
            let mut left = None;
            self.pending.retain(|_, waiters| {
                sweep(waiters, &mut left);
                !waiters.is_empty()
            });
            self.pending_expiry = left;
            if self.pending.is_empty() {
                // As after a dispatch: the next first key starts afresh.
                self.timer_armed = false;
                self.deadline_passed = false;
            }
        }
        for run in self.running.values_mut() {
            if run.expiry.is_some_and(|e| e <= now) {
                // Keys whose waiters all left stay, so the load's answer
                // still finds them.
                let mut left = None;
                run.waiters.values_mut().for_each(|w| sweep(w, &mut left));
                run.expiry = left;
            }
        }
        self.held -= expired;
        let stats = &self.shared.stats;
        Stats::incr(&stats.timed_out, timed_out as u64);
        Stats::incr(&stats.abandoned, (expired - timed_out) as u64);
    }

    /// Points the expiry timer at the earliest deadline it knows of. A
    /// later deadline does not move it: firing early only costs a sweep,
    /// and resetting a timer costs about what a request does.
    fn arm_expiry(&mut self) {
        if !policy::worker_enforces_deadlines(self.config()) {
            return;
        }
        let next = self
            .running
            .values()
            .fold(self.pending_expiry, |acc, run| earliest(acc, run.expiry));
        match (next, self.expiry_armed) {
            (Some(at), Some(armed)) if at >= armed => {}
            (Some(at), _) => {
                self.expiry_timer.as_mut().reset(at);
                self.expiry_armed = Some(at);
            }
            (None, _) => self.expiry_armed = None,
        }
    }

    fn publish_gauges(&self) {
        let stats = &self.shared.stats;
        stats.pending_keys.store(self.pending.len() as u64, Relaxed);
        stats
            .in_flight_batches
            .store(self.shared.running_loads() as u64, Relaxed);
        #[cfg(feature = "metrics")]
        if let Some(gauges) = stats.gauges.get() {
            gauges.pending.set(self.pending.len() as f64);
            gauges.in_flight.set(self.shared.running_loads() as f64);
            gauges.limit.set(self.shared.limit() as f64);
            // Only the automatic limit has them (0: none).
            for (gauge, ns) in [
                (&gauges.load_least, &stats.load_time_least),
                (&gauges.load_recent, &stats.load_time_recent),
            ] {
                let ns = ns.load(Relaxed);
                if ns != 0 {
                    gauge.set(ns as f64 * 1e-9);
                }
            }
            gauges.queued.set(self.rx.len() as f64);
        }
    }
}

/// The earlier of two optional instants, `None` meaning none at all.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Sets of [`State::recent_fills`], of [`RECENT_FILL_WAYS`] hashes each:
/// enough for the keys of a burst of misses (a GraphQL query's N+1
/// lookups) in 32 KiB.
const RECENT_FILL_SETS: usize = 1024;
const RECENT_FILL_WAYS: usize = 4;

fn recent_fill_set(hash: u64) -> usize {
    // The low bits of a well-mixed hash; `RECENT_FILL_SETS` is a power of
    // two.
    (hash as usize) & (RECENT_FILL_SETS - 1)
}

/// The latest stamp among a key's cache misses, if any waiter is one.
fn latest_stamp<V>(waiters: &Waiters<V>) -> Option<Stamp> {
    waiters.iter().filter_map(|w| w.stamp).max()
}

/// Sends `reply` to every waiter, cloning for all but the last.
fn reply_all<V: Clone>(waiters: Waiters<V>, reply: Reply<V>) {
    let mut waiters = waiters.into_iter();
    let last = waiters.next_back();
    for w in waiters {
        let _ = w.tx.send(reply.clone()); // caller dropped its future; nothing to do
    }
    if let Some(w) = last {
        let _ = w.tx.send(reply); // caller dropped its future; nothing to do
    }
}
