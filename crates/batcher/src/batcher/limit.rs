//! The automatic concurrency limit ([`Concurrency::Auto`]): how many loads
//! run at once, found by measurement and kept adapting.
//!
//! # Why measure
//!
//! With `n` callers and `c` loads in flight, batches hold about `n / c` keys,
//! so the limit trades batch size (fewer statements, less fixed cost per
//! key) against parallelism (a database kept busy across round trips).
//! Neither side follows from the settings: next to its database on a small
//! machine the best limit is a handful, across a 5 ms round trip it is many
//! more, and it moves when the data, the load or the network do.
//!
//! # What is measured
//!
//! Time is cut into windows of at least 50 ms and 64 loads. In each, the
//! worker adds up the response times of the callers it answered (from the
//! call to the answer), and scores the window by their inverse mean,
//! callers answered per second of waiting. With a fixed number of callers
//! that each wait for an answer before asking again (a closed loop),
//! throughput is callers over mean response time, so the score peaks
//! exactly where throughput does; with requests arriving at a rate the
//! service keeps up with, it peaks where answers come fastest; past what
//! the service can do, queues fill and it peaks where they drain fastest.
//! (Throughput over response time, Kleinrock's power, peaks at the same
//! place in a closed loop, but squares the noise of a short window.)
//! Loads started under the previous limit finish before a window starts
//! counting, so each window measures one limit.
//!
//! # How the limit moves
//!
//! A hill climb with memory, that settles at the knee: the fewest loads
//! that reach the throughput. Past the knee more loads add nothing but
//! queueing in the database and smaller batches, which cost it more per
//! key, so the burden of proof is always on more loads:
//! - every limit that was home keeps a smoothed score of its home
//!   windows (a probe's windows only judge the probe);
//! - from the current limit ("home") a probe tries a neighbour, half as
//!   many again or a third fewer (at least one away). A probe to fewer
//!   loads becomes home when it scores within 2% of home, if home's loads
//!   queue (their mean time is over a tenth above the least window mean
//!   seen), else when it scores no worse; a probe to more loads must beat
//!   home by more than the noise home's own windows show (and at least
//!   2%), or by 2% with loads no longer than home's (where the round trip
//!   bounds them, a gentle slope gains less than the noise per step).
//!   Where a probe's loads are full (they carry the batch cap: keys wait
//!   beyond what the loads in flight take), more loads split no batch,
//!   and a probe up wins by 2% too.
//!   Either must pass in one window and then in the
//!   mean of that window and one more, and is judged on those windows
//!   alone, never on what that limit scored before: one window that passes
//!   is as often luck, a limit moved by luck stays there until luck moves
//!   it back, and an old score was measured in another world. The climb then goes on in that
//!   direction, each step up twice the last, so a long gentle slope takes
//!   a few windows (down, a third of home each time); otherwise the limit
//!   returns home, and soon tries one step that way (the next probe that
//!   way after that is coarse again);
//! - home's neighbours are probed again from time to time, one side at a
//!   time: after 6 windows at first, twice as long after each one-step
//!   probe that fails (up to 48), so a limit that keeps proving right costs
//!   ever fewer windows at a worse one; of two probes owed, the one to
//!   fewer loads goes first;
//! - when home's score moves far beyond its noise in two windows running
//!   (the database slowed down, the round trip changed, a competing load
//!   started or stopped), every other score is forgotten and both
//!   neighbours are probed at once, so the climb starts again from where it
//!   is rather than trusting measurements of another world;
//! - the first window, which pays for the start (connections opened,
//!   statements prepared), is not scored, and the noise starts at 5%
//!   until home's windows measure it.
//!
//! The failure modes of adaptive limiters this avoids:
//! - *a stale baseline* (Vegas's and Envoy's minimum round trip): there is
//!   none; a probe is compared with a fresh measurement of home;
//! - *oscillation and drift on noise*: a move needs two windows, a move
//!   up a margin above the measured noise, and one odd window is not a
//!   changed world;
//! - *collapse under a noisy neighbour*: a slower world lowers every score
//!   alike, and the limit moves only when a neighbour does as well in that
//!   same world; it never leaves `min..=max`;
//! - *learning from idle time*: a window in which the limit never held a
//!   batch back says nothing about the limit and is not scored.
//!
//! The tests drive it through a simulated database (`limit/sim.rs`): a
//! closed loop of callers over loads that run on a fixed number of
//! workers, each load costing a fixed part plus a part per key.
//!
//! This module is plain arithmetic on what the worker reports, with time
//! passed in, so its unit tests need no runtime.

use std::time::Duration;

use tokio::time::Instant;

