//! The validated settings a batcher runs with, the choices they offer, and
//! their defaults. Everything here is plain data: the builder fills it in,
//! and the handle, the worker and the flush policy read it.

use std::borrow::Cow;
use std::time::Duration;

use tokio::time::Instant;

/// When a batch that is not yet full goes to the loader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FlushPolicy {
    /// Dispatch at once whenever a load slot is free; keys accumulate only
    /// while every slot the [`Concurrency`] allows is busy. An idle batcher adds no delay, and under load batches
    /// fill by themselves. `max_delay` is not used. The default.
    #[default]
    Eager,
    /// Dispatch when the batch reaches `max_batch_size`, or `max_delay` after
    /// its first key arrived (the lakeFS design). Every lookup at low load
    /// pays up to `max_delay`; kept for comparison and for loaders that
    /// prefer fewer, fuller batches.
    FixedDelay,
    /// Eager while the backend is lightly loaded, fixed-delay once it is
    /// busy: a batch goes out at once while fewer than half of the
    /// loads the [`Concurrency`] allows are running; with at least half
    /// running, it waits until it is full or `max_delay` after its first
    /// key. Low load pays no delay (as with `Eager`), and under saturation
    /// batches fill (as with `FixedDelay`) instead of going out as soon as
    /// any one slot frees. Under heavy read load on Postgres this made
    /// bigger batches and more reads per second than `Eager`; see
    /// BENCHMARKS.md.
    Adaptive,
}

/// How many loads a batcher runs at once, and so how big its batches grow:
/// with `n` callers and `c` loads in flight, batches hold about `n / c` keys.
///
/// Fewer loads mean bigger batches and less fixed cost per statement, until
/// the database idles between loads; more loads keep a distant database
/// busy. The right number moves with the machine, the data and the round
/// trip, which is why the default finds it by measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Concurrency {
    /// Found by measurement and kept adapting: between 1 and `max` loads at
    /// once (set `max` to the connections the loader may use, such as the
    /// pool size). The worker compares, window by window, how many callers
    /// it served per second and how long they waited, tries a limit a
    /// little above and below the current one, and keeps the better; it
    /// probes again from time to time, and at once when the measurements
    /// shift (the database slowed down, the round trip changed). See
    /// [`BatcherBuilder::concurrency`](crate::BatcherBuilder::concurrency).
    Auto {
        /// The most loads at once, never exceeded.
        max: usize,
    },
    /// Exactly up to this many loads at once.
    Fixed(usize),
}

impl Concurrency {
    /// The most loads that may ever run at once.
    pub fn max(self) -> usize {
        match self {
            Concurrency::Auto { max } | Concurrency::Fixed(max) => max,
        }
    }

    /// Whether the limit is found by measurement.
    pub fn is_auto(self) -> bool {
        matches!(self, Concurrency::Auto { .. })
    }
}

impl Default for Concurrency {
    fn default() -> Self {
        defaults::CONCURRENCY
    }
}

/// What [`Batcher::load`](crate::Batcher::load) does when the request queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Overflow {
    /// Fail at once with [`Error::Overloaded`](crate::Error::Overloaded), so
    /// an overloaded service sheds load instead of queueing. The default.
    #[default]
    Reject,
    /// Wait for room in the queue (still bounded by the request's
    /// [`timeout`](crate::BatcherBuilder::timeout)).
    Wait,
}

/// The default settings of [`BatcherBuilder`](crate::BatcherBuilder).
pub mod defaults {
    use std::time::Duration;

