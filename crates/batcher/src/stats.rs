//! Counters and histograms a batcher keeps about itself.
//!
//! They live in the batcher's shared state (no global registry), are updated
//! with relaxed atomics by the worker, and are read with
//! [`Batcher::stats`](crate::Batcher::stats) as a [`StatsSnapshot`], which an
//! exporter (Prometheus, logs) can turn into its own format.
//!
//! Counters that the hot path would otherwise bump from every caller
//! (requests) are counted by the worker when it receives a message, so
//! callers on different cores never contend on one cache line.

use std::sync::atomic::{AtomicU64, Ordering, Ordering::Relaxed};
use std::time::Duration;

/// A counter: an atomic, and with the `metrics` feature the handle it is
/// also reported to. It answers `fetch_add` and `load` as an `AtomicU64`
/// does, so the code that counts does not change with the feature.
#[derive(Debug, Default)]
pub(crate) struct Count {
    value: AtomicU64,
    #[cfg(feature = "metrics")]
    export: std::sync::OnceLock<::metrics::Counter>,
}

impl Count {
    pub(crate) const fn new() -> Self {
        Self {
            value: AtomicU64::new(0),
            #[cfg(feature = "metrics")]
            export: std::sync::OnceLock::new(),
        }
    }

    pub(crate) fn fetch_add(&self, by: u64, order: Ordering) -> u64 {
        #[cfg(feature = "metrics")]
        if let Some(counter) = self.export.get() {
            counter.increment(by);
        }
        self.value.fetch_add(by, order)
    }

    pub(crate) fn load(&self, order: Ordering) -> u64 {
        self.value.load(order)
    }

    /// Reports every later count to `counter` too. Called as the batcher
    /// or cache is built, before it has counted anything.
    #[cfg(feature = "metrics")]
    pub(crate) fn export(&self, counter: ::metrics::Counter) {
        let _ = self.export.set(counter);
    }
}

/// Upper bounds of the batch-size histogram buckets.
const SIZE_BOUNDS: [u64; 12] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096];

/// Upper bounds, in nanoseconds, of the duration histogram buckets:
/// 1 µs, 2 µs, 4 µs, … up to about 8.4 s, doubling each time.
const DURATION_BOUNDS: [u64; 24] = {
    let mut b = [0u64; 24];
    let mut i = 0;
    while i < 24 {
        b[i] = 1_000 << i;
        i += 1;
    }
    b
};

/// A fixed-bucket histogram that can be updated concurrently.
///
/// Hand-written rather than taken from a metrics crate because the batcher
/// must not require a global recorder, and a dozen atomics is all it needs.
#[derive(Debug)]
pub(crate) struct Histogram<const N: usize> {
    bounds: &'static [u64; N],
    /// One more than `bounds`: the last bucket counts values above every bound.
    buckets: [AtomicU64; N],
    overflow: AtomicU64,
    sum: AtomicU64,
    count: AtomicU64,
    max: AtomicU64,
    unit: HistogramUnit,
    /// With the `metrics` feature: where each value goes too, and the
    /// factor to its unit (nanoseconds to seconds for durations).
    #[cfg(feature = "metrics")]
    export: std::sync::OnceLock<(::metrics::Histogram, f64)>,
}

impl<const N: usize> Histogram<N> {
    const fn new(bounds: &'static [u64; N], unit: HistogramUnit) -> Self {
        Self {
            bounds,
            buckets: [const { AtomicU64::new(0) }; N],
            overflow: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            count: AtomicU64::new(0),
            max: AtomicU64::new(0),
            unit,
            #[cfg(feature = "metrics")]
            export: std::sync::OnceLock::new(),
        }
    }

    /// Reports every later value to `histogram` too, times `scale`.
    #[cfg(feature = "metrics")]
    pub(crate) fn export(&self, histogram: ::metrics::Histogram, scale: f64) {
        let _ = self.export.set((histogram, scale));
    }

