//! A seeded simulation of the real `Batcher` on Tokio's paused clock: its
//! worker, direct loads, queue, timers and load tasks, under random
//! arrivals, scopes, cancellations, deadlines, load durations, failures
//! and panics, with a seeded loader that checks what it is asked.
//!
//! Checked for every caller: one answer, by its deadline plus 1 ms (the
//! resolution of Tokio's timers), and never another scope's or another
//! key's value. Checked by the loader on every load: keys distinct, at
//! most a batch of them, at most the loads the limit allows at once, at
//! most the scopes a load may serve and each once, and, where requests
//! join running loads, no key of a scope in two running loads. Then the
//! batcher shuts down with nothing left.
//!
//! 1,000 seeds per world; `PGBATCH_SIM_SEEDS` asks for more, and a failure
//! prints the line that replays it (`PGBATCH_SIM_SEED=<seed>`). The
//! ledger's own simulation (`pgbatch`'s unit tests, `ledger::sim`) checks
//! the decisions in finer detail; this one checks the shell around them.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pgbatch::{Batcher, Concurrency, Error, FlushPolicy, Loaded, Overflow, ScopedLoader};
use tokio::time::Instant;

/// SplitMix64, as in the ledger's simulation: a seed replays one run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    fn us(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_micros(self.range(lo, hi))
    }
}

#[derive(Debug)]
struct Failed;

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("this scope's load failed")
    }
}

impl std::error::Error for Failed {}

/// The settings of one run.
#[derive(Debug, Clone)]
struct Setup {
    scopes: u64,
    keys: u64,
    callers: u64,
    max_batch: usize,
    concurrency: Concurrency,
    policy: FlushPolicy,
    overflow: Overflow,
    channel: usize,
    timeout: Duration,
    load_timeout: Option<Duration>,
    join: bool,
    direct: bool,
    scopes_per_load: usize,
    /// Load durations, in microseconds.
    load: (u64, u64),
    fail: f64,
    panic: f64,
    cancel: f64,
    /// So little to do that no caller may time out: every load ends long
    /// before any deadline, whatever waits for what.
    calm: bool,
}

/// The ranges a run's settings are drawn from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum World {
    Unscoped,
    /// Many scopes, loads that serve several.
    Scoped,
    /// A few callers and quick loads: a timeout can only be a request the
    /// batcher forgot (a flush left without a timer, say).
    Calm,
}

impl Setup {
    fn draw(rng: &mut Rng, world: World) -> Self {
        let scoped = world != World::Unscoped;
        let mut setup = Self {
            scopes: if scoped { rng.range(2, 20) } else { 1 },
            keys: rng.range(1, 20),
            callers: rng.range(10, 150),
            max_batch: rng.range(1, 8) as usize,
            concurrency: match rng.range(0, 1) {
                0 => Concurrency::Fixed(rng.range(1, 4) as usize),
                _ => Concurrency::Auto {
                    max: rng.range(1, 6) as usize,
                },
            },
            policy: [
                FlushPolicy::Eager,
                FlushPolicy::FixedDelay,
                FlushPolicy::Adaptive,
            ][rng.range(0, 2) as usize],
            overflow: if rng.chance(0.8) {
                Overflow::Reject
            } else {
                Overflow::Wait
            },
            channel: rng.range(2, 64) as usize,
            timeout: rng.us(2_000, 30_000),
            load_timeout: rng.chance(0.3).then(|| rng.us(500, 10_000)),
            join: rng.chance(0.3),
            direct: rng.chance(0.7),
            scopes_per_load: if scoped { rng.range(1, 8) as usize } else { 1 },
            load: (rng.range(1, 500), rng.range(500, 8_000)),
            fail: 0.05,
            panic: 0.02,
            cancel: 0.1,
            calm: false,
        };
        if world == World::Calm {
            setup.callers = rng.range(1, 12);
            setup.load = (rng.range(1, 50), rng.range(50, 300));
            setup.timeout = rng.us(20_000, 30_000);
            setup.load_timeout = None;
            setup.fail = 0.0;
            setup.panic = 0.0;
            setup.overflow = Overflow::Reject;
            setup.channel = 64;
            setup.calm = true;
        }
        setup
    }
}