    /// Default [`max_batch_size`](crate::BatcherBuilder::max_batch_size):
    /// 1024 keys. An eager batcher's load reaches it only under a backlog:
    /// while another load slot is free, a load takes at most
    /// [`SPREAD_BATCH_SIZE`] keys, so a burst is spread over parallel
    /// loads; the load that takes the last free slot takes its share of
    /// what waits (divided among the slots, at least 64), up to this. So
    /// when keys arrive faster than loads of 64 serve them, batches grow
    /// instead of the backlog (at a fixed arrival rate, loads capped at 64
    /// keys fell behind where a DataLoader's loads of 400 kept up; see
    /// BENCHMARKS.md).
    pub const MAX_BATCH_SIZE: usize = 1024;
    /// The most keys an eager batcher's load takes while another load slot
    /// stays free after it, below
    /// [`max_batch_size`](crate::BatcherBuilder::max_batch_size): 64.
    /// lakeFS saw gains flatten past 16-32 keys on Postgres; past that, a
    /// free connection serves the keys sooner than a bigger batch. The
    /// policies that wait for a batch to fill never split one.
    pub const SPREAD_BATCH_SIZE: usize = 64;
    /// Default [`max_delay`](crate::BatcherBuilder::max_delay): 0.5 ms, as in
    /// lakeFS.
    pub const MAX_DELAY: Duration = Duration::from_micros(500);
    /// The bound of the default [`CONCURRENCY`]: 16 loads at once, the
    /// size of [`PoolOptions`]' default pool (feature `postgres`).
    ///
    /// [`PoolOptions`]: https://docs.rs/pgbatch/latest/pgbatch/pg/struct.PoolOptions.html
    pub const MAX_CONCURRENT_BATCHES: usize = 16;
    /// Default [`concurrency`](crate::BatcherBuilder::concurrency): found by
    /// measurement, at most [`MAX_CONCURRENT_BATCHES`] loads at once.
    pub const CONCURRENCY: super::Concurrency = super::Concurrency::Auto {
        max: MAX_CONCURRENT_BATCHES,
    };
    /// Default [`channel_capacity`](crate::BatcherBuilder::channel_capacity):
    /// 8192 requests.
    pub const CHANNEL_CAPACITY: usize = 8192;
    /// Default [`timeout`](crate::BatcherBuilder::timeout): 5 s, so no caller
    /// can wait forever on a stuck loader.
    pub const TIMEOUT: Duration = Duration::from_secs(5);
}

/// The validated settings a worker and its handles share.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) name: Cow<'static, str>,
    pub(crate) max_batch_size: usize,
    /// The most keys a load takes while another slot stays free (see
    /// [`defaults::SPREAD_BATCH_SIZE`]); fixed, but varied by the ledger's
    /// simulation.
    pub(crate) spread_batch_size: usize,
    pub(crate) max_delay: Duration,
    pub(crate) concurrency: Concurrency,
    pub(crate) channel_capacity: usize,
    pub(crate) policy: FlushPolicy,
    pub(crate) overflow: Overflow,
    pub(crate) timeout: Option<Duration>,
    pub(crate) load_timeout: Option<Duration>,
    pub(crate) join_in_flight: bool,
    pub(crate) direct_when_idle: bool,
    /// The most scope names counted apart (0: no counts per scope).
    pub(crate) scope_stats: usize,
    /// The most scopes one load serves, below what the loader allows.
    pub(crate) scopes_per_load: usize,
}

impl Config {
    /// When a request made at `from` times out. A timeout too large to add
    /// is no deadline at all.
    pub(crate) fn deadline(&self, from: Instant) -> Option<Instant> {
        self.timeout.and_then(|t| from.checked_add(t))
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            name: Cow::Borrowed("batcher"),
            max_batch_size: defaults::MAX_BATCH_SIZE,
            spread_batch_size: defaults::SPREAD_BATCH_SIZE,
            max_delay: defaults::MAX_DELAY,
            concurrency: defaults::CONCURRENCY,
            channel_capacity: defaults::CHANNEL_CAPACITY,
            policy: FlushPolicy::Eager,
            overflow: Overflow::Reject,
            timeout: Some(defaults::TIMEOUT),
            load_timeout: None,
            join_in_flight: false,
            direct_when_idle: true,
            scope_stats: 0,
            scopes_per_load: usize::MAX,
        }
    }
}