    pub(crate) fn record(&self, value: u64) {
        #[cfg(feature = "metrics")]
        if let Some((histogram, scale)) = self.export.get() {
            histogram.record(value as f64 * scale);
        }
        let idx = self.bounds.partition_point(|&b| b < value);
        match self.buckets.get(idx) {
            Some(bucket) => bucket.fetch_add(1, Relaxed),
            None => self.overflow.fetch_add(1, Relaxed),
        };
        self.sum.fetch_add(value, Relaxed);
        self.count.fetch_add(1, Relaxed);
        // A read first: a new maximum is rare, and the read does not take
        // the cache line from the other cores that record.
        if value > self.max.load(Relaxed) {
            self.max.fetch_max(value, Relaxed);
        }
    }

    fn snapshot(&self) -> HistogramSnapshot {
        let mut buckets: Vec<(u64, u64)> = self
            .bounds
            .iter()
            .zip(&self.buckets)
            .map(|(&b, c)| (b, c.load(Relaxed)))
            .collect();
        buckets.push((u64::MAX, self.overflow.load(Relaxed)));
        HistogramSnapshot {
            buckets,
            sum: self.sum.load(Relaxed),
            count: self.count.load(Relaxed),
            max: self.max.load(Relaxed),
            unit: self.unit,
        }
    }
}

/// What a histogram's values count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HistogramUnit {
    /// Keys (a load's distinct keys).
    Keys,
    /// Nanoseconds (a wait or a load's time); read them with the
    /// `*_duration` accessors.
    Nanoseconds,
}

/// A point-in-time copy of one histogram.
///
/// Its raw values ([`buckets`](Self::buckets), [`sum`](Self::sum),
/// [`mean`](Self::mean), [`max`](Self::max)) are in its
/// [`unit`](Self::unit): keys, or nanoseconds for durations, which the
/// `*_duration` accessors give as a [`Duration`]. `Debug` prints a summary
/// (count, mean, max, the p50 and p99 buckets), not the buckets.
#[derive(Clone, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// `(upper_bound, count)` per bucket, not cumulative, in ascending order
    /// of bound. The last bucket has bound `u64::MAX` and counts everything
    /// above the previous bound. Durations are in nanoseconds.
    pub buckets: Vec<(u64, u64)>,
    /// The sum of all recorded values (nanoseconds for durations).
    pub sum: u64,
    /// How many values were recorded.
    pub count: u64,
    max: u64,
    unit: HistogramUnit,
}

impl HistogramSnapshot {
    /// What the values count.
    pub fn unit(&self) -> HistogramUnit {
        self.unit
    }

    /// The mean of the recorded values, or `None` if nothing was recorded.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum as f64 / self.count as f64)
    }

    /// The largest value recorded, or `None` if nothing was recorded.
    pub fn max(&self) -> Option<u64> {
        (self.count > 0).then_some(self.max)
    }

    /// The mean, for a histogram of durations; `None` if nothing was
    /// recorded or the values are not durations.
    pub fn mean_duration(&self) -> Option<Duration> {
        self.as_duration(self.mean()?.round() as u64)
    }

    /// The largest duration recorded; `None` as for
    /// [`mean_duration`](Self::mean_duration).
    pub fn max_duration(&self) -> Option<Duration> {
        self.as_duration(self.max()?)
    }

    /// [`quantile_upper_bound`](Self::quantile_upper_bound) as a duration
    /// (the largest one recorded for the last bucket, which has no bound);
    /// `None` as for [`mean_duration`](Self::mean_duration).
    pub fn quantile_duration(&self, q: f64) -> Option<Duration> {
        let bound = self.quantile_upper_bound(q)?;
        self.as_duration(bound.min(self.max))
    }

    fn as_duration(&self, nanos: u64) -> Option<Duration> {
        (self.unit == HistogramUnit::Nanoseconds).then(|| Duration::from_nanos(nanos))
    }

    /// An upper bound of the `q`-quantile (`0.0..=1.0`): the bound of the
    /// bucket that holds it. `None` if nothing was recorded.
    pub fn quantile_upper_bound(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for &(bound, n) in &self.buckets {
            seen += n;
            if seen >= rank {
                return Some(bound);
            }
        }
        self.buckets.last().map(|b| b.0)
    }
}

