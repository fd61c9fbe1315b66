//! A seeded simulation of the ledger: random arrivals, scopes, tags,
//! cancellations, deadlines, load durations and failures, in virtual time
//! on a microsecond grid, driven as the worker drives it, with the
//! ledger's invariants (see the module docs of `ledger`) checked after
//! every step.
//!
//! Each test is a world (settings drawn from ranges of its own) run over
//! 1,000 seeds. A failure names its world and seed in one line that
//! replays it; `PGBATCH_SIM_SEEDS=1000000` runs more seeds (a night's run
//! is `PGBATCH_SIM_SEEDS=2000000 cargo test --release -p pgbatch --lib
//! ledger::sim`).
//!
//! # Tests that can fail
//!
//! Each of these past bugs, put back, fails these worlds (checked by hand
//! on 2026-11-29; the edit to make is given):
//!
//! - The lost flush: a batch whose delay ends just as the worker looks at
//!   it is neither sent nor timed (its callers waited for their deadline).
//!   In `Ledger::due`, compare `at + config.max_delay < now`: `fixed_delay`
//!   and `adaptive` fail with "keys wait with no load running and no timer
//!   set".
//! - A key behind a full batch judged by its first caller still waiting,
//!   not by when it was first asked for, so a later caller of it holds back
//!   the expiry of the keys behind it. In `Lane::sweep_later`, test
//!   `due(w.asked_at())` of the key's first waiter instead of its place in
//!   `order`: `backlog` fails with "not answered by its deadline".
//! - No allowance for requests stamped before the one queued ahead of them
//!   (a cache's misses are stamped before their lookups). In
//!   `Lane::sweep_later`, use `at` instead of `earliest(at)`: `cache` fails
//!   with "not answered by its deadline".
//! - A caller joining a key behind the batch not counted in the allowance.
//!   In `Lanes::add`, call `behind_at` only for a new key behind the batch:
//!   `cache` fails with "not answered by its deadline".
//! - The allowance measured against the key queued just before, not the
//!   latest caller before it. In `Lane::behind_at`, measure against the
//!   previous call's `at` instead of `latest`: `cache` fails with "not
//!   answered by its deadline".

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::tests::Asked;
use super::{Finished, JoinRule, Ledger, LoadId, Placed, Took};
use crate::batcher::config::{Concurrency, Config, FlushPolicy, Overflow};
use crate::batcher::limit;
use crate::batcher::policy;

/// A seeded stream of numbers (SplitMix64). Written here, not taken from a
/// crate, so that a seed replays the same run whatever version of a
/// random-number crate is built.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// A world: the ranges its settings and traffic are drawn from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum World {
    /// Eager flushing, a fixed limit, plain requests.
    Eager,
    /// Fixed delay: batches wait for their delay or a full batch.
    FixedDelay,
    /// Adaptive, with the automatic limit.
    Adaptive,
    /// Small batches and slow loads: keys pile up behind full batches, and
    /// expire there and in running loads.
    Backlog,
    /// A cache's requests: tagged, stamped before they are queued (out of
    /// order), joining running loads by the rule, some answered at once.
    Cache,
    /// Many scopes, loads that serve several of them at once.
    ManyScopes,
    /// `Overflow::Wait`: callers keep their own deadlines, the ledger
    /// takes only what it may hold.
    Waiting,
}

/// The settings and traffic of one run.
#[derive(Debug, Clone)]
struct Setup {
    config: Config,
    groups_per_load: usize,
    scopes: u64,
    keys: u64,
    arrivals: usize,
    /// Mean gap between arrivals, in microseconds.
    gap: u64,
    /// Load durations, in microseconds.
    load: (u64, u64),
    cancel: f64,
    tagged: f64,
    /// How much earlier than it is queued a tagged request may be stamped
    /// (in microseconds), and how many are.
    skew: u64,
    skewed: f64,
    answer_now: f64,
    group_fails: f64,
    whole_fails: f64,
    drain: bool,
}

