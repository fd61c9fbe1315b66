//! A simulated database for the limit's tests: a closed loop of callers
//! over an eager batcher whose loads run on a fixed number of workers
//! (a CPU-bound database on a small machine), each load costing a fixed
//! part plus a part per key, so bigger batches cost less per key, behind a
//! round trip. Time is virtual and the noise seeded, so a 60 s run takes
//! a fraction of a second and every run is the same.
//!
//! Loads reach the database in the order they were sent (the round trip is
//! the same for all), so each one's worker, and its end, is known when it
//! is sent: the simulation is a heap of ends.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::AutoLimit;

/// The simulated world.
#[derive(Debug, Clone, Copy)]
pub(super) struct World {
    /// Callers, each asking again as soon as it is answered.
    pub(super) callers: usize,
    /// Keys per load at most.
    pub(super) max_batch: usize,
    /// Loads the database runs at once; more wait for a worker.
    pub(super) workers: usize,
    /// Added to every load, outside the workers: the network and the
    /// client.
    pub(super) round_trip: Duration,
    /// A load's work on a worker...
    pub(super) per_load: Duration,
    /// ...plus this per key.
    pub(super) per_key: Duration,
    /// Each load's work varies by up to this fraction either way...
    pub(super) load_noise: f64,
    /// ...and the machine's speed by up to this fraction, changing every
    /// 100 ms: noise every limit sees alike, as a shared machine's is.
    pub(super) machine_noise: f64,
}

impl World {
    /// Two workers close to the client: where the database's CPU, not
    /// the round trip, bounds throughput.
    pub(super) fn cpu_bound() -> Self {
        Self {
            callers: 300,
            max_batch: 64,
            workers: 2,
            round_trip: Duration::from_micros(200),
            per_load: Duration::from_micros(300),
            per_key: Duration::from_micros(15),
            load_noise: 0.3,
            machine_noise: 0.15,
        }
    }

    /// The work of a load of `keys` keys, before noise.
    fn work(&self, keys: usize) -> Duration {
        self.per_load + self.per_key * u32::try_from(keys).unwrap_or(u32::MAX)
    }
}

/// How the limit is chosen in a run.
pub(super) enum Limit<'a> {
    Fixed(usize),
    Auto(&'a mut AutoLimit),
}

/// What a run measured.
#[derive(Debug, Default)]
pub(super) struct Measured {
    /// Callers answered per second.
    pub(super) per_sec: f64,
    /// The limit in force, sampled every 10 ms.
    pub(super) limits: Vec<usize>,
    /// Mean keys per load.
    pub(super) mean_batch: f64,
}

/// A running simulation: the world may change between runs, the callers
/// and the loads in flight carry over.
pub(super) struct Sim {
    now: Instant,
    /// When each waiting caller asked.
    waiting: VecDeque<Instant>,
    /// What happens next, by time: a caller asks, or a load ends.
    events: BinaryHeap<Reverse<(Instant, Event)>>,
    running: usize,
    /// Each load's callers' asking times; slots are reused.
    batches: Vec<Vec<Instant>>,
    free_batches: Vec<usize>,
    /// When each worker is next free.
    workers: Vec<Instant>,
    /// When the client is next free: it handles answered callers one at
    /// a time, so a batch's callers ask again one after another.
    client: Instant,
    rng: u64,
    /// The machine's speed factor, and when it changes next.
    speed: (f64, Instant),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Asks,
    /// A load ends: when it was sent, and its batch's slot.
    Ends(Instant, usize),
}

/// The client's time per answered caller (waking it, its next request).
const PER_CALLER: Duration = Duration::from_micros(2);

impl Sim {
    pub(super) fn new(world: &World, seed: u64) -> Self {
        let now = Instant::now();
        Self {
            now,
            waiting: std::iter::repeat_n(now, world.callers).collect(),
            events: BinaryHeap::new(),
            running: 0,
            batches: Vec::new(),
            free_batches: Vec::new(),
            workers: vec![now; world.workers],
            client: now,
            rng: seed | 1,
            speed: (1.0, now),
        }
    }

    pub(super) fn now(&self) -> Instant {
        self.now
    }

    /// A factor in `1 ± spread`.
    fn noise(&mut self, spread: f64) -> f64 {
        noise(&mut self.rng, spread)
    }

    /// Sends a load of what waits (up to the batch cap).
    fn send(&mut self, world: &World) {
        let n = self.waiting.len().min(world.max_batch);
        let slot = self.free_batches.pop().unwrap_or_else(|| {
            self.batches.push(Vec::new());
            self.batches.len() - 1
        });
        let mut batch = std::mem::take(&mut self.batches[slot]);
        batch.clear();
        batch.extend(self.waiting.drain(..n));
        self.batches[slot] = batch;
        if self.now >= self.speed.1 {
            self.speed = (
                self.noise(world.machine_noise),
                self.now + Duration::from_millis(100),
            );
        }
        let factor = self.noise(world.load_noise) * self.speed.0;
        let work = world.work(n).mul_f64(factor);
        let arrives = self.now + world.round_trip / 2;
        let (w, free) = self
            .workers
            .iter()
            .copied()
            .enumerate()
            .min_by_key(|&(_, at)| at)
            .expect("at least one worker");
        let done = arrives.max(free) + work;
        self.workers[w] = done;
        let end = done + world.round_trip / 2;
        self.running += 1;
        self.events
            .push(Reverse((end, Event::Ends(self.now, slot))));
    }

