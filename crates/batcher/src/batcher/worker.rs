//! The worker task: receives requests, forms batches, runs loads, answers.
//!
//! All batching state is owned by this one task, so none of it needs a lock.
//! Loads run in their own tasks (a [`JoinSet`]): a caller that goes away, or a
//! loader that panics, cannot take a batch's other waiters down with it, and
//! the worker keeps receiving while loads run. Keys wait in one lane per
//! scope (see [`super::lanes`]): a load serves one scope.

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

use super::lanes::{Added, Lanes};
use super::limit::AutoLimit;
use super::message::{Message, Waiter, Waiters};
use super::observer::{ObserverSlot, Stamp};
use super::policy::{self, Pending};
use super::queue::Receiver;
use super::run::{self, Answered, LoadFn, Outcome};
use super::shared::{LoadSlot, Shared};
use crate::error::{TimedOut, Waited};
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
pub struct Worker<K, V, S = ()> {
    rx: Receiver<Message<S, K, V>>,
    load: LoadFn<S, K, V>,
    shared: Arc<Shared>,
    observer: ObserverSlot<S, K, V>,
    done: DropGuard,
}

impl<K, V, S> fmt::Debug for Worker<K, V, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("name", &self.shared.config.name)
            .finish_non_exhaustive()
    }
}

impl<K, V, S> Worker<K, V, S>
where
    K: Clone + Eq + Hash + Send + 'static,
    V: Clone + Send + 'static,
    S: Clone + Eq + Hash + Send + Sync + 'static,
{
    pub(crate) fn new(
        rx: Receiver<Message<S, K, V>>,
        load: LoadFn<S, K, V>,
        shared: Arc<Shared>,
        observer: ObserverSlot<S, K, V>,
    ) -> Self {
        let done = shared.done.clone().drop_guard();
        Self {
            rx,
            load,
            shared,
            observer,
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
                () = state.flush_timer.fired(), if state.flush_timer.is_armed() => Event::FlushTimer,
                () = state.expiry_timer.fired(), if state.expiry_timer.is_armed() => Event::Expiry,
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
                Event::FlushTimer => state.flush_timer.disarm(),
                Event::Expiry => state.expire(),
                Event::Received(n) if n > 0 => state.accept_inbox(),
                Event::Received(_) => {
                    state.rx_done = true;
                    state.draining = true;
                }
            }
            // One reading of the clock for both: a delay that ended
            // between two readings would be neither due to the first nor
            // armed by the second, and its batch would wait for the next
            // event (for a lone request, its deadline).
            let now = Instant::now();
            state.flush_if_due(now);
            state.arm_timers(now);
            state.publish_gauges();
            if state.rx_done && state.lanes.pending_keys() == 0 && state.in_flight.is_empty() {
                break;
            }
        }
        tracing::debug!(batcher = %state.shared.config.name, "batcher worker stopped");
    }
}

enum Event<K, V> {
    Completed(Result<(task::Id, Outcome<K, V>), JoinError>),
    Shutdown,
    FlushTimer,
    Expiry,
    /// How many messages `take` put in the inbox; none means the queue is
    /// closed, or every handle gone, and empty.
    Received(usize),
}

/// A timer the worker polls only while it is armed, so an idle worker
/// never wakes up.
struct Alarm {
    sleep: Pin<Box<Sleep>>,
    at: Option<Instant>,
}

impl Alarm {
    fn new() -> Self {
        Self {
            sleep: Box::pin(tokio::time::sleep_until(Instant::now())),
            at: None,
        }
    }

    fn is_armed(&self) -> bool {
        self.at.is_some()
    }

    fn fired(&mut self) -> &mut Pin<Box<Sleep>> {
        &mut self.sleep
    }

    /// Sets the alarm for `at`, or disarms it. Resetting a timer costs
    /// about what a request does, so an unchanged one is left alone.
    fn set(&mut self, at: Option<Instant>) {
        if at == self.at {
            return;
        }
        if let Some(at) = at {
            self.sleep.as_mut().reset(at);
        }
        self.at = at;
    }

    fn disarm(&mut self) {
        self.at = None;
    }
}