impl World {
    fn setup(self, rng: &mut Rng) -> Setup {
        let us = Duration::from_micros;
        let mut config = Config {
            max_batch_size: rng.range(1, 8) as usize,
            spread_batch_size: rng.range(1, 6) as usize,
            max_delay: us(rng.range(1, 500)),
            concurrency: Concurrency::Fixed(rng.range(1, 4) as usize),
            channel_capacity: rng.range(4, 64) as usize,
            policy: FlushPolicy::Eager,
            overflow: Overflow::Reject,
            timeout: Some(us(rng.range(2_000, 20_000))),
            join_in_flight: rng.chance(0.3),
            ..Config::default()
        };
        let mut setup = Setup {
            groups_per_load: 1,
            scopes: rng.range(1, 3),
            keys: rng.range(1, 12),
            arrivals: rng.range(20, 300) as usize,
            gap: rng.range(5, 300),
            load: (rng.range(1, 200), rng.range(200, 3_000)),
            cancel: 0.05,
            tagged: 0.0,
            skew: 0,
            skewed: [0.02, 0.1, 0.3, 1.0][rng.range(0, 3) as usize],
            answer_now: 0.0,
            group_fails: 0.05,
            whole_fails: 0.03,
            drain: rng.chance(0.5),
            config: Config::default(),
        };
        match self {
            World::Eager => {}
            World::FixedDelay => config.policy = FlushPolicy::FixedDelay,
            World::Adaptive => {
                config.policy = FlushPolicy::Adaptive;
                config.concurrency = Concurrency::Auto {
                    max: rng.range(1, 6) as usize,
                };
            }
            World::Backlog => {
                config.max_batch_size = rng.range(1, 6) as usize;
                config.spread_batch_size = rng.range(1, 2) as usize;
                config.concurrency = Concurrency::Fixed(rng.range(1, 2) as usize);
                config.policy =
                    [FlushPolicy::Eager, FlushPolicy::FixedDelay][rng.range(0, 1) as usize];
                setup.keys = rng.range(4, 40);
                setup.gap = rng.range(5, 60);
                setup.load = (rng.range(500, 2_000), rng.range(2_000, 8_000));
            }
            World::Cache => {
                config.max_batch_size = rng.range(1, 4) as usize;
                config.concurrency = Concurrency::Fixed(rng.range(1, 2) as usize);
                setup.tagged = 0.8;
                setup.skew = rng.range(1, 1_000);
                setup.answer_now = 0.3;
                setup.keys = rng.range(2, 30);
                setup.gap = rng.range(5, 80);
                setup.load = (rng.range(100, 1_000), rng.range(1_000, 6_000));
            }
            World::ManyScopes => {
                setup.scopes = rng.range(2, 40);
                setup.groups_per_load = rng.range(2, 8) as usize;
                config.max_batch_size = rng.range(2, 16) as usize;
                config.policy = [
                    FlushPolicy::Eager,
                    FlushPolicy::FixedDelay,
                    FlushPolicy::Adaptive,
                ][rng.range(0, 2) as usize];
                setup.tagged = 0.3;
                setup.skew = rng.range(0, 300);
                setup.answer_now = 0.2;
            }
            World::Waiting => {
                config.overflow = Overflow::Wait;
                config.channel_capacity = rng.range(1, 16) as usize;
            }
        }
        setup.config = config;
        setup
    }
}

/// Where a caller is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    Queued,
    /// Waiting for a load.
    Pending,
    InLoad,
    Answered,
}

struct Caller {
    scope: u64,
    key: u64,
    asked: Asked,
    deadline: Option<Instant>,
    at: At,
}

/// A running load, as the simulation knows it.
struct Running {
    groups: Vec<(u64, Vec<u64>)>,
    ends_at: Instant,
}

