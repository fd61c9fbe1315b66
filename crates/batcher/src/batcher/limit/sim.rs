//! A simulated database for the limit's tests: a closed loop of callers
//! over an eager batcher whose loads run on a fixed number of workers
//! (a CPU-bound database on a small machine), each load costing a fixed
//! part plus a part per key, so bigger batches cost less per key, behind a
//! round trip. A world may add a competing load on the same workers, or a
//! cold start. Time is virtual and the noise seeded, so a minute runs in
//! milliseconds and every run is the same.
//!
//! Loads reach the database in the order they were sent (the round trip is
//! the same for all), so each one's worker, and its end, is known when it
//! is sent: the simulation is a heap of ends. Callers are kept in runs
//! (the client answers a load's callers one after another, a fixed time
//! apart), so a step costs the same however many callers a load serves.

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
    /// Another client's statements on the same workers, one after another
    /// on each of `jobs` connections, each taking `work`; on for a
    /// `period`, then off for one, and so on.
    pub(super) competing: Option<Competing>,
    /// For this long after the simulation starts the database works
    /// slower, by a factor falling from [`World::cold_factor`] to 1: a cold
    /// cache warming.
    pub(super) cold_for: Duration,
    /// See [`World::cold_for`].
    pub(super) cold_factor: f64,
}

/// A competing load (see [`World::competing`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Competing {
    pub(super) jobs: usize,
    pub(super) work: Duration,
    pub(super) period: Duration,
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
            competing: None,
            cold_for: Duration::ZERO,
            cold_factor: 1.0,
        }
    }

    /// The worlds the limit is judged in, by name: where the CPU bounds
    /// throughput, across round trips of 2 and 5 ms, a slow database
    /// across 2 ms, a competing load that comes and goes every 2 s, and a
    /// database three times slower at first, warming over 3 s.
    pub(super) fn all() -> [(&'static str, World); 6] {
        let cpu = Self::cpu_bound();
        let rtt = |ms| World {
            round_trip: Duration::from_millis(ms),
            ..cpu
        };
        [
            ("cpu", cpu),
            ("rtt2", rtt(2)),
            (
                "rtt2slow",
                World {
                    per_load: Duration::from_micros(1200),
                    per_key: Duration::from_micros(60),
                    ..rtt(2)
                },
            ),
            ("rtt5", rtt(5)),
            (
                "competing",
                World {
                    competing: Some(Competing {
                        jobs: 1,
                        work: Duration::from_millis(2),
                        period: Duration::from_secs(2),
                    }),
                    ..cpu
                },
            ),
            (
                "cold",
                World {
                    cold_for: Duration::from_secs(3),
                    cold_factor: 3.0,
                    ..cpu
                },
            ),
        ]
    }

    /// The work of a load of `keys` keys, before noise.
    fn work(&self, keys: u64) -> f64 {
        nanos(self.per_load) + nanos(self.per_key) * keys as f64
    }
}

fn nanos(d: Duration) -> f64 {
    d.as_nanos() as f64
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
}

/// Callers who ask at `first`, `first + step`, ... (times in nanoseconds
/// since the simulation started).
#[derive(Debug, Clone, Copy)]
struct Run {
    first: u64,
    step: u64,
    count: u64,
}

/// A load in flight: its callers, and when it was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Load {
    sent: u64,
    callers: u64,
    /// Their asking times, added up.
    asked: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// One of ours ends.
    Ends(Load),
    /// A competing statement ends; the next one starts.
    Competes,
}

/// The client's time per answered caller (waking it, its next request).
const PER_CALLER: u64 = 2_000;
/// How often the machine's speed changes.
const SPEED_EVERY: u64 = 100_000_000;

/// A running simulation: the world may change between runs, the callers
/// and the loads in flight carry over.
pub(super) struct Sim {
    start: Instant,
    now: u64,
    /// Every caller not in a load, by asking time; those at or before
    /// `now` wait.
    asks: VecDeque<Run>,
    /// What happens next, by time: a load ends.
    events: BinaryHeap<Reverse<(u64, Event)>>,
    running: usize,
    /// When each worker is next free.
    workers: Vec<u64>,
    /// When the client is next free: it handles answered callers one at
    /// a time, so a batch's callers ask again one after another.
    client: u64,
    rng: u64,
    /// The machine's speed factor, and when it changes next.
    speed: (f64, u64),
    competing_started: bool,
}

impl Sim {
    pub(super) fn new(world: &World, seed: u64) -> Self {
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        // Decorrelate nearby seeds.
        for _ in 0..4 {
            noise(&mut rng, 1.0);
        }
        Self {
            start: Instant::now(),
            now: 0,
            asks: VecDeque::from([Run {
                first: 0,
                step: 0,
                count: world.callers as u64,
            }]),
            events: BinaryHeap::new(),
            running: 0,
            workers: vec![0; world.workers],
            client: 0,
            rng,
            speed: (1.0, 0),
            competing_started: false,
        }
    }