/// A window lasts at least this long...
const MIN_WINDOW: Duration = Duration::from_millis(50);
/// ...and this many completed loads, unless it reaches [`MAX_WINDOW`]
/// first, when it is scored with what it has.
const MIN_BATCHES: u32 = 64;
/// See [`MIN_BATCHES`].
const MAX_WINDOW: Duration = Duration::from_secs(1);
/// After the limit changes, counting starts this many load durations
/// later (and at least [`MIN_SETTLE`]), once the loads started under the
/// old limit are done and callers have regrouped.
const SETTLE_LOADS: u32 = 4;
/// See [`SETTLE_LOADS`].
const MIN_SETTLE: Duration = Duration::from_millis(2);
/// A probe must beat home's score by at least this fraction, and by more
/// than home's measured noise, to become home.
const MARGIN: f64 = 0.02;
/// A probe to fewer loads becomes home when it scores within this
/// fraction of a home whose loads queue: the limit settles at the fewest
/// loads that reach the throughput, not wherever noise left it.
const KNEE_TOLERANCE: f64 = 0.02;
/// Loads that take at most this fraction longer than others do not queue:
/// a probe to more loads whose loads take no longer than home's moves up
/// if it beats home by [`MARGIN`], whatever the noise; a probe to fewer
/// loads wins within [`KNEE_TOLERANCE`] only if home's loads take longer
/// than the least seen.
const QUEUEING: f64 = 0.1;
/// A window's loads are full when they carry at least this fraction of
/// the batch cap on average: keys wait beyond what the loads take, so
/// more loads split no batch (requests of a thousand keys each).
const FULL: f64 = 0.97;
/// Home's score moving by more than this fraction (and by three times its
/// noise) in two windows running means the world changed.
const SHIFT: f64 = 0.3;
/// Windows at home between periodic probes, at first...
const PROBE_EVERY_MIN: u32 = 6;
/// ...doubling with each periodic probe that fails, up to this: a limit
/// that keeps proving right costs ever fewer probes at a worse one. A move
/// or a changed world starts over from [`PROBE_EVERY_MIN`].
const PROBE_EVERY_MAX: u32 = 48;
/// Weight of a new window in a limit's smoothed score.
const SMOOTHING: f64 = 0.3;
/// Home's noise before any window measured it (natural log): a shared
/// machine's 50 ms windows stray by 4-10% (BENCHMARKS.md, "How close to the database's limit"), and a first
/// probe judged against no noise at all wins on luck.
const NOISE_PRIOR: f64 = 0.05;
/// Weight of a new window in home's noise estimate.
const NOISE_SMOOTHING: f64 = 0.2;
/// Weight of a new load in the smoothed load duration.
const LOAD_SMOOTHING: f64 = 0.1;
/// The first limit: enough to overlap a database's work with the round
/// trip on a small machine; the search moves it from there.
const START: usize = 4;

/// The first limit of a search between `min` and `max`.
pub(crate) fn start(min: usize, max: usize) -> usize {
    START.clamp(min.min(max), max)
}

/// Which way a probe goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Down = 0,
    Up = 1,
}

impl Direction {
    fn opposite(self) -> Self {
        match self {
            Direction::Down => Direction::Up,
            Direction::Up => Direction::Down,
        }
    }
}

/// What one window has seen so far.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// Counting starts here (the limit's start plus the settling time).
    from: Instant,
    served: u64,
    /// Response times of the served callers, added up.
    response: Duration,
    batches: u32,
    /// The loads' distinct keys, added up.
    keys: u64,
    /// The loads' times, added up.
    load: Duration,
    /// A due batch found every slot the limit allows taken.
    held_back: bool,
}

impl Window {
    fn starting(from: Instant) -> Self {
        Self {
            from,
            served: 0,
            response: Duration::ZERO,
            batches: 0,
            keys: 0,
            load: Duration::ZERO,
            held_back: false,
        }
    }

    /// Callers answered per second of response time: the inverse of their
    /// mean response time.
    fn score(&self) -> f64 {
        let response = self.response.as_secs_f64();
        if self.served == 0 || response <= 0.0 {
            return 0.0;
        }
        self.served as f64 / response
    }
}

