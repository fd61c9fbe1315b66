//! The worker task: receives requests, forms batches, runs loads, answers.
//!
//! All batching state is owned by this one task, so none of it needs a lock.
//! Loads run in their own tasks (a [`JoinSet`]): a caller that goes away, or a
//! loader that panics, cannot take a batch's other waiters down with it, and
//! the worker keeps receiving while loads run.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::mem;
use std::pin::{pin, Pin};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::{self, JoinError, JoinSet};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::DropGuard;
use tracing::Instrument;

use super::config::Config;
use super::message::{Message, Reply, Waiter};
use super::policy::{self, Pending};
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
    rx: mpsc::Receiver<Message<K, V>>,
    load: LoadFn<K, V>,
    shared: Arc<Shared>,
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
        rx: mpsc::Receiver<Message<K, V>>,
        load: LoadFn<K, V>,
        shared: Arc<Shared>,
    ) -> Self {
        let done = shared.done.clone().drop_guard();
        Self {
            rx,
            load,
            shared,
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
            let can_recv = !state.rx_done
                && policy::may_accept(state.config(), state.pending.len(), state.held);
            let event = tokio::select! {
                // Completions first: they free load slots and memory.
                biased;
                Some(done) = state.in_flight.join_next_with_id(), if !state.in_flight.is_empty() => {
                    Event::Completed(done)
                }
                () = &mut shutdown, if !state.draining => Event::Shutdown,
                () = &mut state.timer, if state.timer_armed => Event::Deadline,
                msg = state.rx.recv(), if can_recv => Event::Received(msg),
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
                Event::Received(Some(msg)) => {
                    state.accept(msg);
                    state.accept_queued();
                }
                Event::Received(None) => {
                    state.rx_done = true;
                    state.draining = true;
                }
            }
            state.flush_if_due();
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
    Received(Option<Message<K, V>>),
}

/// A batch whose load is running.
struct Running<K, V> {
    waiters: HashMap<K, Vec<Waiter<V>>>,
    started: Instant,
    span: tracing::Span,
    /// Freed when the batch's waiters have been answered.
    _slot: LoadSlot,
}

struct State<K, V> {
    rx: mpsc::Receiver<Message<K, V>>,
    load: LoadFn<K, V>,
    shared: Arc<Shared>,
    /// Keys of the next batch and who waits for each.
    pending: HashMap<K, Vec<Waiter<V>>>,
    in_flight: JoinSet<Outcome<K, V>>,
    running: HashMap<task::Id, Running<K, V>>,
    /// Which running load has each key, kept only with `join_in_flight`.
    in_flight_keys: HashMap<K, task::Id>,
    /// With `FixedDelay` and `Adaptive`: fires `max_delay` after the pending batch's first
    /// key. Only polled while armed, so an idle worker never wakes up.
    timer: Pin<Box<Sleep>>,
    timer_armed: bool,
    deadline_passed: bool,
    /// Shutting down: flush everything pending without waiting.
    draining: bool,
    /// The channel is closed and empty.
    rx_done: bool,
    /// Waiters held in `pending` and `running`, bounded by
    /// [`policy::held_limit`].
    held: usize,
    _done: DropGuard,
}

impl<K, V> State<K, V>
where
    K: Clone + Eq + Hash + Send + 'static,
    V: Clone + Send + 'static,
{
    fn new(worker: Worker<K, V>) -> Self {
        let c = &worker.shared.config;
        Self {
            pending: HashMap::with_capacity(c.max_batch_size),
            in_flight: JoinSet::new(),
            running: HashMap::new(),
            in_flight_keys: HashMap::new(),
            timer: Box::pin(tokio::time::sleep_until(Instant::now())),
            timer_armed: false,
            deadline_passed: false,
            draining: false,
            rx_done: false,
            held: 0,
            rx: worker.rx,
            load: worker.load,
            shared: worker.shared,
            _done: worker.done,
        }
    }

    fn config(&self) -> &Config {
        &self.shared.config
    }

    /// Takes whatever is already queued, without waiting, so one wake-up
    /// serves a whole burst.
    fn accept_queued(&mut self) {
        while policy::may_accept(self.config(), self.pending.len(), self.held) {
            match self.rx.try_recv() {
                Ok(msg) => self.accept(msg),
                Err(_) => break,
            }
        }
    }

    fn accept(&mut self, msg: Message<K, V>) {
        Stats::incr(&self.shared.stats.requests, 1);
        if msg.tx.is_closed() {
            // Timed out or cancelled while still in the channel.
            Stats::incr(&self.shared.stats.abandoned, 1);
            return;
        }
        let waiter = Waiter {
            tx: msg.tx,
            enqueued_at: msg.enqueued_at,
            span: msg.span,
        };
        self.held += 1;
        if let Some(id) = self.in_flight_keys.get(&msg.key) {
            let joined = self
                .running
                .get_mut(id)
                .and_then(|run| run.waiters.get_mut(&msg.key));
            if let Some(waiters) = joined {
                Stats::record_duration(&self.shared.stats.queue_wait, waiter.enqueued_at.elapsed());
                waiters.push(waiter);
                Stats::incr(&self.shared.stats.joined_in_flight, 1);
                return;
            }
        }
        let first_key = self.pending.is_empty();
        match self.pending.entry(msg.key) {
            Entry::Occupied(mut e) => {
                e.get_mut().push(waiter);
                Stats::incr(&self.shared.stats.deduplicated, 1);
            }
            Entry::Vacant(e) => {
                let enqueued_at = waiter.enqueued_at;
                e.insert(vec![waiter]);
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

    fn flush_if_due(&mut self) {
        let pending = Pending {
            keys: self.pending.len(),
            deadline_passed: self.deadline_passed,
            draining: self.draining,
        };
        // Slots are shared with callers that load directly when idle.
        if !policy::is_due(self.config(), pending, self.shared.running_loads()) {
            return;
        }
        if let Some(slot) = LoadSlot::try_take(&self.shared) {
            self.dispatch(slot);
        }
    }

    fn dispatch(&mut self, slot: LoadSlot) {
        let capacity = self.config().max_batch_size;
        let mut batch = mem::replace(&mut self.pending, HashMap::with_capacity(capacity));
        self.timer_armed = false;
        self.deadline_passed = false;

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
        let task = run::run(self.load.start(keys), self.shared.config.load_timeout);
        let id = self.in_flight.spawn(task.instrument(span.clone())).id();
        if self.shared.config.join_in_flight {
            for key in batch.keys() {
                self.in_flight_keys.insert(key.clone(), id);
            }
        }
        self.running.insert(
            id,
            Running {
                waiters: batch,
                started: now,
                span,
                _slot: slot,
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
        if self.shared.config.join_in_flight {
            for key in run.waiters.keys() {
                if self.in_flight_keys.get(key) == Some(&id) {
                    self.in_flight_keys.remove(key);
                }
            }
        }
        let stats = &self.shared.stats;
        Stats::record_duration(&stats.load_duration, run.started.elapsed());
        let _enter = run.span.enter();
        let keys = run.waiters.len();
        let settled = match outcome {
            Ok(outcome) => outcome.settle(stats, keys),
            // `run::run` catches the loader's panics, so the task only
            // fails when it is cancelled: the runtime is shutting down.
            Err(_) => {
                Stats::incr(&stats.failed_keys, keys as u64);
                Err(Error::Closed)
            }
        };
        match settled {
            Ok(mut values) => {
                let mut found = 0;
                for (key, waiters) in run.waiters {
                    let value = values.remove(&key);
                    found += usize::from(self.load.found(value.as_ref()));
                    self.held -= waiters.len();
                    reply_all(waiters, Ok(value));
                }
                run::record_found(stats, found, keys);
            }
            Err(failure) => {
                for waiters in run.waiters.into_values() {
                    self.held -= waiters.len();
                    reply_all(waiters, Err(failure.clone()));
                }
            }
        }
        // The slot is freed here, as `run` drops, after every waiter has
        // its answer.
    }

    fn publish_gauges(&self) {
        let stats = &self.shared.stats;
        stats.pending_keys.store(self.pending.len() as u64, Relaxed);
        stats
            .in_flight_batches
            .store(self.shared.running_loads() as u64, Relaxed);
    }
}

/// Sends `reply` to every waiter, cloning for all but the last.
fn reply_all<V: Clone>(waiters: Vec<Waiter<V>>, reply: Reply<V>) {
    let mut waiters = waiters.into_iter();
    let last = waiters.next_back();
    for w in waiters {
        let _ = w.tx.send(reply.clone()); // caller dropped its future; nothing to do
    }
    if let Some(w) = last {
        let _ = w.tx.send(reply); // caller dropped its future; nothing to do
    }
}