/// A batch whose load is running.
struct Running<K, V> {
    /// The lane of the batch's scope.
    lane: usize,
    waiters: HashMap<K, Waiters<V>>,
    /// No waiter's deadline is earlier (see [`State::pending_expiry`]).
    expiry: Option<Instant>,
    started: Instant,
    span: tracing::Span,
    /// Freed as the load completes, before its waiters are answered (see
    /// [`State::complete`]).
    slot: LoadSlot,
}

struct State<S, K, V> {
    rx: Receiver<Message<S, K, V>>,
    load: LoadFn<S, K, V>,
    shared: Arc<Shared>,
    /// Whoever watches the loads (a cache built over this batcher), if any.
    observer: ObserverSlot<S, K, V>,
    /// Messages just received, before [`State::accept_inbox`].
    inbox: VecDeque<Message<S, K, V>>,
    /// Each scope's pending keys and running keys, and whose turn it is.
    lanes: Lanes<S, K, V>,
    /// With [`policy::worker_enforces_deadlines`]: no deadline of a pending
    /// waiter, in any lane, is earlier. A bound, not always the minimum, so
    /// that keeping it costs one comparison per request; [`State::expire`]
    /// tightens it.
    pending_expiry: Option<Instant>,
    /// Fires at the earliest waiter deadline it knows of.
    expiry_timer: Alarm,
    /// With `FixedDelay` and `Adaptive`: fires `max_delay` after the first
    /// key of the next lane's batch.
    flush_timer: Alarm,
    in_flight: JoinSet<Outcome<K, V>>,
    running: HashMap<task::Id, Running<K, V>>,
    /// Shutting down: flush everything pending without waiting.
    draining: bool,
    /// The queue is closed, or every handle gone, and empty.
    rx_done: bool,
    /// Waiters held in the lanes and running loads, bounded by
    /// [`policy::held_limit`].
    held: usize,
    /// With [`Concurrency::Auto`](crate::Concurrency::Auto): the search for
    /// the limit, fed with every load's outcome; it publishes the limit in
    /// [`Shared`].
    auto_limit: Option<AutoLimit>,
    _done: DropGuard,
}