/// The state of the search (see the module docs).
#[derive(Debug)]
pub(crate) struct AutoLimit {
    min: usize,
    max: usize,
    /// Keys per load at most, if loads can be full (see [`FULL`]).
    batch_cap: Option<usize>,
    /// The limit in force: home, or a neighbour under probe.
    limit: usize,
    home: usize,
    /// The direction of the probe in force, if `limit` is one.
    probing: Option<Direction>,
    /// Directions to probe from home before staying there.
    owed: [bool; 2],
    /// Directions in which a coarse probe failed: the next probe goes one
    /// step, so the climb can stop between the coarse steps.
    fine: [bool; 2],
    /// Which side the next periodic probe goes to.
    next_periodic: Direction,
    windows_at_home: u32,
    /// Windows at home before the next periodic probe.
    probe_every: u32,
    /// Moves made in a row in the direction of the probe in force: each
    /// doubles the next coarse step, so a long gentle slope is climbed in
    /// a few windows.
    streak: u32,
    /// Smoothed score per limit that was home (index `limit - 1`), from
    /// its home windows, or the two windows that made it home; `None`: not
    /// home since the world last changed. Grown as limits are tried, so a huge
    /// `max` costs nothing.
    scores: Vec<Option<f64>>,
    /// How far, in natural log, home's windows stray from its smoothed
    /// score: the noise a probe must beat.
    noise: f64,
    /// The last home window strayed beyond a shift, this way (+1 or -1).
    strayed: Option<f64>,
    /// A window was measured (and not scored: see `judge`).
    warm: bool,
    /// The first window's score, mean load time and fullness of a probe
    /// that passed, while a second window confirms it.
    confirming: Option<(f64, Option<Duration>, bool)>,
    /// Smoothed mean load time of home's windows.
    home_load: Option<Duration>,
    /// Smoothed duration of a load, which sets the settling time.
    load_time: Option<Duration>,
    /// The least and the latest scored window's mean load time; the
    /// least is forgotten when the world changes.
    least_load: Option<Duration>,
    recent_load: Option<Duration>,
    window: Window,
    /// Windows scored, for tests to step window by window.
    #[cfg(test)]
    judged: u64,
}

impl AutoLimit {
    /// A search between `min` and `max` loads (`max` at least 1, `min`
    /// at most `max`), starting at [`start`].
    pub(crate) fn new(min: usize, max: usize, now: Instant) -> Self {
        let max = max.max(1);
        let min = min.clamp(1, max);
        let start = start(min, max);
        Self {
            min,
            max,
            batch_cap: None,
            limit: start,
            home: start,
            probing: None,
            // Nothing is known: try both sides once there is something to
            // compare with.
            owed: [true, true],
            fine: [false, false],
            next_periodic: Direction::Up,
            windows_at_home: 0,
            probe_every: PROBE_EVERY_MIN,
            streak: 0,
            scores: Vec::new(),
            noise: NOISE_PRIOR,
            strayed: None,
            warm: false,
            confirming: None,
            home_load: None,
            load_time: None,
            least_load: None,
            recent_load: None,
            window: Window::starting(now),
            #[cfg(test)]
            judged: 0,
        }
    }

    /// Loads carry at most `cap` keys: one that carries about that many is
    /// full (see [`FULL`]). Without it no load counts as full.
    pub(crate) fn with_batch_cap(mut self, cap: usize) -> Self {
        self.batch_cap = Some(cap.max(1));
        self
    }

    /// The limit in force.
    #[cfg(test)]
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// The least and the latest scored window's mean load time (see
    /// `StatsSnapshot::load_time_least`).
    pub(crate) fn load_times(&self) -> (Option<Duration>, Option<Duration>) {
        (self.least_load, self.recent_load)
    }

    /// Keys waited because of the limit (see `policy::held_by_limit`): the
    /// limit is what decides this window's batches.
    pub(crate) fn held_back(&mut self) {
        self.window.held_back = true;
    }

    /// A load of `keys` distinct keys finished: it answered `served`
    /// callers, whose response times add up to `response`, and it ran for
    /// `load`. Returns the new limit when it changes.
    pub(crate) fn completed(
        &mut self,
        served: usize,
        keys: usize,
        response: Duration,
        load: Duration,
        now: Instant,
    ) -> Option<usize> {
        self.load_time = Some(match self.load_time {
            Some(t) => t.mul_f64(1.0 - LOAD_SMOOTHING) + load.mul_f64(LOAD_SMOOTHING),
            None => load,
        });
        if now < self.window.from {
            return None; // a load of the previous limit, or settling
        }
        let w = &mut self.window;
        w.served += served as u64;
        w.response += response;
        w.batches += 1;
        w.keys += keys as u64;
        w.load += load;
        let elapsed = now - w.from;
        let done = (elapsed >= MIN_WINDOW && w.batches >= MIN_BATCHES) || elapsed >= MAX_WINDOW;
        if !done {
            return None;
        }
        let window = *w;
        let before = self.limit;
        self.judge(window, now);
        (self.limit != before).then_some(self.limit)
    }

    /// Whether `window`'s loads were full (see [`FULL`]).
    fn is_full(&self, window: &Window) -> bool {
        self.batch_cap.is_some_and(|cap| {
            window.batches > 0
                && window.keys as f64 >= FULL * (cap as f64) * f64::from(window.batches)
        })
    }

    fn score(&self, limit: usize) -> Option<f64> {
        self.scores.get(limit - 1).copied().flatten()
    }