impl std::fmt::Debug for HistogramSnapshot {
    /// `HistogramSnapshot { count: 4, mean: 3.25ms, max: 9ms, p50_at_most:
    /// 1.024ms, p99_at_most: 9ms }`: the buckets are left out (the
    /// struct's fields and accessors give them).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut out = f.debug_struct("HistogramSnapshot");
        out.field("count", &self.count);
        if self.count > 0 {
            // Each is `Some` once something was recorded.
            let at = |q: f64| self.quantile_upper_bound(q).unwrap_or(0).min(self.max);
            let span = |d: Option<Duration>| d.unwrap_or_default();
            match self.unit {
                HistogramUnit::Nanoseconds => out
                    .field("mean", &span(self.mean_duration()))
                    .field("max", &span(self.max_duration()))
                    .field("p50_at_most", &span(self.quantile_duration(0.5)))
                    .field("p99_at_most", &span(self.quantile_duration(0.99))),
                HistogramUnit::Keys => out
                    .field("mean", &format_args!("{:.1}", self.mean().unwrap_or(0.0)))
                    .field("max", &self.max)
                    .field("p50_at_most", &at(0.5))
                    .field("p99_at_most", &at(0.99)),
            };
        }
        out.finish()
    }
}

/// The live counters of one batcher.
#[derive(Debug)]
pub(crate) struct Stats {
    pub(crate) requests: Count,
    pub(crate) deduplicated: Count,
    pub(crate) joined_in_flight: Count,
    pub(crate) abandoned: Count,
    pub(crate) overloaded: Count,
    pub(crate) timed_out: Count,
    pub(crate) batches: Count,
    pub(crate) found: Count,
    pub(crate) not_found: Count,
    pub(crate) failed_batches: Count,
    pub(crate) failed_keys: Count,
    pub(crate) panicked_batches: Count,
    pub(crate) timed_out_batches: Count,
    pub(crate) pending_keys: AtomicU64,
    pub(crate) in_flight_batches: AtomicU64,
    pub(crate) scopes: AtomicU64,
    /// The automatic limit's least and latest window mean load times, in
    /// nanoseconds (0: none yet, or a fixed limit).
    pub(crate) load_time_least: AtomicU64,
    pub(crate) load_time_recent: AtomicU64,
    pub(crate) batch_size: Histogram<12>,
    pub(crate) queue_wait: Histogram<24>,
    pub(crate) load_duration: Histogram<24>,
    /// With the `metrics` feature: the gauges the worker sets.
    #[cfg(feature = "metrics")]
    pub(crate) gauges: std::sync::OnceLock<crate::metrics::Gauges>,
    /// Loads and keys per scope, when asked for
    /// ([`scope_stats`](crate::BatcherBuilder::scope_stats)).
    pub(crate) by_scope: std::sync::OnceLock<ScopeCounts>,
}

/// One scope's figures, in [`StatsSnapshot::by_scope`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScopeStats {
    /// Loads run as the scope.
    pub loads: u64,
    /// Distinct keys those loads carried.
    pub keys: u64,
}

/// The name under which scopes past the cap are counted together.
pub const OTHER_SCOPES: &str = "other";

/// Loads and keys per scope, by the name the loader gives the scope
/// ([`ScopedLoader::label`](crate::ScopedLoader::label)), for at most
/// `most` names; later names count under [`OTHER_SCOPES`], so a service
/// with many tenants keeps a bounded map (and, with `metrics`, a bounded
/// number of label values).
#[derive(Debug)]
pub(crate) struct ScopeCounts {
    most: usize,
    /// std Mutex: held for one map update per load, never across an await.
    by_name: std::sync::Mutex<std::collections::HashMap<String, ScopeStats>>,
    /// With `metrics`: the batcher's name, for the counters' labels.
    #[cfg(feature = "metrics")]
    batcher: String,
}