struct Sim {
    rng: Rng,
    setup: Setup,
    ledger: Ledger<u64, u64, Asked>,
    rule: JoinRule<u64>,
    t0: Instant,
    now: Instant,
    callers: Vec<Caller>,
    queue: VecDeque<usize>,
    running: HashMap<LoadId, Running>,
    limit: usize,
    arrivals_left: usize,
    next_arrival: Instant,
    epochs: HashMap<(u64, u64), u64>,
    /// The running load a request of each `(scope, key)` may join, and its
    /// tag: the one with the latest tag, forgotten when it ends.
    joinable: HashMap<(u64, u64), (LoadId, Option<u64>)>,
    /// Loads started since each waiting scope last got one.
    passed_over: HashMap<u64, u64>,
    /// The most loads a waiting scope was passed over for.
    worst_wait: u64,
    flush_timer: Option<Instant>,
    expiry_timer: Option<Instant>,
    enforced: bool,
}

fn join_rule(join_plain: bool) -> JoinRule<u64> {
    Box::new(move |request, load: Option<u64>| match request {
        Some(tag) => load.is_some_and(|l| l >= tag),
        None => join_plain,
    })
}

impl Sim {
    fn new(world: World, seed: u64) -> Self {
        let mut rng = Rng(seed ^ 0x5eed_0f1e_d9e5);
        let setup = world.setup(&mut rng);
        let t0 = Instant::now();
        let c = &setup.config;
        let ledger = Ledger::new(
            c.clone(),
            setup.groups_per_load,
            join_rule(c.join_in_flight),
            t0,
        );
        let limit = match c.concurrency {
            Concurrency::Fixed(n) => n,
            Concurrency::Auto { max } => limit::start(policy::min_auto_limit(c), max),
        };
        Self {
            enforced: policy::worker_enforces_deadlines(c),
            rule: join_rule(c.join_in_flight),
            arrivals_left: setup.arrivals,
            next_arrival: t0,
            setup,
            rng,
            ledger,
            t0,
            now: t0,
            callers: Vec::new(),
            queue: VecDeque::new(),
            running: HashMap::new(),
            limit,
            epochs: HashMap::new(),
            joinable: HashMap::new(),
            passed_over: HashMap::new(),
            worst_wait: 0,
            flush_timer: None,
            expiry_timer: None,
        }
    }

    fn us(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_micros(self.rng.range(lo, hi))
    }

    fn run(&mut self) -> Result<(), String> {
        for step in 0.. {
            if step > 200_000 {
                return Err("did not finish in 200,000 steps".into());
            }
            let done = self.arrivals_left == 0 && self.queue.is_empty() && self.ledger.is_idle();
            if done {
                break;
            }
            let next = [
                (self.arrivals_left > 0).then_some(self.next_arrival),
                self.running.values().map(|r| r.ends_at).min(),
                self.flush_timer,
                self.expiry_timer,
                self.own_deadline(),
            ];
            let Some(next) = next.into_iter().flatten().min() else {
                return Err(format!(
                    "stuck: {} keys wait, {} queued, nothing will wake the worker",
                    self.ledger.pending_keys(),
                    self.queue.len()
                ));
            };
            self.now = next.max(self.now);
            self.events()?;
            self.react()?;
            self.check()?;
        }
        if let Some(c) = self.callers.iter().find(|c| self.waits(c)) {
            return Err(format!("caller of key {} never answered", c.key));
        }
        if self.ledger.held() != 0 || self.ledger.scopes() != 0 {
            return Err(format!(
                "idle, but {} waiters held and {} lanes kept",
                self.ledger.held(),
                self.ledger.scopes()
            ));
        }
        Ok(())
    }

    /// The earliest deadline a caller keeps itself (the worker does not
    /// enforce them): it gives up then.
    fn own_deadline(&self) -> Option<Instant> {
        if self.enforced {
            return None;
        }
        self.callers
            .iter()
            .filter(|c| self.waits(c))
            .filter_map(|c| c.deadline)
            .min()
    }

    /// Whether a caller still waits for an answer.
    fn waits(&self, c: &Caller) -> bool {
        c.at != At::Answered && !c.asked.gone.get()
    }

    fn answer(&mut self, id: u64, why: &str) -> Result<(), String> {
        let c = &mut self.callers[id as usize];
        if c.at == At::Answered {
            return Err(format!("caller {id} answered twice (now {why})"));
        }
        c.at = At::Answered;
        Ok(())
    }