    /// The limit a probe from `home` in `dir` tries, if there is one: half
    /// as many again, or a third fewer (at least one step either way), so
    /// that on a gentle slope a probe differs from home by more than the
    /// margin; one step after such a probe failed.
    fn neighbour(&self, home: usize, dir: Direction) -> Option<usize> {
        let fine = self.fine[dir as usize];
        let faster = 1usize << self.streak.min(4);
        match dir {
            Direction::Down => {
                // Not faster: down is a short way (a third of home is
                // already most of it), where an overshoot on a lucky
                // window lands on the steep side.
                let step = if fine { 1 } else { (home / 3).max(1) };
                Some(home.saturating_sub(step).max(self.min)).filter(|&n| n < home)
            }
            Direction::Up => {
                let step = if fine { 1 } else { (home / 2).max(1) * faster };
                Some(home.saturating_add(step).min(self.max)).filter(|&n| n > home)
            }
        }
    }

    /// Scores a finished window and picks the next limit.
    fn judge(&mut self, window: Window, now: Instant) {
        #[cfg(test)]
        {
            self.judged += 1;
        }
        let at_home = self.probing.is_none();
        if !std::mem::replace(&mut self.warm, true) {
            // The first window pays for the start (connections opened,
            // statements prepared): scored, it would make any probe look
            // better.
            self.window = Window::starting(now);
            return;
        }
        // Every window's, scored or not: the gauges show the loads now.
        let window_load = (window.batches > 0).then(|| window.load / window.batches);
        if let Some(mean) = window_load {
            self.recent_load = Some(mean);
            self.least_load = Some(self.least_load.map_or(mean, |least| least.min(mean)));
        }
        if at_home && !window.held_back {
            // The limit held nothing back: this window says nothing about
            // it. Keep it, and measure again.
            self.window = Window::starting(now);
            return;
        }
        let score = window.score();
        let full = self.is_full(&window);
        tracing::trace!(
            limit = self.limit,
            home = self.home,
            probe = self.probing.is_some(),
            score,
            noise = self.noise,
            served = window.served,
            batches = window.batches,
            full,
            load_ms = self.recent_load.map_or(0.0, |d| d.as_secs_f64() * 1e3),
            "concurrency window"
        );
        if at_home {
            self.record_home(score);
            if let Some(load) = window_load {
                self.home_load = Some(match self.home_load {
                    Some(old) => old.mul_f64(1.0 - SMOOTHING) + load.mul_f64(SMOOTHING),
                    None => load,
                });
            }
        }
        let next = match self.probing.take() {
            Some(dir) => match self.after_probe(dir, score, window_load, full) {
                Some(next) => next,
                None => {
                    // Measured again as it is.
                    self.window = Window::starting(now);
                    return;
                }
            },
            None => self.at_home(),
        };
        self.set(next, now);
    }

    /// `limit`'s score, the vector grown to hold it.
    fn slot(&mut self, limit: usize) -> &mut Option<f64> {
        if self.scores.len() < limit {
            self.scores.resize(limit, None);
        }
        &mut self.scores[limit - 1]
    }

    /// Adds a window's `score` to `limit`'s.
    fn record(&mut self, limit: usize, score: f64) {
        let slot = self.slot(limit);
        *slot = Some(match *slot {
            Some(old) => old * (1.0 - SMOOTHING) + score * SMOOTHING,
            None => score,
        });
    }

    /// Adds a home window's `score`, learning home's noise from it. Two
    /// windows running far beyond the noise, the same way, mean the world
    /// changed: every other score is forgotten and both sides are probed
    /// again.
    fn record_home(&mut self, score: f64) {
        let home = self.home;
        let Some(old) = self.score(home).filter(|&old| old > 0.0 && score > 0.0) else {
            self.record(home, score);
            return;
        };
        let stray = (score / old).ln();
        let far = (1.0 / (1.0 - SHIFT)).ln().max(3.0 * self.noise);
        if stray.abs() <= far {
            self.strayed = None;
            self.noise = self.noise * (1.0 - NOISE_SMOOTHING) + stray.abs() * NOISE_SMOOTHING;
            self.record(home, score);
            return;
        }
        let way = stray.signum();
        if self.strayed != Some(way) {
            // One odd window is not a changed world; it is not scored.
            self.strayed = Some(way);
            return;
        }
        self.strayed = None;
        for s in &mut self.scores {
            *s = None;
        }
        self.least_load = self.recent_load;
        self.home_load = self.recent_load;
        self.record(home, score);
        self.owed = [true, true];
        self.fine = [false, false];
    }