impl ScopeCounts {
    pub(crate) fn new(most: usize, batcher: &str) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = batcher;
        Self {
            most,
            by_name: std::sync::Mutex::new(std::collections::HashMap::new()),
            #[cfg(feature = "metrics")]
            batcher: batcher.to_owned(),
        }
    }

    /// A load of `keys` keys as the scope named `name` (unnamed scopes
    /// count as [`OTHER_SCOPES`]).
    pub(crate) fn record(&self, name: Option<String>, keys: usize) {
        let mut by_name = self
            .by_name
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let name = match name {
            Some(name) if by_name.contains_key(&name) || by_name.len() < self.most => name,
            _ => OTHER_SCOPES.to_owned(),
        };
        #[cfg(feature = "metrics")]
        {
            let labels = [("batcher", self.batcher.clone()), ("scope", name.clone())];
            ::metrics::counter!("pgbatch_batcher_scope_loads_total", &labels).increment(1);
            ::metrics::counter!("pgbatch_batcher_scope_keys_total", &labels).increment(keys as u64);
        }
        let counts = by_name.entry(name).or_default();
        counts.loads += 1;
        counts.keys += keys as u64;
    }

    fn snapshot(&self) -> Vec<(String, ScopeStats)> {
        let by_name = self
            .by_name
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut all: Vec<(String, ScopeStats)> =
            by_name.iter().map(|(n, s)| (n.clone(), *s)).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

impl Stats {
    pub(crate) const fn new() -> Self {
        Self {
            requests: Count::new(),
            deduplicated: Count::new(),
            joined_in_flight: Count::new(),
            abandoned: Count::new(),
            overloaded: Count::new(),
            timed_out: Count::new(),
            batches: Count::new(),
            found: Count::new(),
            not_found: Count::new(),
            failed_batches: Count::new(),
            failed_keys: Count::new(),
            panicked_batches: Count::new(),
            timed_out_batches: Count::new(),
            pending_keys: AtomicU64::new(0),
            in_flight_batches: AtomicU64::new(0),
            scopes: AtomicU64::new(0),
            load_time_least: AtomicU64::new(0),
            load_time_recent: AtomicU64::new(0),
            batch_size: Histogram::new(&SIZE_BOUNDS, HistogramUnit::Keys),
            queue_wait: Histogram::new(&DURATION_BOUNDS, HistogramUnit::Nanoseconds),
            load_duration: Histogram::new(&DURATION_BOUNDS, HistogramUnit::Nanoseconds),
            #[cfg(feature = "metrics")]
            gauges: std::sync::OnceLock::new(),
            by_scope: std::sync::OnceLock::new(),
        }
    }

    /// Reports every figure through the `metrics` facade too, under
    /// `batcher="name"` (names in [`crate::metrics`]).
    #[cfg(feature = "metrics")]
    pub(crate) fn export(&self, name: &str) {
        use crate::metrics::{export_counters, Gauges, SECONDS_PER_NANO};
        use ::metrics::{describe_gauge, describe_histogram, gauge, histogram, Unit};

        let label = [("batcher", name.to_owned())];
        export_counters!(&label;
            self.requests => "pgbatch_batcher_requests_total", "Keys asked for, duplicates included.";
            self.batches => "pgbatch_batcher_loads_total", "Loads started.";
            self.overloaded => "pgbatch_batcher_shed_total",
                "Requests refused because the queue was full.";
            self.timed_out => "pgbatch_batcher_timeouts_total", "Requests whose deadline passed.";
            self.abandoned => "pgbatch_batcher_abandoned_total",
                "Requests whose caller left before their load.";
            self.deduplicated => "pgbatch_batcher_deduplicated_total",
                "Requests merged into a key already in the load.";
            self.joined_in_flight => "pgbatch_batcher_joined_in_flight_total",
                "Requests joined to a running load of their key.";
            self.found => "pgbatch_batcher_keys_found_total", "Keys a load returned.";
            self.not_found => "pgbatch_batcher_keys_not_found_total", "Keys a load did not return.";
            self.failed_batches => "pgbatch_batcher_failed_loads_total",
                "Loads that returned an error.";
            self.panicked_batches => "pgbatch_batcher_panicked_loads_total",
                "Loads whose loader panicked.";
            self.timed_out_batches => "pgbatch_batcher_timed_out_loads_total",
                "Loads abandoned at the load timeout.";
            self.failed_keys => "pgbatch_batcher_failed_keys_total",
                "Distinct keys of failed, panicked and timed-out loads.";
        );
        let histogram = |name: &'static str, unit, what: &'static str| {
            describe_histogram!(name, unit, what);
            histogram!(name, &label)
        };
        self.batch_size.export(
            histogram(
                "pgbatch_batcher_load_keys",
                Unit::Count,
                "Distinct keys per load.",
            ),
            1.0,
        );
        self.load_duration.export(
            histogram(
                "pgbatch_batcher_load_duration_seconds",
                Unit::Seconds,
                "A load's time.",
            ),
            SECONDS_PER_NANO,
        );
        self.queue_wait.export(
            histogram(
                "pgbatch_batcher_queue_wait_seconds",
                Unit::Seconds,
                "A request's wait from enqueue to its load's start.",
            ),
            SECONDS_PER_NANO,
        );
        let gauge = |name: &'static str, unit, what: &'static str| {
            describe_gauge!(name, unit, what);
            gauge!(name, &label)
        };
        let _ = self.gauges.set(Gauges {
            in_flight: gauge("pgbatch_batcher_loads_in_flight", Unit::Count, "Loads running."),
            limit: gauge(
                "pgbatch_batcher_concurrency_limit",
                Unit::Count,
                "Loads allowed at once: the automatic limit where it stands, or the fixed one.",
            ),
            load_least: gauge(
                "pgbatch_batcher_load_duration_least_seconds",
                Unit::Seconds,
                "The automatic limit's least mean load time of a measurement window since the world last changed.",
            ),
            load_recent: gauge(
                "pgbatch_batcher_load_duration_recent_seconds",
                Unit::Seconds,
                "The automatic limit's last measurement window's mean load time.",
            ),
            pending: gauge(
                "pgbatch_batcher_pending_keys",
                Unit::Count,
                "Keys gathered for the next load.",
            ),
            queued: gauge(
                "pgbatch_batcher_queued_requests",
                Unit::Count,
                "Requests not yet taken by the worker.",
            ),
            scopes: gauge(
                "pgbatch_batcher_scopes",
                Unit::Count,
                "Scopes with keys waiting or loads running.",
            ),
        });
    }

    pub(crate) fn incr(counter: &Count, by: u64) {
        counter.fetch_add(by, Relaxed);
    }

    pub(crate) fn record_duration<const N: usize>(h: &Histogram<N>, d: Duration) {
        h.record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Records the automatic limit's window load times.
    pub(crate) fn set_load_times(&self, least: Option<Duration>, recent: Option<Duration>) {
        let ns = |d: Option<Duration>| {
            d.map_or(0, |d| {
                u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
            })
        };
        self.load_time_least.store(ns(least), Relaxed);
        self.load_time_recent.store(ns(recent), Relaxed);
    }

    /// Publishes the worker's gauges: keys pending, loads running, the
    /// limit in force, scopes with a lane, requests queued (read only if
    /// exported: it takes the queue's lock).
    pub(crate) fn publish(
        &self,
        pending: usize,
        running: usize,
        limit: usize,
        scopes: usize,
        queued: impl FnOnce() -> usize,
    ) {
        self.pending_keys.store(pending as u64, Relaxed);
        self.in_flight_batches.store(running as u64, Relaxed);
        self.scopes.store(scopes as u64, Relaxed);
        #[cfg(feature = "metrics")]
        if let Some(gauges) = self.gauges.get() {
            gauges.pending.set(pending as f64);
            gauges.in_flight.set(running as f64);
            gauges.limit.set(limit as f64);
            gauges.scopes.set(scopes as f64);
            // Only the automatic limit has them (0: none).
            for (gauge, ns) in [
                (&gauges.load_least, &self.load_time_least),
                (&gauges.load_recent, &self.load_time_recent),
            ] {
                let ns = ns.load(Relaxed);
                if ns != 0 {
                    gauge.set(ns as f64 * 1e-9);
                }
            }
            gauges.queued.set(queued() as f64);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (limit, queued);
    }

    pub(crate) fn snapshot(&self, queued: usize, concurrency_limit: usize) -> StatsSnapshot {
        StatsSnapshot {
            concurrency_limit: concurrency_limit as u64,
            requests: self.requests.load(Relaxed),
            deduplicated: self.deduplicated.load(Relaxed),
            joined_in_flight: self.joined_in_flight.load(Relaxed),
            abandoned: self.abandoned.load(Relaxed),
            overloaded: self.overloaded.load(Relaxed),
            timed_out: self.timed_out.load(Relaxed),
            batches: self.batches.load(Relaxed),
            found: self.found.load(Relaxed),
            not_found: self.not_found.load(Relaxed),
            failed_batches: self.failed_batches.load(Relaxed),
            failed_keys: self.failed_keys.load(Relaxed),
            panicked_batches: self.panicked_batches.load(Relaxed),
            timed_out_batches: self.timed_out_batches.load(Relaxed),
            queued: queued as u64,
            pending_keys: self.pending_keys.load(Relaxed),
            in_flight_batches: self.in_flight_batches.load(Relaxed),
            scopes: self.scopes.load(Relaxed),
            load_time_least: nanos(self.load_time_least.load(Relaxed)),
            load_time_recent: nanos(self.load_time_recent.load(Relaxed)),
            batch_size: self.batch_size.snapshot(),
            queue_wait: self.queue_wait.snapshot(),
            load_duration: self.load_duration.snapshot(),
            by_scope: self
                .by_scope
                .get()
                .map(ScopeCounts::snapshot)
                .unwrap_or_default(),
        }
    }
}

/// A point-in-time copy of a batcher's counters, from
/// [`Batcher::stats`](crate::Batcher::stats).
///
/// Counters only grow; `queued`, `pending_keys`, `in_flight_batches`,
/// `scopes` and `concurrency_limit` are gauges. Failed, panicked and timed-out batches are counted separately;
/// `failed_keys` counts the distinct keys of all three kinds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StatsSnapshot {
    /// Requests the worker received (one per key, duplicates included).
    pub requests: u64,
    /// Requests merged into a key already waiting in the same batch.
    pub deduplicated: u64,
    /// Requests attached to a load already running for the same key.
    pub joined_in_flight: u64,
    /// Requests whose caller went away before dispatch, so they were never
    /// loaded, or before the worker timed them out.
    pub abandoned: u64,
    /// Requests rejected because the queue was full, or because the worker
    /// already held as many waiters as it may.
    pub overloaded: u64,
    /// Requests whose caller's deadline passed.
    pub timed_out: u64,
    /// Batches handed to the loader.
    pub batches: u64,
    /// Distinct keys the loader returned a value for.
    pub found: u64,
    /// Distinct keys the loader was asked for and did not return.
    pub not_found: u64,
    /// Batches whose load returned an error.
    pub failed_batches: u64,
    /// Distinct keys in failed, panicked or timed-out batches, and keys a
    /// load failed on their own (see [`Loaded::fail`](crate::Loaded::fail)).
    pub failed_keys: u64,
    /// Batches whose loader panicked.
    pub panicked_batches: u64,
    /// Batches abandoned after the load timeout.
    pub timed_out_batches: u64,
    /// Requests sitting in the channel, not yet seen by the worker.
    pub queued: u64,
    /// Distinct keys the worker holds for the next batch.
    pub pending_keys: u64,
    /// Loads running now.
    pub in_flight_batches: u64,
    /// Scopes with keys waiting or loads running now (1 for an unscoped
    /// batcher while it is busy, 0 when idle).
    pub scopes: u64,
    /// How many loads may run at once now: the fixed
    /// [`Concurrency`](crate::Concurrency), or where the automatic one
    /// stands.
    pub concurrency_limit: u64,
    /// Under the automatic limit, the least mean load time of a
    /// measurement window since the world last changed (about 50 ms of
    /// loads each): a load's time with the least queueing in the database.
    pub load_time_least: Option<Duration>,
    /// Under the automatic limit, the last window's mean load time. Well
    /// above [`load_time_least`](Self::load_time_least) with no more keys
    /// per second means loads queue in the database.
    pub load_time_recent: Option<Duration>,
    /// Distinct keys per dispatched batch.
    pub batch_size: HistogramSnapshot,
    /// Time from a request's enqueue to its batch's dispatch, in nanoseconds.
    pub queue_wait: HistogramSnapshot,
    /// Time from a load's start to the loader's completion, in nanoseconds.
    pub load_duration: HistogramSnapshot,
    /// Loads and keys per scope, by the scope's name, sorted by it: empty
    /// unless the batcher was built with
    /// [`scope_stats`](crate::BatcherBuilder::scope_stats).
    pub by_scope: Vec<(String, ScopeStats)>,
}

/// A stored duration in nanoseconds, 0 meaning none.
fn nanos(ns: u64) -> Option<Duration> {
    (ns != 0).then(|| Duration::from_nanos(ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_values_by_upper_bound() {
        static BOUNDS: [u64; 3] = [1, 4, 16];
        let h = Histogram::new(&BOUNDS, HistogramUnit::Keys);
        for v in [0, 1, 2, 4, 5, 16, 17, 1000] {
            h.record(v);
        }
        let s = h.snapshot();
        assert_eq!(s.buckets, vec![(1, 2), (4, 2), (16, 2), (u64::MAX, 2)]);
        assert_eq!(s.count, 8);
        assert_eq!(s.sum, 1045);
        assert_eq!(s.quantile_upper_bound(0.5), Some(4));
        assert_eq!(s.quantile_upper_bound(1.0), Some(u64::MAX));
        assert_eq!(s.quantile_upper_bound(0.0), Some(1));
        assert_eq!(s.max(), Some(1000));
        assert_eq!(s.unit(), HistogramUnit::Keys);
        assert_eq!(s.max_duration(), None, "keys are no duration");
    }

    #[test]
    fn a_duration_histogram_reads_as_durations_and_prints_in_one_line() {
        let h = Histogram::new(&DURATION_BOUNDS, HistogramUnit::Nanoseconds);
        for ms in [1, 1, 2, 9] {
            h.record(ms * 1_000_000);
        }
        let s = h.snapshot();
        assert_eq!(s.max_duration(), Some(Duration::from_millis(9)));
        assert_eq!(s.mean_duration(), Some(Duration::from_micros(3250)));
        // The bucket bound of 1 ms is 1,024 µs; the top one, past the
        // largest value, reads as that value.
        assert_eq!(s.quantile_duration(0.5), Some(Duration::from_micros(1024)));
        assert_eq!(s.quantile_duration(1.0), Some(Duration::from_millis(9)));
        let shown = format!("{s:?}");
        assert_eq!(
            shown,
            "HistogramSnapshot { count: 4, mean: 3.25ms, max: 9ms, \
             p50_at_most: 1.024ms, p99_at_most: 9ms }"
        );
        let empty = Histogram::new(&SIZE_BOUNDS, HistogramUnit::Keys).snapshot();
        assert_eq!(format!("{empty:?}"), "HistogramSnapshot { count: 0 }");
        assert_eq!(empty.max(), None);
    }

    #[test]
    fn empty_histogram_has_no_mean_or_quantile() {
        let s = Stats::new().snapshot(0, 1);
        assert_eq!(s.batch_size.mean(), None);
        assert_eq!(s.queue_wait.quantile_upper_bound(0.99), None);
    }

    #[test]
    fn duration_bounds_double_from_one_microsecond() {
        assert_eq!(DURATION_BOUNDS[0], 1_000);
        assert_eq!(DURATION_BOUNDS[1], 2_000);
        assert_eq!(DURATION_BOUNDS[23], 1_000 << 23);
    }
}