    /// Everything due at `now`: load ends, timers, callers giving up,
    /// cancellations, an arrival.
    fn events(&mut self) -> Result<(), String> {
        let now = self.now;
        let ended: Vec<LoadId> = self
            .running
            .iter()
            .filter(|(_, r)| r.ends_at <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in ended {
            self.end(id)?;
        }
        if self.flush_timer.is_some_and(|t| t <= now) {
            self.flush_timer = None;
        }
        if self.expiry_timer.is_some_and(|t| t <= now) {
            self.expiry_timer = None;
            for (w, _) in self.ledger.expire(now) {
                let deadline = self.callers[w.id as usize].deadline;
                if deadline.is_none_or(|d| d > now) {
                    return Err(format!("caller {} expired before its deadline", w.id));
                }
                self.answer(w.id, "expired")?;
            }
        }
        if !self.enforced {
            for c in &mut self.callers {
                if c.at != At::Answered && c.deadline.is_some_and(|d| d <= now) {
                    c.asked.gone.set(true);
                }
            }
        }
        if self.rng.chance(self.setup.cancel) {
            let waiting: Vec<usize> = (0..self.callers.len())
                .filter(|&i| self.waits(&self.callers[i]))
                .collect();
            if !waiting.is_empty() {
                let i = waiting[self.rng.range(0, waiting.len() as u64 - 1) as usize];
                self.callers[i].asked.gone.set(true);
            }
        }
        if self.rng.chance(0.05) {
            let scope = self.rng.range(0, self.setup.scopes - 1);
            let key = (scope, self.rng.range(0, self.setup.keys - 1));
            *self.epochs.entry(key).or_default() += 1;
        }
        // A scope that stopped waiting (its callers answered or gone)
        // starts counting again when it waits again.
        let waiting = self.waiting_scopes();
        self.passed_over.retain(|s, _| waiting.contains(s));
        if self.arrivals_left > 0 && self.next_arrival <= now {
            self.arrive();
            if self.arrivals_left == 0 && self.setup.drain {
                // Shut down: whatever waits is due at once.
                self.ledger.drain();
            }
        }
        Ok(())
    }

    fn arrive(&mut self) {
        self.arrivals_left -= 1;
        let gap = self.setup.gap;
        self.next_arrival = self.now + self.us(0, 2 * gap);
        let scope = self.rng.range(0, self.setup.scopes - 1);
        let key = self.rng.range(0, self.setup.keys - 1);
        let mut asked = Asked::at(self.now);
        asked.id = self.callers.len() as u64;
        if self.rng.chance(self.setup.tagged) {
            asked.tag = Some(*self.epochs.entry((scope, key)).or_default());
            let skew = match self.rng.chance(self.setup.skewed) {
                true => self.us(0, self.setup.skew),
                false => Duration::ZERO,
            };
            asked.at = self.now.checked_sub(skew).unwrap_or(self.now).max(self.t0);
        }
        let deadline = self.setup.config.deadline(asked.at);
        let full = self.queue.len() >= self.setup.config.channel_capacity;
        let refused = full && self.setup.config.overflow == Overflow::Reject;
        self.callers.push(Caller {
            scope,
            key,
            asked,
            deadline,
            at: if refused { At::Answered } else { At::Queued },
        });
        if !refused {
            self.queue.push_back(self.callers.len() - 1);
        }
    }

    fn end(&mut self, id: LoadId) -> Result<(), String> {
        let load = self.running.remove(&id).expect("a running load");
        self.joinable.retain(|_, (l, _)| *l != id);
        let ok = !self.rng.chance(self.setup.whole_fails);
        let Some(Finished { groups, limit, .. }) = self.ledger.finished(id, self.now, ok) else {
            return Err("a running load the ledger does not know".into());
        };
        if let Some(limit) = limit {
            self.limit = limit;
        }
        if groups.len() != load.groups.len() {
            return Err("a load ended with another number of groups".into());
        }
        for (waiters, (scope, keys)) in groups.into_iter().zip(&load.groups) {
            let _failed = self.rng.chance(self.setup.group_fails);
            for (key, waiters) in waiters {
                if !keys.contains(&key) {
                    return Err(format!("key {key} answered by a load that did not load it"));
                }
                for w in waiters {
                    let c = &self.callers[w.id as usize];
                    if (c.scope, c.key) != (*scope, key) {
                        return Err(format!(
                            "caller {} of scope {} key {} answered from scope {scope} key {key}",
                            w.id, c.scope, c.key
                        ));
                    }
                    self.answer(w.id, "loaded")?;
                }
            }
        }
        Ok(())
    }

    /// What the worker does after any event: receive what it may, start
    /// what is due, set its timers.
    fn react(&mut self) -> Result<(), String> {
        loop {
            self.flush()?;
            let limit = self.ledger.receive_limit();
            if limit == 0 || self.queue.is_empty() {
                break;
            }
            for _ in 0..limit.min(self.queue.len()) {
                let i = self.queue.pop_front().expect("queued");
                self.receive(i)?;
            }
        }
        self.flush_timer = self.ledger.flush_at(self.now);
        self.expiry_timer = self.ledger.expiry_at();
        Ok(())
    }

    fn receive(&mut self, i: usize) -> Result<(), String> {
        let c = &self.callers[i];
        let (scope, key, asked) = (c.scope, c.key, c.asked.clone());
        let mut placed = self.ledger.request(scope, key, asked);
        if let Placed::Unheld(scope, key, w) = placed {
            if w.tag.is_none() {
                return Err("an untagged request handed back".into());
            }
            if self.rng.chance(self.setup.answer_now) {
                return self.answer(i as u64, "at once");
            }
            placed = self.ledger.queue(scope, key, w);
        }
        let c = &mut self.callers[i];
        c.at = match placed {
            Placed::Running => At::InLoad,
            Placed::Joined { .. } | Placed::New => At::Pending,
            Placed::Gone | Placed::Refused(_) => At::Answered,
            Placed::Unheld(..) => return Err("handed back twice".into()),
        };
        Ok(())
    }

    fn flush(&mut self) -> Result<(), String> {
        while self.ledger.due(self.now, self.ledger.loads(), self.limit) {
            if self.ledger.loads() >= self.limit {
                break; // no slot free
            }
            // The cap the ledger is to keep, from what it holds before.
            let cap = policy::load_cap(
                &self.setup.config,
                self.ledger.loads(),
                self.limit,
                self.ledger.pending_keys(),
            );
            let Took::Load { id, groups, .. } =
                self.ledger.start(self.now, self.ledger.loads(), self.limit)
            else {
                continue;
            };
            let waiting = self.waiting_scopes();
            let keys: usize = groups.iter().map(|g| g.keys.len()).sum();
            if keys > self.setup.config.max_batch_size {
                return Err(format!("a load of {keys} keys, past the batch"));
            }
            if keys > cap {
                return Err(format!("a load of {keys} keys, past its cap of {cap}"));
            }
            if groups.len() > self.setup.groups_per_load {
                return Err(format!("a load of {} scopes", groups.len()));
            }
            let mut loaded = Vec::new();
            for g in &groups {
                if loaded.iter().any(|(s, _)| *s == g.scope) {
                    return Err(format!("scope {} twice in one load", g.scope));
                }
                for key in &g.keys {
                    let latest = g.tagged.iter().find(|(k, _)| k == key).map(|(_, t)| *t);
                    self.check_no_second_load(g.scope, *key)?;
                    let e = self.joinable.entry((g.scope, *key)).or_insert((id, latest));
                    if e.1 <= latest {
                        *e = (id, latest);
                    }
                }
                loaded.push((g.scope, g.keys.clone()));
            }
            for c in &mut self.callers {
                let taken = loaded
                    .iter()
                    .any(|(s, keys)| *s == c.scope && keys.contains(&c.key));
                if c.at == At::Pending && taken {
                    c.at = At::InLoad;
                }
            }
            for scope in waiting {
                let n = self.passed_over.entry(scope).or_default();
                if loaded.iter().any(|(s, _)| *s == scope) {
                    *n = 0;
                } else {
                    *n += 1;
                    self.worst_wait = self.worst_wait.max(*n);
                }
            }
            let (lo, hi) = self.setup.load;
            let ends_at = self.now + self.us(lo, hi);
            self.running.insert(
                id,
                Running {
                    groups: loaded,
                    ends_at,
                },
            );
        }
        Ok(())
    }

    /// A key is loaded while another load of it (in its scope) runs only
    /// if one of its callers could not join that load.
    fn check_no_second_load(&self, scope: u64, key: u64) -> Result<(), String> {
        let Some(&(_, running)) = self.joinable.get(&(scope, key)) else {
            return Ok(());
        };
        let callers = self.callers.iter().filter(|c| {
            (c.scope, c.key) == (scope, key) && c.at == At::Pending && !c.asked.gone.get()
        });
        let mut could_not_join = false;
        for c in callers {
            could_not_join |= !(self.rule)(c.asked.tag, running);
        }
        if could_not_join {
            Ok(())
        } else {
            Err(format!(
                "scope {scope} key {key} loaded again while a load its callers could join runs"
            ))
        }
    }

    /// Scopes with a caller waiting for a load.
    fn waiting_scopes(&self) -> Vec<u64> {
        let mut scopes: Vec<u64> = self
            .callers
            .iter()
            .filter(|c| c.at == At::Pending && !c.asked.gone.get())
            .map(|c| c.scope)
            .collect();
        scopes.sort_unstable();
        scopes.dedup();
        scopes
    }

    /// The invariants that hold between events.
    fn check(&mut self) -> Result<(), String> {
        let held_limit = policy::held_limit(&self.setup.config);
        if self.ledger.held() > held_limit {
            return Err(format!(
                "{} waiters held, beyond {held_limit}",
                self.ledger.held()
            ));
        }
        if self.enforced {
            let late = self.callers.iter().position(|c| {
                self.waits(c) && c.at != At::Queued && c.deadline.is_some_and(|d| d <= self.now)
            });
            if let Some(i) = late {
                return Err(format!(
                    "caller {i} not answered by its deadline ({:?} late)",
                    self.now - self.callers[i].deadline.unwrap()
                ));
            }
        }
        if self.ledger.pending_keys() > 0 && self.ledger.loads() == 0 && self.flush_timer.is_none()
        {
            return Err("keys wait with no load running and no timer set".into());
        }
        // Every other scope gets at most one load first.
        let bound = self.setup.scopes - 1;
        if self.worst_wait > bound {
            return Err(format!(
                "a waiting scope passed over for {} loads (bound {bound})",
                self.worst_wait
            ));
        }
        Ok(())
    }
}

/// Runs `world` over the seeds the environment asks for (1,000 by
/// default, or the one `PGBATCH_SIM_SEED` names), panicking with a line
/// that replays the first failure.
fn run_world(world: World, name: &str) {
    let one: Option<u64> = std::env::var("PGBATCH_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok());
    let seeds: u64 = std::env::var("PGBATCH_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000);
    let seeds: Box<dyn Iterator<Item = u64>> = match one {
        Some(seed) => Box::new(std::iter::once(seed)),
        None => Box::new(0..seeds),
    };
    for seed in seeds {
        let mut sim = Sim::new(world, seed);
        if let Err(e) = sim.run() {
            panic!(
                "{name}, seed {seed}: {e} at {:?}; replay: PGBATCH_SIM_SEED={seed} cargo test -p pgbatch --lib ledger::sim::{name}",
                sim.now - sim.t0
            );
        }
    }
}

#[test]
fn eager() {
    run_world(World::Eager, "eager");
}

#[test]
fn fixed_delay() {
    run_world(World::FixedDelay, "fixed_delay");
}

#[test]
fn adaptive() {
    run_world(World::Adaptive, "adaptive");
}

#[test]
fn backlog() {
    run_world(World::Backlog, "backlog");
}

#[test]
fn cache() {
    run_world(World::Cache, "cache");
}

#[test]
fn many_scopes() {
    run_world(World::ManyScopes, "many_scopes");
}

#[test]
fn waiting() {
    run_world(World::Waiting, "waiting");
}