    /// The next limit after a probe in `dir` from home, whose window
    /// scored `score` with loads of mean time `load`, `full` or not.
    fn after_probe(
        &mut self,
        dir: Direction,
        score: f64,
        load: Option<Duration>,
        full: bool,
    ) -> Option<usize> {
        let probe = self.limit;
        let Some(home) = self.score(self.home) else {
            return Some(self.after_verdict(dir, probe, true));
        };
        let home_load = self.home_load;
        // Judged on this probe's own windows, never on what the limit
        // scored in an earlier probe: the world may have moved since, by
        // less than a changed world, and a stale score decides wrong.
        let passes = |x: f64, load: Option<Duration>, full: bool| match dir {
            // More loads must beat home by more than the noise, or by the
            // least margin without queueing: with loads that take no
            // longer than home's, as where the round trip, not the
            // database, bounds them (a gentle slope up, whose steps gain
            // less than the noise). Or by the least margin with full
            // loads: more loads split no batch there (keys wait beyond
            // what the loads take), which is why more loads otherwise
            // carry the burden of proof. Without this, on requests of a
            // thousand keys each the noise of their bursts held the limit
            // at 2 where 16 loads served 1.4x as much (BENCHMARKS.md, "Under overload").
            Direction::Up => {
                x > home * (1.0 + MARGIN.max(self.noise.exp_m1()))
                    || (x > home * (1.0 + MARGIN)
                        && (full
                            || load
                                .zip(home_load)
                                .is_some_and(|(l, h)| l <= h.mul_f64(1.0 + QUEUEING))))
            }
            // Fewer loads need only come within the tolerance where
            // home's loads queue (take longer than the least seen): past
            // the knee more loads add no throughput, only queueing and
            // smaller batches, which cost the database more per key. The
            // fewest that keep up are the knee. Where they do not queue
            // (the round trip bounds them), fewer must do as well.
            Direction::Down => {
                let queueing = home_load
                    .zip(self.least_load)
                    .is_some_and(|(h, least)| h > least.mul_f64(1.0 + QUEUEING));
                x >= home * (1.0 - if queueing { KNEE_TOLERANCE } else { 0.0 })
            }
        };
        // In two windows: one window that passes is as often luck, and a
        // limit moved by luck stays there until luck moves it back.
        let better = match self.confirming.take() {
            None if passes(score, load, full) => {
                self.confirming = Some((score, load, full));
                self.probing = Some(dir);
                return None;
            }
            None => false,
            Some((first, first_load, first_full)) => {
                let mean = (first + score) / 2.0;
                let mean_load = first_load.zip(load).map(|(a, b)| (a + b) / 2);
                let both_full = first_full && full;
                if passes(mean, mean_load, both_full) {
                    // Its score and load time, fresh, for the probes
                    // from it.
                    *self.slot(probe) = Some(mean);
                    self.home_load = mean_load.or(self.home_load);
                    true
                } else {
                    false
                }
            }
        };
        Some(self.after_verdict(dir, probe, better))
    }

    /// The next limit once a probe in `dir` to `probe` is judged `better`
    /// than home or not.
    fn after_verdict(&mut self, dir: Direction, probe: usize, better: bool) -> usize {
        if !better {
            self.streak = 0;
            if probe.abs_diff(self.home) > 1 {
                // Something between may still do better: one step that way
                // next, soon.
                self.fine[dir as usize] = true;
                self.owed[dir as usize] = true;
            } else {
                // Home beats its next neighbour too: the next probe this
                // way is coarse again, and later.
                self.fine[dir as usize] = false;
                self.probe_every = (self.probe_every * 2).min(PROBE_EVERY_MAX);
            }
            return self.home;
        }
        // The probe becomes home; the side it came from was just measured.
        self.fine = [false, false];
        self.home = probe;
        self.windows_at_home = 0;
        self.probe_every = PROBE_EVERY_MIN;
        self.streak += 1;
        self.owed[dir.opposite() as usize] = false;
        // Keep climbing while it pays.
        match self.neighbour(probe, dir) {
            Some(next) => {
                self.owed[dir as usize] = false;
                self.probing = Some(dir);
                next
            }
            None => {
                self.streak = 0;
                probe
            }
        }
    }

    /// The next limit after a window at home.
    fn at_home(&mut self) -> usize {
        self.windows_at_home += 1;
        if self.windows_at_home >= self.probe_every {
            self.windows_at_home = 0;
            self.owed[self.next_periodic as usize] = true;
            self.next_periodic = self.next_periodic.opposite();
        }
        if self.strayed.is_some() {
            return self.home; // see whether the world changed first
        }
        // Fewer loads first: of two owed probes, the one that may spare
        // the database.
        for dir in [Direction::Down, Direction::Up] {
            if !std::mem::take(&mut self.owed[dir as usize]) {
                continue;
            }
            if let Some(next) = self.neighbour(self.home, dir) {
                self.probing = Some(dir);
                return next;
            }
        }
        self.home
    }

