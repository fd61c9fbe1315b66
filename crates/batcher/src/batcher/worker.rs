//! The worker task: the async shell over the [ledger](super::ledger).
//!
//! The ledger decides; the worker receives requests, keeps the timers,
//! runs each load in a task of its own (a [`JoinSet`]: a caller that goes
//! away, or a loader that panics, cannot take a load's other waiters down
//! with it, and the worker keeps receiving while loads run), and answers.
//! All batching state is owned by this one task, so none of it needs a
//! lock.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::pin::pin;
use std::sync::Arc;

use tokio::task::{self, JoinError, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::DropGuard;
use tracing::Instrument;

use super::alarm::Alarm;
use super::config::Config;
use super::intake;
use super::ledger::{self, Finished, JoinRule, LoadId, Request, Took};
use super::message::{Message, Waiter};
use super::observer::{ObserverSlot, Stamp};
use super::queue::Receiver;
use super::run::{self, LoadFn, Outcome};
use super::shared::{LoadSlot, Shared};
use crate::stats::Stats;

/// The task that serves a [`Batcher`](super::Batcher).
///
/// [`Batcher::new`](super::Batcher::new) and
/// [`BatcherBuilder::build`](super::BatcherBuilder::build) spawn it for you;
/// [`Batcher::pair`](super::Batcher::pair) and
/// [`BatcherBuilder::build_pair`](super::BatcherBuilder::build_pair) hand it
/// over so you can run it yourself.
///
/// Dropping a `Worker` without running it (or aborting its task) answers
/// every waiting caller with [`Error::Closed`](crate::Error::Closed): no
/// caller ever hangs.
#[must_use = "the batcher answers nothing until the worker runs"]
pub struct Worker<K, V, S = ()> {
    rx: Receiver<Message<S, K, V>>,
    load: LoadFn<S, K, V>,
    shared: Arc<Shared>,
    observer: ObserverSlot<S, K, V>,
    ledger: ledger::Ledger<S, K, Waiter<V>>,
    /// Requests just received, before the ledger takes them.
    inbox: VecDeque<Message<S, K, V>>,
    flush_timer: Alarm,
    expiry_timer: Alarm,
    tasks: JoinSet<Outcome<K, V>>,
    /// Each task's load, its span, and its slot.
    loads: HashMap<task::Id, (LoadId, tracing::Span, LoadSlot)>,
    /// The queue is closed, or every handle gone, and empty.
    rx_done: bool,
    _done: DropGuard,
}

impl<K, V, S> fmt::Debug for Worker<K, V, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = &self.shared.config.name;
        f.debug_struct("Worker")
            .field("name", name)
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
        let c = &shared.config;
        let (groups, join) = (load.scopes_per_load().min(c.scopes_per_load), join_rule(c));
        Self {
            ledger: ledger::Ledger::new(c.clone(), groups, join, Instant::now()),
            inbox: VecDeque::with_capacity(c.max_batch_size),
            flush_timer: Alarm::new(),
            expiry_timer: Alarm::new(),
            tasks: JoinSet::new(),
            loads: HashMap::new(),
            rx_done: false,
            _done: shared.done.clone().drop_guard(),
            rx,
            load,
            shared,
            observer,
        }
    }

    /// Runs the worker until shutdown, or until every [`Batcher`](super::Batcher)
    /// handle is dropped, and every queued request has been answered.
    pub async fn run(mut self) {
        self.shared.mark_worker_running();
        let mut shutdown = pin!(self.shared.shutdown.clone().cancelled_owned());
        let mut draining = false;
        loop {
            let limit = self.ledger.receive_limit();
            tokio::select! {
                // Load ends first: they free load slots and memory.
                biased;
                Some(done) = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => {
                    self.complete(done);
                }
                () = &mut shutdown, if !draining => {
                    draining = true;
                    self.ledger.drain();
                    // New sends fail with `Closed`; queued ones are still
                    // received and answered.
                    self.rx.close();
                }
                () = self.flush_timer.fired(), if self.flush_timer.at().is_some() => {
                    self.flush_timer.set(None);
                }
                () = self.expiry_timer.fired(), if self.expiry_timer.at().is_some() => self.expire(),
                // One call takes a whole burst, in one swap of buffers.
                n = self.rx.take(&mut self.inbox, limit), if !self.rx_done && limit > 0 => {
                    if n == 0 {
                        self.rx_done = true;
                        self.ledger.drain();
                    }
                    let observer = self.observer.get();
                    for msg in self.inbox.drain(..) {
                        intake::accept(&mut self.ledger, observer, &self.shared.stats, msg);
                    }
                }
                // Unreachable while the ledger's invariants hold; stopping
                // drops every sender, which answers `Closed`.
                else => break,
            }
            // One reading of the clock for both: a delay that ended between
            // two readings would be neither due to the first nor armed by
            // the second, and its batch would wait for the next event.
            let now = Instant::now();
            self.flush(now);
            self.flush_timer.set(self.ledger.flush_at(now));
            // Firing early only costs a sweep.
            self.expiry_timer.set_earlier(self.ledger.expiry_at());
            let (l, s) = (&self.ledger, &self.shared);
            let queued = || self.rx.len();
            s.stats.publish(
                l.pending_keys(),
                s.running_loads(),
                s.limit(),
                l.scopes(),
                queued,
            );
            if self.rx_done && self.ledger.is_idle() && self.tasks.is_empty() {
                break;
            }
        }
        tracing::debug!(batcher = %self.shared.config.name, "batcher worker stopped");
    }

    /// Starts loads while one is due and a slot is free (slots are shared
    /// with callers that load directly when idle).
    fn flush(&mut self, now: Instant) {
        loop {
            let (running, limit) = (self.shared.running_loads(), self.shared.limit());
            if !self.ledger.due(now, running, limit) {
                return;
            }
            let Some(slot) = LoadSlot::try_take(&self.shared) else {
                return;
            };
            let (id, groups, abandoned) = match self.ledger.start(now, running, limit) {
                Took::Load {
                    id,
                    groups,
                    abandoned,
                } => (id, groups, abandoned),
                Took::Nothing { abandoned } => {
                    Stats::incr(&self.shared.stats.abandoned, abandoned as u64);
                    continue;
                }
            };
            Stats::incr(&self.shared.stats.abandoned, abandoned as u64);
            let sizes: Vec<usize> = groups.iter().map(|g| g.keys.len()).collect();
            let label = |g: usize| self.load.label(&groups[g].scope).map(Into::into);
            let waits = self.ledger.waiters(id).map(|w| (w.asked_at(), &w.span));
            let span = run::begin(&self.shared, false, &sizes, label, waits, now);
            let observer = self.observer.get().cloned();
            let task = run::launch(&self.load, &self.shared, observer, groups);
            let task = self.tasks.spawn(task.instrument(span.clone())).id();
            self.loads.insert(task, (id, span, slot));
        }
    }

    fn complete(&mut self, done: Result<(task::Id, Outcome<K, V>), JoinError>) {
        // `run::contain` catches the loader's panics: a task fails only
        // when it is cancelled, as the runtime shuts down.
        let (task, outcome) = match done {
            Ok((task, outcome)) => (task, Some(outcome)),
            Err(e) => (e.id(), None),
        };
        let Some((id, span, slot)) = self.loads.remove(&task) else {
            return;
        };
        let ok = outcome.as_ref().is_some_and(|o| !o.is_whole_failure());
        let Some(Finished {
            groups,
            limit,
            load_times,
        }) = self.ledger.finished(id, Instant::now(), ok)
        else {
            return;
        };
        let shared = Arc::clone(&self.shared);
        shared.adopt(limit, load_times);
        let sizes: Vec<usize> = groups.iter().map(HashMap::len).collect();
        let settled = span.in_scope(|| run::settle(outcome, &shared.stats, &sizes));
        // The next due load goes out before this one's waiters are
        // answered: answering takes a while, and meanwhile the database
        // would wait. With no keys waiting the slot is kept until the
        // answers are out: freed, it would let a caller answered first find
        // the batcher idle and load alone, beside the worker's next load.
        let slot = (self.ledger.pending_keys() == 0).then_some(slot);
        if slot.is_none() {
            self.flush(Instant::now());
        }
        span.in_scope(|| run::answer(&self.load, &shared.stats, groups, settled));
        drop(slot);
    }

    /// Answers [`Error::Timeout`] to every waiter whose deadline passed.
    fn expire(&mut self) {
        self.expiry_timer.set(None);
        let expired = self.ledger.expire(Instant::now());
        run::time_out(&self.shared, expired);
    }
}

/// A cache's request joins a running load that started after every
/// invalidation its caller had seen; a plain one, if the settings say.
fn join_rule(config: &Config) -> JoinRule<Stamp> {
    let join_plain = config.join_in_flight;
    Box::new(move |request, load| match request {
        Some(stamp) => load.is_some_and(|s| s >= stamp),
        None => join_plain,
    })
}
