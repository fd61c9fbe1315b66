//! The worker task: receives requests, forms batches, runs loads, answers.
//!
//! All batching state is owned by this one task, so none of it needs a lock.
//! Loads run in their own tasks (a [`JoinSet`]): a caller that goes away, or a
//! loader that panics, cannot take a batch's other waiters down with it, and
//! the worker keeps receiving while loads run.

use std::any::Any;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::mem;
use std::pin::{pin, Pin};
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::{self, JoinError, JoinSet};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::DropGuard;
use tracing::Instrument;

use super::builder::{Config, FlushPolicy};
use super::handle::Shared;
use super::loader::Loader;
use super::message::{Message, Reply, Waiter};
use crate::error::SharedError;
use crate::stats::Stats;
use crate::Error;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
/// The loader with its types erased, so `Worker` and `Batcher` need no
/// loader type parameter.
pub(crate) type LoadFn<K, V> =
    Arc<dyn Fn(Vec<K>) -> BoxFuture<Result<HashMap<K, V>, SharedError>> + Send + Sync>;

/// Erases `loader`'s type. The loader is called inside the returned future,
/// so even a panic in its synchronous part happens where the future is
/// polled (the load task, or a direct caller that catches it), not in the
/// worker.
pub(crate) fn load_fn<K, V, L>(loader: L) -> LoadFn<K, V>
where
    K: Send + 'static,
    V: Send + 'static,
    L: Loader<K, V>,
{
    let loader = Arc::new(loader);
    Arc::new(move |keys| {
        let loader = Arc::clone(&loader);
        Box::pin(async move {
            loader
                .load(keys)
                .await
                .map_err(|e| Arc::new(e) as SharedError)
        })
    })
}

/// Takes one of `max` load slots counted in `running`, if one is free.
pub(crate) fn try_take_slot(running: &AtomicUsize, max: usize) -> bool {
    running
        .fetch_update(SeqCst, SeqCst, |n| (n < max).then_some(n + 1))
        .is_ok()
}

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
        self.shared.worker_running.store(true, SeqCst);
        let mut state = State::new(self);
        let mut shutdown = pin!(state.shared.shutdown.clone().cancelled_owned());
        loop {
            let can_recv = !state.rx_done
                && state.pending.len() < state.config().max_batch_size
                && state.held < state.held_limit;
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

/// How a load task ended, when it did not panic.
enum Outcome<K, V> {
    Loaded(HashMap<K, V>),
    Failed(SharedError),
    TimedOut(Duration),
}

/// A batch whose load is running.
struct Running<K, V> {
    waiters: HashMap<K, Vec<Waiter<V>>>,
    started: Instant,
    span: tracing::Span,
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
    /// Waiters held in `pending` and `running`. Duplicates and joins add
    /// waiters without adding keys, so this bounds memory where the key
    /// count alone would not.
    held: usize,
    held_limit: usize,
    _done: DropGuard,
}

impl<K, V> State<K, V>
where
    K: Clone + Eq + Hash + Send + 'static,
    V: Clone + Send + 'static,
{
    fn new(worker: Worker<K, V>) -> Self {
        let c = &worker.shared.config;
        let held_limit = c
            .max_batch_size
            .saturating_mul(c.max_concurrent_batches.saturating_add(1))
            .saturating_add(c.channel_capacity);
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
            held_limit,
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
        while self.pending.len() < self.config().max_batch_size && self.held < self.held_limit {
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
                if first_key && self.shared.config.policy != FlushPolicy::Eager {
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
        let c = self.config();
        // Slots are shared with callers that load directly when idle.
        let running = self.shared.running.load(SeqCst);
        let at_once = match c.policy {
            FlushPolicy::Eager => true,
            FlushPolicy::FixedDelay => false,
            // Lightly loaded: no delay. Busy: let the batch fill.
            FlushPolicy::Adaptive => running < c.max_concurrent_batches.div_ceil(2),
        };
        let due = !self.pending.is_empty()
            && (at_once
                || self.pending.len() >= c.max_batch_size
                || self.deadline_passed
                || self.draining);
        if due && try_take_slot(&self.shared.running, c.max_concurrent_batches) {
            self.dispatch();
        }
    }

    fn dispatch(&mut self) {
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
            self.shared.running.fetch_sub(1, SeqCst); // the slot goes unused
            return;
        }

        let span = tracing::debug_span!(
            "batch",
            batcher = %self.shared.config.name,
            size = batch.len(),
        );
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
        let load = (self.load)(keys);
        let load_timeout = self.shared.config.load_timeout;
        let task = async move {
            let result = match load_timeout {
                Some(t) => match tokio::time::timeout(t, load).await {
                    Ok(r) => r,
                    Err(_) => return Outcome::TimedOut(t),
                },
                None => load.await,
            };
            match result {
                Ok(values) => Outcome::Loaded(values),
                Err(e) => Outcome::Failed(e),
            }
        };
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
            },
        );
    }

    fn complete(&mut self, done: Result<(task::Id, Outcome<K, V>), JoinError>) {
        let (id, outcome) = match done {
            Ok((id, outcome)) => (id, Ok(outcome)),
            Err(e) => (e.id(), Err(e)),
        };
        self.shared.running.fetch_sub(1, SeqCst);
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
        let failure = match outcome {
            Ok(Outcome::Loaded(mut values)) => {
                let mut found = 0;
                for (key, waiters) in run.waiters {
                    let value = values.remove(&key);
                    found += usize::from(value.is_some());
                    self.held -= waiters.len();
                    reply_all(waiters, Ok(value));
                }
                Stats::incr(&stats.found, found as u64);
                Stats::incr(&stats.not_found, (keys - found) as u64);
                tracing::trace!(found, not_found = keys - found, "batch loaded");
                return;
            }
            Ok(Outcome::Failed(e)) => {
                Stats::incr(&stats.failed_batches, 1);
                tracing::warn!(error = %e, keys, "batch load failed");
                Error::Load(e)
            }
            Ok(Outcome::TimedOut(t)) => {
                Stats::incr(&stats.timed_out_batches, 1);
                tracing::warn!(timeout = ?t, keys, "batch load timed out");
                Error::LoadTimeout(t)
            }
            Err(e) if e.is_panic() => {
                Stats::incr(&stats.panicked_batches, 1);
                let msg = panic_message(e.into_panic());
                tracing::error!(panic = %msg, keys, "batch loader panicked");
                Error::LoaderPanicked(msg.into())
            }
            // Cancelled: only when the runtime shuts down under us.
            Err(_) => Error::Closed,
        };
        Stats::incr(&stats.failed_keys, keys as u64);
        for waiters in run.waiters.into_values() {
            self.held -= waiters.len();
            reply_all(waiters, Err(failure.clone()));
        }
    }

    fn publish_gauges(&self) {
        let stats = &self.shared.stats;
        stats.pending_keys.store(self.pending.len() as u64, Relaxed);
        stats
            .in_flight_batches
            .store(self.shared.running.load(Relaxed) as u64, Relaxed);
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

pub(crate) fn panic_message(payload: Box<dyn Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