    /// Puts `limit` in force and starts a new window, which counts once the
    /// loads of the old limit are likely done.
    fn set(&mut self, limit: usize, now: Instant) {
        self.limit = limit;
        let settle = (self.load_time.unwrap_or_default() * SETTLE_LOADS).max(MIN_SETTLE);
        self.window = Window::starting(now + settle);
    }
}

#[cfg(test)]
mod sim;

#[cfg(test)]
mod tests {
    use super::sim::{knee, noise, sweep, Limit, Sim, World};
    use super::*;

    /// Drives `limit` through `windows` windows of a modelled system in
    /// which a window at limit `c` scores `score(c)`: a batch every `dt`,
    /// each serving 100 callers whose response times add up to give that
    /// score. Returns the limit in force after each window, and the time
    /// reached.
    fn run(
        limit: &mut AutoLimit,
        start: Instant,
        windows: usize,
        mut score: impl FnMut(usize) -> f64,
    ) -> (Vec<usize>, Instant) {
        let load = Duration::from_millis(1);
        let dt = load / 8;
        let served = 100usize;
        let mut now = start;
        let mut seen = Vec::new();
        for _ in 0..windows {
            let at = limit.limit();
            let r = Duration::from_secs_f64(served as f64 / score(at));
            let judged = limit.judged;
            while limit.judged == judged {
                now += dt;
                limit.held_back();
                limit.completed(served, served, r, load, now);
            }
            seen.push(limit.limit());
        }
        (seen, now)
    }

    fn peaked_at(best: usize) -> impl Fn(usize) -> f64 {
        move |c| 1000.0 / (1.0 + (c as f64 - best as f64).abs() * 0.2)
    }

    #[test]
    fn climbs_to_the_peak_and_stays_near_it() {
        let now = Instant::now();
        let mut limit = AutoLimit::new(1, 16, now);
        let (seen, _) = run(&mut limit, now, 100, peaked_at(11));
        let tail = &seen[50..];
        let home_share = tail.iter().filter(|&&c| c == 11).count() as f64 / tail.len() as f64;
        // Home, but for one-window probes to either side.
        assert!(home_share > 0.8, "limits {seen:?}");
        assert_eq!(limit.home, 11);
    }

    #[test]
    fn descends_when_fewer_loads_do_better() {
        let now = Instant::now();
        let mut limit = AutoLimit::new(1, 16, now);
        let (seen, _) = run(&mut limit, now, 40, peaked_at(1));
        assert_eq!(limit.home, 1, "limits {seen:?}");
        assert!(seen[20..].iter().all(|&c| c <= 2), "{seen:?}");
    }

    #[test]
    fn never_leaves_one_to_max() {
        let now = Instant::now();
        let mut limit = AutoLimit::new(1, 6, now);
        let (seen, _) = run(&mut limit, now, 60, |c| c as f64 * 100.0);
        assert!(seen.iter().all(|&c| (1..=6).contains(&c)), "{seen:?}");
        assert_eq!(limit.home, 6, "more is always better here: {seen:?}");
        let mut one = AutoLimit::new(1, 1, now);
        let (seen, _) = run(&mut one, now, 10, |c| c as f64);
        assert!(seen.iter().all(|&c| c == 1), "{seen:?}");
    }

    #[test]
    fn a_changed_world_restarts_the_climb() {
        let now = Instant::now();
        let mut limit = AutoLimit::new(1, 16, now);
        let (_, now) = run(&mut limit, now, 60, peaked_at(3));
        assert_eq!(limit.home, 3);
        // The round trip grew: far more loads pay now, and every score fell.
        let (seen, _) = run(&mut limit, now, 40, |c| peaked_at(14)(c) / 10.0);
        assert!(
            (12..=16).contains(&limit.home),
            "home {} after {seen:?}",
            limit.home
        );
    }

    #[test]
    fn noise_neither_moves_it_far_nor_passes_for_a_changed_world() {
        let now = Instant::now();
        let mut limit = AutoLimit::new(1, 16, now);
        let mut state = 0x9e37_79b9_7f4a_7c15;
        // A flat top (4 to 6 within 2%) under ±15% noise per window.
        let shape = |c: usize| {
            1000.0
                * (1.0
                    - 0.01 * (c as f64 - 5.0).abs().max(1.0)
                    - 0.04 * (c as f64 - 5.0).abs().max(0.0).powi(2) / 4.0)
        };
        let (seen, _) = run(&mut limit, now, 300, |c| shape(c) * noise(&mut state, 0.15));
        let tail = &seen[50..];
        let near =
            tail.iter().filter(|&&c| (3..=7).contains(&c)).count() as f64 / tail.len() as f64;
        assert!(near > 0.9, "{near}: {seen:?}");
        assert!(tail.iter().all(|&c| c <= 10), "{seen:?}");
    }