/// A loader whose durations, failures and panics come from the seed, and
/// which checks what it is asked.
struct SimLoader {
    setup: Setup,
    rng: Mutex<Rng>,
    running: AtomicUsize,
    /// Keys of each scope in running loads.
    in_flight: Mutex<HashMap<(u64, u64), usize>>,
    violations: Mutex<Vec<String>>,
}

/// Counts a load as running until dropped (a load abandoned at its
/// timeout is dropped, not finished).
struct Running<'a> {
    loader: &'a SimLoader,
    keys: Vec<(u64, u64)>,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.loader.running.fetch_sub(1, SeqCst);
        let mut in_flight = self.loader.in_flight.lock().unwrap();
        for k in &self.keys {
            let n = in_flight.get_mut(k).expect("counted");
            *n -= 1;
            if *n == 0 {
                in_flight.remove(k);
            }
        }
    }
}

impl SimLoader {
    fn violation(&self, what: String) {
        self.violations.lock().unwrap().push(what);
    }

    /// Checks and counts a load of `groups`, one entry per scope.
    fn begin(&self, groups: &[(u64, &[u64])]) -> Running<'_> {
        let running = self.running.fetch_add(1, SeqCst) + 1;
        let most = self.setup.concurrency.max();
        if running > most {
            self.violation(format!("{running} loads at once, beyond {most}"));
        }
        let keys: usize = groups.iter().map(|(_, k)| k.len()).sum();
        if keys > self.setup.max_batch {
            self.violation(format!(
                "{keys} keys in a load of at most {}",
                self.setup.max_batch
            ));
        }
        if groups.len() > self.setup.scopes_per_load {
            self.violation(format!("{} scopes in one load", groups.len()));
        }
        let mut seen = Vec::new();
        let mut in_flight = self.in_flight.lock().unwrap();
        for (scope, keys) in groups {
            if seen.contains(scope) {
                self.violation(format!("scope {scope} twice in one load"));
            }
            seen.push(*scope);
            for (i, key) in keys.iter().enumerate() {
                if keys[..i].contains(key) {
                    self.violation(format!("key {key} twice in one load"));
                }
                let n = in_flight.entry((*scope, *key)).or_default();
                if *n > 0 && self.setup.join {
                    self.violation(format!("scope {scope} key {key} in two running loads"));
                }
                *n += 1;
            }
        }
        Running {
            loader: self,
            keys: groups
                .iter()
                .flat_map(|(s, keys)| keys.iter().map(move |k| (*s, *k)))
                .collect(),
        }
    }

    /// One scope's part of a load: its values, after a seeded while.
    async fn group(&self, scope: u64, keys: Vec<u64>) -> Result<Loaded<u64, (u64, u64)>, Failed> {
        let (wait, fail, panic) = {
            let mut rng = self.rng.lock().unwrap();
            let (lo, hi) = self.setup.load;
            (
                rng.us(lo, hi),
                rng.chance(self.setup.fail),
                rng.chance(self.setup.panic),
            )
        };
        tokio::time::sleep(wait).await;
        assert!(!panic, "a seeded panic");
        if fail {
            return Err(Failed);
        }
        // Keys divisible by 7 are not found.
        Ok(keys
            .into_iter()
            .filter(|k| k % 7 != 6)
            .map(|k| (k, (scope, k)))
            .collect())
    }
}

/// The loader as the batcher holds it.
struct Shared(Arc<SimLoader>);

impl ScopedLoader<u64, u64, (u64, u64)> for Shared {
    type Error = Failed;

    async fn load(&self, scope: &u64, keys: Vec<u64>) -> Result<Loaded<u64, (u64, u64)>, Failed> {
        let _running = self.0.begin(&[(*scope, &keys)]);
        self.0.group(*scope, keys).await
    }

    fn scopes_per_load(&self) -> usize {
        self.0.setup.scopes_per_load
    }

    async fn load_scopes(
        &self,
        batches: Vec<(u64, Vec<u64>)>,
    ) -> Result<Vec<Result<Loaded<u64, (u64, u64)>, Failed>>, Failed> {
        let groups: Vec<(u64, &[u64])> = batches.iter().map(|(s, k)| (*s, k.as_slice())).collect();
        let _running = self.0.begin(&groups);
        let loads = batches
            .iter()
            .map(|(scope, keys)| self.0.group(*scope, keys.clone()));
        Ok(futures_util::future::join_all(loads).await)
    }
}