    pub(super) fn now(&self) -> Instant {
        self.instant(self.now)
    }

    fn instant(&self, at: u64) -> Instant {
        self.start + Duration::from_nanos(at)
    }

    /// How slow the database is at `now`: the machine's noise and, in a
    /// cold start, the cache warming.
    fn slowness(&mut self, world: &World) -> f64 {
        if self.now >= self.speed.1 {
            self.speed = (
                noise(&mut self.rng, world.machine_noise),
                self.now + SPEED_EVERY,
            );
        }
        let cold = nanos(world.cold_for);
        let warming = if (self.now as f64) < cold {
            1.0 + (world.cold_factor - 1.0) * (1.0 - self.now as f64 / cold)
        } else {
            1.0
        };
        self.speed.0 * warming
    }

    /// Runs `work` nanoseconds of work arriving at `arrives` on the first
    /// free worker; returns when it is done.
    fn assign(&mut self, arrives: u64, work: f64) -> u64 {
        let (w, free) = self
            .workers
            .iter()
            .copied()
            .enumerate()
            .min_by_key(|&(_, at)| at)
            .expect("at least one worker");
        let done = arrives.max(free) + work as u64;
        self.workers[w] = done;
        done
    }

    /// Callers waiting now.
    fn waiting(&self) -> u64 {
        let mut n = 0;
        for run in &self.asks {
            if run.first > self.now {
                break;
            }
            let ready = match run.step {
                0 => run.count,
                step => ((self.now - run.first) / step + 1).min(run.count),
            };
            n += ready;
            if ready < run.count {
                break;
            }
        }
        n
    }

    /// Sends a load of what waits (up to the batch cap).
    fn send(&mut self, world: &World, waiting: u64) {
        let n = waiting.min(world.max_batch as u64);
        let (mut taken, mut asked) = (0, 0);
        while taken < n {
            let run = self.asks.front_mut().expect("a caller waits");
            let k = (n - taken).min(run.count);
            // Their asking times: first, first + step, ...
            asked += k * run.first + run.step * k * (k - 1) / 2;
            taken += k;
            run.first += k * run.step;
            run.count -= k;
            if run.count == 0 {
                self.asks.pop_front();
            }
        }
        let factor = noise(&mut self.rng, world.load_noise) * self.slowness(world);
        let work = world.work(n) * factor;
        let done = self.assign(self.now + nanos(world.round_trip) as u64 / 2, work);
        let end = done + nanos(world.round_trip) as u64 / 2;
        self.running += 1;
        let load = Load {
            sent: self.now,
            callers: n,
            asked,
        };
        self.events.push(Reverse((end, Event::Ends(load))));
    }

    /// Starts the next competing statement, if the competing load is on.
    fn compete(&mut self, world: &World) {
        let Some(c) = world.competing else { return };
        if (self.now / nanos(c.period) as u64) % 2 == 1 {
            // Off for this period: come back when it ends.
            let next = (self.now / nanos(c.period) as u64 + 1) * nanos(c.period) as u64;
            self.events.push(Reverse((next, Event::Competes)));
            return;
        }
        let work = nanos(c.work) * self.slowness(world);
        let done = self.assign(self.now, work);
        self.events.push(Reverse((done, Event::Competes)));
    }