    #[test]
    fn idle_windows_are_not_scored() {
        let now = Instant::now();
        let mut limit = AutoLimit::new(1, 16, now);
        let mut t = now;
        for _ in 0..1_000 {
            t += Duration::from_millis(1);
            // Never held back.
            assert_eq!(
                limit.completed(1, 1, Duration::from_millis(1), Duration::from_millis(1), t),
                None
            );
        }
        assert_eq!(limit.limit(), START);
        assert!(limit.scores.iter().all(Option::is_none));
    }

    #[test]
    fn never_goes_below_its_floor() {
        let now = Instant::now();
        let mut limit = AutoLimit::new(2, 16, now);
        let (seen, _) = run(&mut limit, now, 40, peaked_at(1));
        assert!(seen.iter().all(|&c| c >= 2), "{seen:?}");
        assert_eq!(limit.home, 2);
        assert_eq!(start(2, 16), 4);
        assert_eq!(start(2, 3), 3);
        assert_eq!(start(1, 1), 1);
    }

    #[test]
    fn neighbours_are_half_again_or_a_third_fewer_and_at_least_one_step() {
        let mut limit = AutoLimit::new(1, 16, Instant::now());
        assert_eq!(limit.neighbour(1, Direction::Down), None);
        assert_eq!(limit.neighbour(1, Direction::Up), Some(2));
        assert_eq!(limit.neighbour(2, Direction::Down), Some(1));
        assert_eq!(limit.neighbour(4, Direction::Down), Some(3));
        assert_eq!(limit.neighbour(4, Direction::Up), Some(6));
        assert_eq!(limit.neighbour(9, Direction::Down), Some(6));
        assert_eq!(limit.neighbour(9, Direction::Up), Some(13));
        assert_eq!(limit.neighbour(13, Direction::Up), Some(16));
        assert_eq!(limit.neighbour(16, Direction::Up), None);
        // After a coarse probe failed, one step.
        limit.fine[Direction::Down as usize] = true;
        assert_eq!(limit.neighbour(12, Direction::Down), Some(11));
        assert_eq!(limit.neighbour(12, Direction::Up), Some(16));
    }

    /// Drives `limit` through `windows` windows in which a window at limit
    /// `c` scores `score(c)`, its loads take `load(c)` and carry `keys(c)`
    /// keys each; home's windows stray 8% either way in turn, so the noise
    /// a probe up must beat stays about that. Returns the limits in force.
    fn run_noisy_home(
        limit: &mut AutoLimit,
        windows: usize,
        score: impl Fn(usize) -> f64,
        load: impl Fn(usize) -> Duration,
        keys: impl Fn(usize) -> usize,
    ) -> Vec<usize> {
        let mut now = Instant::now();
        let served = 64usize;
        let mut seen = Vec::new();
        for w in 0..windows {
            let at = limit.limit();
            let stray = match (limit.probing, w % 2) {
                (Some(_), _) => 1.0,
                (None, 0) => 1.08,
                (None, _) => 0.92,
            };
            let r = Duration::from_secs_f64(served as f64 / (score(at) * stray));
            let judged = limit.judged;
            while limit.judged == judged {
                now += load(at) / 8;
                limit.held_back();
                limit.completed(served, keys(at), r, load(at), now);
            }
            seen.push(limit.limit());
        }
        seen
    }

    #[test]
    fn full_loads_climb_by_the_margin_where_the_noise_would_hold_them() {
        // Each probe up (half as many loads again) gains about 6%: more
        // than the margin, less than home's 8% noise. The loads take
        // longer with more of them, as on a busy database.
        let score = |c: usize| 100.0 * (c as f64).powf(0.15);
        let load = |c: usize| Duration::from_micros(500) * u32::try_from(c).unwrap();
        let run = |keys: usize| {
            let mut limit = AutoLimit::new(1, 16, Instant::now()).with_batch_cap(64);
            let seen = run_noisy_home(&mut limit, 400, score, load, |_| keys);
            assert!(limit.noise > 0.05, "home's noise: {}", limit.noise);
            median_of(&seen[200..])
        };
        // Full loads (a request of many keys, a backlog): more loads split
        // no batch, so they need only beat home by the margin.
        let full = run(64);
        assert!(full >= 12, "full loads stayed at {full}");
        // Loads that are not full: more loads would split batches, and
        // must beat home by its noise.
        let split = run(40);
        assert!(split <= 6, "loads that were not full went to {split}");
    }

    /// The median of `xs`.
    fn median_of(xs: &[usize]) -> usize {
        let mut xs = xs.to_vec();
        xs.sort_unstable();
        xs[xs.len() / 2]
    }