    /// Runs `world` for `length` with `limit`.
    pub(super) fn run(
        &mut self,
        world: &World,
        mut limit: Limit<'_>,
        length: Duration,
    ) -> Measured {
        let until = self.now + length;
        let (mut served, mut loads) = (0u64, 0u64);
        let mut limits = Vec::new();
        let mut next_sample = self.now;
        if self.workers.len() != world.workers {
            self.workers.resize(world.workers, self.now);
        }
        loop {
            let current = match &limit {
                Limit::Fixed(n) => *n,
                Limit::Auto(auto) => auto.limit(),
            };
            // The eager policy: a batch goes whenever a slot is free.
            while self.running < current && !self.waiting.is_empty() {
                self.send(world);
            }
            if let Limit::Auto(auto) = &mut limit {
                if !self.waiting.is_empty() {
                    auto.held_back();
                }
            }
            let Some(Reverse((at, event))) = self.events.pop() else {
                break;
            };
            if at > until {
                self.events.push(Reverse((at, event)));
                self.now = until;
                break;
            }
            self.now = at;
            while next_sample <= at {
                limits.push(current);
                next_sample += Duration::from_millis(10);
            }
            let Event::Ends(sent, slot) = event else {
                self.waiting.push_back(at);
                continue;
            };
            self.running -= 1;
            let batch = std::mem::take(&mut self.batches[slot]);
            let response: Duration = batch.iter().map(|&asked| at - asked).sum();
            served += batch.len() as u64;
            loads += 1;
            if let Limit::Auto(auto) = &mut limit {
                auto.completed(batch.len(), batch.len(), response, at - sent, at);
            }
            self.client = self.client.max(at);
            for _ in 0..batch.len() {
                self.client += PER_CALLER;
                self.events.push(Reverse((self.client, Event::Asks)));
            }
            self.batches[slot] = batch;
            self.free_batches.push(slot);
        }
        Measured {
            per_sec: served as f64 / length.as_secs_f64(),
            limits,
            mean_batch: if loads == 0 {
                0.0
            } else {
                served as f64 / loads as f64
            },
        }
    }
}

/// A deterministic factor in `1 ± spread`, from the xorshift `state`.
pub(super) fn noise(state: &mut u64, spread: f64) -> f64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    let unit = (*state >> 11) as f64 / (1u64 << 53) as f64;
    1.0 + spread * (2.0 * unit - 1.0)
}

/// Each fixed limit of `1..=max` in `world` for `length`: callers answered
/// per second, by limit (index `limit - 1`).
pub(super) fn sweep(world: &World, max: usize, length: Duration) -> Vec<f64> {
    (1..=max)
        .map(|c| {
            let mut sim = Sim::new(world, 7);
            // A warm-up, then the measured run.
            sim.run(world, Limit::Fixed(c), Duration::from_millis(200));
            sim.run(world, Limit::Fixed(c), length).per_sec
        })
        .collect()
}

/// The knee of a sweep: the fewest loads within `within` of the best.
pub(super) fn knee(sweep: &[f64], within: f64) -> usize {
    let best = sweep.iter().copied().fold(0.0, f64::max);
    sweep
        .iter()
        .position(|&x| x >= best * (1.0 - within))
        .map_or(1, |i| i + 1)
}

/// Prints, for a few worlds, each fixed limit's throughput over the best
/// and where the automatic limit went: what to look at when changing the
/// search (`cargo test -p pgbatch --lib explore -- --ignored --nocapture`).
#[test]
#[ignore = "prints a report; asserts nothing"]
fn explore() {
    for (name, world) in [
        ("cpu", World::cpu_bound()),
        (
            "rtt2",
            World {
                round_trip: Duration::from_millis(2),
                ..World::cpu_bound()
            },
        ),
        (
            "rtt2slow",
            World {
                round_trip: Duration::from_millis(2),
                per_load: Duration::from_micros(1200),
                per_key: Duration::from_micros(60),
                ..World::cpu_bound()
            },
        ),
        (
            "rtt5",
            World {
                round_trip: Duration::from_millis(5),
                ..World::cpu_bound()
            },
        ),
    ] {
        let fixed = sweep(&world, 16, Duration::from_secs(2));
        let norm: Vec<String> = fixed
            .iter()
            .map(|x| format!("{:.2}", x / fixed.iter().copied().fold(0.0, f64::max)))
            .collect();
        let mut sim = Sim::new(&world, 11);
        let mut auto = AutoLimit::new(1, 16, sim.now()).with_batch_cap(world.max_batch);
        sim.run(&world, Limit::Auto(&mut auto), Duration::from_secs(1));
        let m = sim.run(&world, Limit::Auto(&mut auto), Duration::from_secs(10));
        let mut hist = std::collections::BTreeMap::new();
        for l in &m.limits {
            *hist.entry(*l).or_insert(0) += 1;
        }
        eprintln!(
            "{name}: fixed {norm:?} best {:.0}; auto {:.0} ({:.3}) batch {:.1} limits {hist:?}",
            fixed.iter().copied().fold(0.0, f64::max),
            m.per_sec,
            m.per_sec / fixed.iter().copied().fold(0.0, f64::max),
            m.mean_batch
        );
    }
}