    /// Runs `world` for `length` with `limit`.
    pub(super) fn run(
        &mut self,
        world: &World,
        mut limit: Limit<'_>,
        length: Duration,
    ) -> Measured {
        let until = self.now + length.as_nanos() as u64;
        let mut served = 0u64;
        let mut limits = Vec::new();
        let mut next_sample = self.now;
        if self.workers.len() != world.workers {
            self.workers.resize(world.workers, self.now);
        }
        if let (Some(c), false) = (world.competing, self.competing_started) {
            self.competing_started = true;
            for _ in 0..c.jobs {
                self.compete(world);
            }
        }
        loop {
            let current = match &limit {
                Limit::Fixed(n) => *n,
                Limit::Auto(auto) => auto.limit(),
            };
            // The eager policy: a batch goes whenever a slot is free.
            let mut waiting = self.waiting();
            while self.running < current && waiting > 0 {
                self.send(world, waiting);
                waiting = self.waiting();
            }
            if let Limit::Auto(auto) = &mut limit {
                if waiting > 0 {
                    auto.held_back();
                }
            }
            // The next thing to happen: a load ends, or, with a slot free,
            // the next caller asks.
            let next_ask = (self.running < current)
                .then(|| self.asks.front().map(|r| r.first))
                .flatten();
            let next_end = self.events.peek().map(|Reverse((at, _))| *at);
            let at = match (next_ask, next_end) {
                (Some(a), Some(e)) => a.min(e),
                (a, e) => match a.or(e) {
                    Some(t) => t,
                    None => break,
                },
            };
            if at > until {
                self.now = until;
                break;
            }
            self.now = at;
            while next_sample <= at {
                limits.push(current);
                next_sample += 10_000_000;
            }
            if next_end != Some(at) {
                continue; // a caller asks
            }
            let Some(Reverse((_, event))) = self.events.pop() else {
                continue;
            };
            let Event::Ends(load) = event else {
                self.compete(world);
                continue;
            };
            self.running -= 1;
            served += load.callers;
            if let Limit::Auto(auto) = &mut limit {
                let response = Duration::from_nanos(load.callers * at - load.asked);
                let n = load.callers as usize;
                auto.completed(
                    n,
                    n,
                    response,
                    Duration::from_nanos(at - load.sent),
                    self.now(),
                );
            }
            self.client = self.client.max(at);
            self.asks.push_back(Run {
                first: self.client + PER_CALLER,
                step: PER_CALLER,
                count: load.callers,
            });
            self.client += PER_CALLER * load.callers;
        }
        Measured {
            per_sec: served as f64 / length.as_secs_f64(),
            limits,
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

/// Each fixed limit of `1..=max` in `world`, after `warmup`, for `length`:
/// callers answered per second by limit (index `limit - 1`), the mean of
/// `seeds` runs.
pub(super) fn sweep(
    world: &World,
    max: usize,
    seeds: u64,
    warmup: Duration,
    length: Duration,
) -> Vec<f64> {
    (1..=max)
        .map(|c| {
            let total: f64 = (0..seeds)
                .map(|seed| {
                    let mut sim = Sim::new(world, 1_000 + seed);
                    sim.run(world, Limit::Fixed(c), warmup);
                    sim.run(world, Limit::Fixed(c), length).per_sec
                })
                .sum();
            total / seeds as f64
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

/// How the automatic limit did in a world, over many seeds, against the
/// best fixed limit's mean.
#[derive(Debug, Clone)]
pub(super) struct Score {
    /// The mean, over seeds, of its throughput over the best fixed's.
    pub(super) mean: f64,
    /// The least of them.
    pub(super) worst: f64,
    /// How often each limit was in force (sampled every 10 ms).
    pub(super) limits: std::collections::BTreeMap<usize, usize>,
}

/// The automatic limit between 1 and `max` in `world`, over `seeds` fresh
/// simulations: each runs `warmup` and is measured for `length`.
pub(super) fn auto_over_seeds(
    world: &World,
    max: usize,
    seeds: u64,
    warmup: Duration,
    length: Duration,
) -> Score {
    let fixed = sweep(world, max, 5, warmup, length);
    let best = fixed.iter().copied().fold(0.0, f64::max);
    let mut limits = std::collections::BTreeMap::new();
    let ratios: Vec<f64> = (0..seeds)
        .map(|seed| {
            let mut sim = Sim::new(world, seed);
            let mut auto = AutoLimit::new(1, max, world.max_batch, sim.now());
            sim.run(world, Limit::Auto(&mut auto), warmup);
            let m = sim.run(world, Limit::Auto(&mut auto), length);
            for l in m.limits {
                *limits.entry(l).or_insert(0) += 1;
            }
            m.per_sec / best
        })
        .collect();
    Score {
        mean: ratios.iter().sum::<f64>() / ratios.len() as f64,
        worst: ratios.iter().copied().fold(f64::INFINITY, f64::min),
        limits,
    }
}

/// Prints, for every world, each fixed limit's throughput over the best
/// and how the automatic limit did over 50 seeds: what to look at when
/// changing the search
/// (`cargo test -p pgbatch --lib explore -- --ignored --nocapture`).
#[test]
#[ignore = "prints a report; asserts nothing"]
fn explore() {
    for (name, world) in World::all() {
        let (warmup, length) = (Duration::from_secs(1), Duration::from_secs(4));
        let fixed = sweep(&world, 16, 5, warmup, length);
        let best = fixed.iter().copied().fold(0.0, f64::max);
        let norm: Vec<String> = fixed.iter().map(|x| format!("{:.2}", x / best)).collect();
        let score = auto_over_seeds(&world, 16, 50, warmup, length);
        eprintln!(
            "{name}: fixed {norm:?} best {best:.0}; auto mean {:.3} worst {:.3}\n  limits {:?}",
            score.mean, score.worst, score.limits,
        );
    }
}