    /// Auto in `world` for `warmup` and then `length`, from a fresh
    /// search between 1 and `max`.
    fn auto_in(world: &World, max: usize, warmup: Duration, length: Duration) -> sim::Measured {
        let mut sim = Sim::new(world, 11);
        let mut auto = AutoLimit::new(1, max, sim.now()).with_batch_cap(world.max_batch);
        sim.run(world, Limit::Auto(&mut auto), warmup);
        sim.run(world, Limit::Auto(&mut auto), length)
    }

    #[test]
    fn settles_at_the_knee_of_a_cpu_bound_database() {
        let world = World::cpu_bound();
        let fixed = sweep(&world, 16, Duration::from_secs(2));
        let best = fixed.iter().copied().fold(0.0, f64::max);
        let knee = knee(&fixed, 0.03);
        let auto = auto_in(&world, 16, Duration::from_secs(1), Duration::from_secs(10));
        let limit = median_of(&auto.limits);
        assert!(
            (knee..=knee + 1).contains(&limit),
            "settled at {limit}, the knee is {knee}: fixed {fixed:?}"
        );
        assert!(
            auto.per_sec >= 0.95 * best,
            "{:.0} of the best fixed {best:.0}: fixed {fixed:?}",
            auto.per_sec
        );
    }

    #[test]
    fn climbs_to_the_pool_when_the_round_trip_dominates() {
        let world = World {
            round_trip: Duration::from_millis(5),
            ..World::cpu_bound()
        };
        let fixed = sweep(&world, 16, Duration::from_secs(2));
        let best = fixed.iter().copied().fold(0.0, f64::max);
        let knee = knee(&fixed, 0.03);
        assert!(knee >= 10, "the round trip dominates: {fixed:?}");
        let auto = auto_in(&world, 16, Duration::from_secs(2), Duration::from_secs(5));
        assert!(median_of(&auto.limits) >= knee, "{:?}", auto.limits);
        assert!(auto.per_sec >= 0.95 * best, "{} of {best}", auto.per_sec);
    }

    #[test]
    fn follows_a_slowdown_and_a_speedup_within_two_seconds() {
        let fast = World {
            round_trip: Duration::from_millis(2),
            ..World::cpu_bound()
        };
        let slow = World {
            per_load: fast.per_load * 4,
            per_key: fast.per_key * 4,
            ..fast
        };
        let length = Duration::from_secs(2);
        let (fast_sweep, slow_sweep) = (sweep(&fast, 16, length), sweep(&slow, 16, length));
        let (fast_knee, slow_knee) = (knee(&fast_sweep, 0.03), knee(&slow_sweep, 0.03));
        let best = |sweep: &[f64]| sweep.iter().copied().fold(0.0, f64::max);
        let (fast_best, slow_best) = (best(&fast_sweep), best(&slow_sweep));
        assert!(fast_knee > slow_knee, "{fast_knee} {slow_knee}");
        let mut sim = Sim::new(&fast, 5);
        let mut auto = AutoLimit::new(1, 16, sim.now()).with_batch_cap(fast.max_batch);
        sim.run(&fast, Limit::Auto(&mut auto), Duration::from_secs(10));
        for (world, knee, best) in [(slow, slow_knee, slow_best), (fast, fast_knee, fast_best)] {
            sim.run(&world, Limit::Auto(&mut auto), Duration::from_secs(2));
            let after = sim.run(&world, Limit::Auto(&mut auto), Duration::from_secs(3));
            let limit = median_of(&after.limits);
            assert!(
                after.per_sec >= 0.95 * best && limit + 1 >= knee && limit <= knee + 2,
                "{:.0} of the best {best:.0}, at {limit} 2 s after the change, the knee is \
                 {knee}: {:?}",
                after.per_sec,
                after.limits
            );
        }
    }

    #[test]
    fn does_not_drift_up_over_a_minute() {
        let world = World::cpu_bound();
        let knee = knee(&sweep(&world, 16, Duration::from_secs(2)), 0.03);
        let mut sim = Sim::new(&world, 3);
        let mut auto = AutoLimit::new(1, 16, sim.now()).with_batch_cap(world.max_batch);
        let mut medians = Vec::new();
        let mut means = Vec::new();
        for _ in 0..6 {
            let ten = sim.run(&world, Limit::Auto(&mut auto), Duration::from_secs(10));
            medians.push(median_of(&ten.limits));
            means.push(ten.limits.iter().sum::<usize>() as f64 / ten.limits.len() as f64);
        }
        assert!(
            medians.iter().all(|&m| (knee..=knee + 1).contains(&m)),
            "medians per 10 s {medians:?}, the knee is {knee}"
        );
        // The first half's mean against the second's (the first 10 s
        // include the climb).
        let (first, second) = (
            means[1..3].iter().sum::<f64>() / 2.0,
            means[3..].iter().sum::<f64>() / 3.0,
        );
        assert!(
            second <= first + 0.5,
            "means per 10 s {means:?}, the knee is {knee}"
        );
    }
}