/// Runs one seed: `Err` says what went wrong.
async fn run(seed: u64, world: World) -> Result<(), String> {
    let mut rng = Rng(seed ^ 0xba7c_4e55);
    let setup = Setup::draw(&mut rng, world);
    let loader = Arc::new(SimLoader {
        setup: setup.clone(),
        rng: Mutex::new(Rng(rng.next())),
        running: AtomicUsize::new(0),
        in_flight: Mutex::default(),
        violations: Mutex::default(),
    });
    let mut builder = Batcher::builder()
        .max_batch_size(setup.max_batch)
        .concurrency(setup.concurrency)
        .policy(setup.policy)
        .overflow(setup.overflow)
        .channel_capacity(setup.channel)
        .timeout(setup.timeout)
        .join_in_flight(setup.join)
        .direct_when_idle(setup.direct);
    if let Some(t) = setup.load_timeout {
        builder = builder.load_timeout(t);
    }
    let batcher: Batcher<u64, (u64, u64), u64> = builder
        .build_scoped(Shared(Arc::clone(&loader)))
        .map_err(|e| format!("build: {e}"))?;
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..setup.callers {
        let (scope, key) = (rng.range(0, setup.scopes - 1), rng.range(0, setup.keys - 1));
        let start = rng.us(0, 20_000);
        let cancel = rng.chance(setup.cancel).then(|| rng.us(0, 5_000));
        let many = rng.chance(0.1);
        let b = batcher.clone();
        let (timeout, calm) = (setup.timeout, setup.calm);
        callers.spawn(async move {
            tokio::time::sleep(start).await;
            let asked = Instant::now();
            let answers = async {
                if many {
                    b.load_many_as(&scope, [key, (key + 1) % 20]).await
                } else {
                    vec![b.load_as(&scope, key).await]
                }
            };
            let answers = match cancel {
                Some(after) => match tokio::time::timeout(after, answers).await {
                    Ok(answers) => answers,
                    Err(_) => return Ok(()), // cancelled: nothing owed
                },
                None => answers.await,
            };
            let took = asked.elapsed();
            if took > timeout + Duration::from_millis(1) {
                return Err(format!(
                    "a caller answered after {took:?} (timeout {timeout:?})"
                ));
            }
            let keys = if many {
                vec![key, (key + 1) % 20]
            } else {
                vec![key]
            };
            for (answer, key) in answers.into_iter().zip(keys) {
                match answer {
                    Ok(Some(v)) if v != (scope, key) => {
                        return Err(format!("scope {scope} key {key} answered {v:?}"))
                    }
                    Ok(None) if key % 7 != 6 => {
                        return Err(format!("scope {scope} key {key} answered not found"))
                    }
                    Err(Error::Timeout(t)) if calm => {
                        return Err(format!("scope {scope} key {key} timed out, calm: {t}"))
                    }
                    Ok(_)
                    | Err(
                        Error::Timeout(_)
                        | Error::Load(_)
                        | Error::LoaderPanicked(_)
                        | Error::LoadTimeout(_)
                        | Error::Overloaded,
                    ) => {}
                    Err(e) => return Err(format!("scope {scope} key {key}: {e}")),
                }
            }
            Ok(())
        });
    }
    while let Some(done) = callers.join_next().await {
        done.map_err(|e| format!("a caller panicked: {e}"))??;
    }
    let shutdown = tokio::time::timeout(Duration::from_secs(60), batcher.shutdown());
    shutdown
        .await
        .map_err(|_| "shutdown did not finish".to_owned())?;
    if let Some(v) = loader.violations.lock().unwrap().first() {
        return Err(v.clone());
    }
    if loader.running.load(SeqCst) != 0 {
        return Err("loads still running after shutdown".into());
    }
    Ok(())
}

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
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime");
        if let Err(e) = rt.block_on(run(seed, world)) {
            panic!(
                "{name}, seed {seed}: {e}; replay: PGBATCH_SIM_SEED={seed} cargo test -p pgbatch --test engine sim::{name}"
            );
        }
    }
}

#[test]
fn unscoped() {
    run_world(World::Unscoped, "unscoped");
}

#[test]
fn scoped() {
    run_world(World::Scoped, "scoped");
}

#[test]
fn calm() {
    run_world(World::Calm, "calm");
}