impl<S, K, V> State<S, K, V>
where
    K: Clone + Eq + Hash + Send + 'static,
    V: Clone + Send + 'static,
    S: Clone + Eq + Hash + Send + Sync + 'static,
{
    fn new(worker: Worker<K, V, S>) -> Self {
        let c = &worker.shared.config;
        let auto_limit = c.concurrency.is_auto().then(|| {
            AutoLimit::new(
                policy::min_auto_limit(c),
                c.concurrency.max(),
                c.max_batch_size,
                Instant::now(),
            )
        });
        Self {
            auto_limit,
            inbox: VecDeque::with_capacity(c.max_batch_size),
            lanes: Lanes::new(c.max_batch_size),
            pending_expiry: None,
            expiry_timer: Alarm::new(),
            flush_timer: Alarm::new(),
            in_flight: JoinSet::new(),
            running: HashMap::new(),
            draining: false,
            rx_done: false,
            held: 0,
            rx: worker.rx,
            load: worker.load,
            shared: worker.shared,
            observer: worker.observer,
            _done: worker.done,
        }
    }

    /// Whether running loads are looked up by key: to join plain requests
    /// to them (`join_in_flight`), or an observer's, so that a key has one
    /// load at a time however many of its callers the observer sends.
    fn tracks_in_flight(&self) -> bool {
        self.shared.config.join_in_flight || self.observer.get().is_some()
    }

    /// How many messages to take in the next receive: up to a batch; none
    /// while the pending keys fill a batch or the worker holds all it may,
    /// which leaves messages in the bounded channel to push back on
    /// callers, unless the worker [enforces
    /// deadlines](policy::worker_enforces_deadlines) and so must see every
    /// request.
    fn receive_limit(&self) -> usize {
        let c = &self.shared.config;
        let pending = self.lanes.pending_keys();
        if policy::worker_enforces_deadlines(c) {
            c.max_batch_size
        } else if policy::may_accept(c, pending, self.held) {
            (c.max_batch_size - pending).min(policy::held_limit(c) - self.held)
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

    fn accept(&mut self, msg: Message<S, K, V>) {
        let stats = &self.shared.stats;
        Stats::incr(&stats.requests, 1);
        if msg.tx.is_closed() {
            // Timed out or cancelled while still in the channel.
            Stats::incr(&stats.abandoned, 1);
            return;
        }
        let config = &self.shared.config;
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
        self.held += 1;
        let i = self.lanes.lane_of(msg.scope);
        // An observer's request that shares another's load, for its count.
        let observer = self.observer.get().filter(|_| msg.stamp.is_some());
        let joined = || {
            if let Some(observer) = observer {
                observer.joined();
            }
        };
        let join_plain = config.join_in_flight;
        let joinable = |&(_, load_stamp): &(task::Id, Option<Stamp>)| match msg.stamp {
            // An observer's request joins a load that started after every
            // invalidation its caller had seen, and that the observer sees.
            Some(stamp) => load_stamp.is_some_and(|s| s >= stamp),
            None => join_plain,
        };
        let lane = self.lanes.get_mut(i);
        if let Some((id, _)) = lane.in_flight.get(&msg.key).filter(|e| joinable(e)) {
            let joined_load = self.running.get_mut(id).and_then(|run| {
                run.expiry = earliest(run.expiry, deadline);
                run.waiters.get_mut(&msg.key)
            });
            if let Some(waiters) = joined_load {
                Stats::record_duration(&stats.queue_wait, waiter.enqueued_at.elapsed());
                waiters.push(waiter);
                Stats::incr(&stats.joined_in_flight, 1);
                joined();
                return;
            }
        }
        if let (Some(observer), Some(stamp)) = (observer, waiter.stamp) {
            // Stored while the request waited in the channel (a burst of
            // a GraphQL query's N+1 misses, while earlier loads of the same
            // keys ran): answered now, not loaded again.
            let answer = if lane.waits_for(&msg.key) {
                None
            } else {
                observer.answer_now(&lane.scope, &msg.key, stamp, waiter.enqueued_at)
            };
            if let Some(answer) = answer {
                self.held -= 1;
                Stats::record_duration(&stats.queue_wait, waiter.enqueued_at.elapsed());
                joined();
                let _ = waiter.tx.send(Ok(answer)); // caller gone; nothing to do
                self.lanes.release_if_idle(i);
                return;
            }
        }
        self.pending_expiry = earliest(self.pending_expiry, deadline);
        match self.lanes.add(i, msg.key, waiter) {
            Added::Joined { stamped } => {
                // Joined another stamped request (a key pending for plain
                // loads only is this request's own load, as far as the
                // observer counts).
                if stamped {
                    joined();
                }
                Stats::incr(&stats.deduplicated, 1);
            }
            Added::New => {}
        }
    }

    /// Dispatches while a batch is due and a slot is free: more than once
    /// only when keys wait behind a full batch or several scopes wait (see
    /// [`policy::may_accept`]), and each round takes keys out, so it ends.
    fn flush_if_due(&mut self, now: Instant) {
        loop {
            let Some(i) = self.lanes.next() else { return };
            let config = &self.shared.config;
            let lane = self.lanes.get(i);
            let pending = Pending {
                keys: lane.pending.len(),
                // Measured from the request, not from its receipt, so time
                // spent in the channel counts toward the delay.
                deadline_passed: policy::arms_timer(config)
                    && lane.first_at.is_some_and(|at| at + config.max_delay <= now),
                draining: self.draining,
            };
            // Slots are shared with callers that load directly when idle.
            let (running, limit) = (self.shared.running_loads(), self.shared.limit());
            if let Some(auto) = &mut self.auto_limit {
                if policy::held_by_limit(config, pending, running, limit) {
                    auto.held_back();
                }
            }
            if !policy::is_due(config, pending, running, limit) {
                return;
            }
            let Some(slot) = LoadSlot::try_take(&self.shared) else {
                return;
            };
            self.dispatch(i, slot);
        }
    }

    fn dispatch(&mut self, i: usize, slot: LoadSlot) {
        let expiry = self.pending_expiry;
        let mut batch = self.lanes.take(i);
        if self.lanes.pending_keys() == 0 {
            self.pending_expiry = None;
        }

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
            self.lanes.release_if_idle(i);
            return; // the slot goes unused
        }

        let scope = self.lanes.get(i).scope.clone();
        let span = run::batch_span(&self.shared, batch.len(), false, || {
            self.load.label(&scope).map(Into::into)
        });
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
        let load = run::contain(
            self.load.start(scope.clone(), keys),
            self.shared.config.load_timeout,
        );
        // An observer's requests: their keys and stamps go with the load,
        // so the observer sees its end in the load's task, before the
        // worker answers.
        let observer = self.observer.get().cloned();
        let stamped: Vec<(K, Stamp)> = match observer {
            Some(_) => batch
                .iter()
                .filter_map(|(k, ws)| latest_stamp(ws).map(|s| (k.clone(), s)))
                .collect(),
            None => Vec::new(),
        };
        let shared = Arc::clone(&self.shared);
        let task = async move {
            // Timed here, not by the worker: its view of a load also holds
            // the wait for the task's first poll and for its own turn to
            // see the end, which are no part of the loader's time.
            let started = Instant::now();
            let outcome = load.await;
            Stats::record_duration(&shared.stats.load_duration, started.elapsed());
            if let Some(observer) = observer.filter(|_| !stamped.is_empty()) {
                // The observer runs the caller's code (a cache's weigher):
                // a panic there must not fail the load its waiters are
                // owed.
                let work = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    observer.ended(&scope, outcome.ended(stamped))
                }));
                let done = match work {
                    Ok(Some(work)) => AssertUnwindSafe(work).catch_unwind().await.is_ok(),
                    Ok(None) => true,
                    Err(_) => false,
                };
                if !done {
                    tracing::error!("the load's observer panicked; its values are not kept");
                }
            }
            outcome
        };
        let id = self.in_flight.spawn(task.instrument(span.clone())).id();
        let tracks = self.tracks_in_flight();
        let lane = self.lanes.get_mut(i);
        lane.loads += 1;
        if tracks {
            for (key, waiters) in &batch {
                let stamp = latest_stamp(waiters);
                match lane.in_flight.entry(key.clone()) {
                    // A plain load beside a stamped request's running load
                    // (the observer bypassed meanwhile) leaves the stamped
                    // load joinable: `None` orders first.
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
                lane: i,
                waiters: batch,
                expiry,
                started: now,
                span,
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
        let lane = self.lanes.get_mut(run.lane);
        lane.loads -= 1;
        if !lane.in_flight.is_empty() {
            for key in run.waiters.keys() {
                if lane.in_flight.get(key).is_some_and(|(i, _)| *i == id) {
                    lane.in_flight.remove(key);
                }
            }
        }
        let stats = &self.shared.stats;
        let now = Instant::now();
        let load_time = now - run.started;
        let Running {
            lane: lane_index,
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
        let slot = if self.lanes.pending_keys() == 0 {
            Some(slot)
        } else {
            drop(slot);
            self.flush_if_due(Instant::now());
            None
        };
        let stats = &self.shared.stats;
        let _enter = span.enter();
        match settled {
            Ok(mut loaded) => {
                let mut answered = Answered::default();
                for (key, waiters) in waiters {
                    let answer = loaded.take(&key);
                    let found = answer.as_ref().is_ok_and(|v| self.load.found(v.as_ref()));
                    answered.count(&answer, found);
                    self.held -= waiters.len();
                    reply_all(waiters, answer.map_err(Error::Load));
                }
                answered.record(stats);
            }
            Err(failure) => {
                for waiters in waiters.into_values() {
                    self.held -= waiters.len();
                    reply_all(waiters, Err(failure.clone()));
                }
            }
        }
        drop(slot);
        self.lanes.release_if_idle(lane_index);
    }

    /// The moment `waiter` times out, when this worker enforces it.
    fn deadline_of(&self, waiter: &Waiter<V>) -> Option<Instant> {
        let config = &self.shared.config;
        if !policy::worker_enforces_deadlines(config) {
            return None;
        }
        config.deadline(waiter.enqueued_at)
    }

    /// Answers [`Error::Timeout`] to every waiter whose deadline has passed,
    /// pending, behind a full batch, or in a running load (which goes on
    /// for the others), and tightens the expiry bounds.
    fn expire(&mut self) {
        self.expiry_timer.disarm();
        let Some(timeout) = self.shared.config.timeout else {
            return;
        };
        let now = Instant::now();
        let shared = Arc::clone(&self.shared);
        // The deadline of a caller that asked `at`, and whether it passed.
        let deadline = |at: Instant| shared.config.deadline(at);
        let due = |at: Instant| deadline(at).is_some_and(|d| d <= now);
        let (mut expired, mut timed_out) = (0, 0);
        let mut sweep =
            |waiters: &mut Waiters<V>, earliest_left: &mut Option<Instant>, waited: Waited| {
                // Most keys have nothing expired: leave those as they are.
                if !waiters.iter().any(|w| due(w.enqueued_at)) {
                    for w in waiters.iter() {
                        *earliest_left = earliest(*earliest_left, deadline(w.enqueued_at));
                    }
                    return;
                }
                for w in mem::take(waiters) {
                    let deadline = deadline(w.enqueued_at);
                    if deadline.is_some_and(|d| d <= now) {
                        expired += 1;
                        // A caller already gone was abandoned, not timed out
                        // (and one that timed out by its own timer counted it).
                        let answer = Error::Timeout(TimedOut::new(timeout, waited));
                        if w.tx.send(Err(answer)).is_ok() {
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
            self.lanes.sweep_pending(|lane| {
                lane.pending.retain(|_, waiters| {
                    sweep(waiters, &mut left, Waited::ForALoad);
                    !waiters.is_empty()
                });
                let next = lane.sweep_later(due, |waiters| {
                    sweep(waiters, &mut left, Waited::ForALoad);
                });
                left = earliest(left, next.and_then(deadline));
            });
            self.pending_expiry = left;
        }
        for run in self.running.values_mut() {
            if run.expiry.is_some_and(|e| e <= now) {
                // Keys whose waiters all left stay, so the load's answer
                // still finds them.
                let mut left = None;
                let waited = Waited::InALoad(now.saturating_duration_since(run.started));
                run.waiters
                    .values_mut()
                    .for_each(|w| sweep(w, &mut left, waited));
                run.expiry = left;
            }
        }
        self.held -= expired;
        let stats = &self.shared.stats;
        Stats::incr(&stats.timed_out, timed_out as u64);
        Stats::incr(&stats.abandoned, (expired - timed_out) as u64);
    }

    /// Points the expiry timer at the earliest deadline it knows of (a
    /// later deadline does not move it: firing early only costs a sweep),
    /// and the flush timer at the next lane's delay.
    fn arm_timers(&mut self, now: Instant) {
        if policy::worker_enforces_deadlines(&self.shared.config) {
            let next = self
                .running
                .values()
                .fold(self.pending_expiry, |acc, run| earliest(acc, run.expiry));
            match (next, self.expiry_timer.at) {
                (Some(at), Some(armed)) if at >= armed => {}
                (next, _) => self.expiry_timer.set(next),
            }
        }
        if policy::arms_timer(&self.shared.config) {
            let max_delay = self.shared.config.max_delay;
            // A delay passed by `now` arms nothing: `flush_if_due` saw it
            // pass at the same `now`, so its batch went out, or waits for
            // a slot, which a completion frees.
            let next = self
                .lanes
                .next()
                .and_then(|i| self.lanes.get(i).first_at)
                .map(|at| at + max_delay)
                .filter(|at| *at > now);
            self.flush_timer.set(next);
        }
    }

    fn publish_gauges(&self) {
        let stats = &self.shared.stats;
        let pending = self.lanes.pending_keys();
        stats.pending_keys.store(pending as u64, Relaxed);
        stats
            .in_flight_batches
            .store(self.shared.running_loads() as u64, Relaxed);
        stats.scopes.store(self.lanes.len() as u64, Relaxed);
        #[cfg(feature = "metrics")]
        if let Some(gauges) = stats.gauges.get() {
            gauges.pending.set(pending as f64);
            gauges.in_flight.set(self.shared.running_loads() as f64);
            gauges.limit.set(self.shared.limit() as f64);
            gauges.scopes.set(self.lanes.len() as f64);
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

/// The latest stamp among a key's requests, if any carries one.
fn latest_stamp<V>(waiters: &Waiters<V>) -> Option<Stamp> {
    waiters.iter().filter_map(|w| w.stamp).max()
}

/// Sends `reply` to every waiter, cloning for all but the last.
fn reply_all<V: Clone>(waiters: Waiters<V>, reply: Result<Option<V>, Error>) {
    let mut waiters = waiters.into_iter();
    let last = waiters.next_back();
    for w in waiters {
        let _ = w.tx.send(reply.clone()); // caller dropped its future; nothing to do
    }
    if let Some(w) = last {
        let _ = w.tx.send(reply); // caller dropped its future; nothing to do
    }
}
