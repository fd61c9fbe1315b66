//! Configuration of a [`Batcher`](super::Batcher).

use std::borrow::Cow;
use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::config::{Concurrency, Config, FlushPolicy, Overflow};
use super::handle::Batcher;
use super::loader::{Loader, ScopedLoader};
use super::run;
use super::worker::Worker;
use crate::BuildError;

/// A batcher handle and its not yet running worker.
pub type Pair<K, V, S = ()> = (Batcher<K, V, S>, Worker<K, V, S>);

/// Builds a [`Batcher`]; get one from [`Batcher::builder`].
///
/// ```
/// use std::time::Duration;
/// use pgbatch::{Batcher, Concurrency, FlushPolicy};
/// # use std::collections::HashMap;
/// # use std::convert::Infallible;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let loader = pgbatch::loader_fn(|keys: Vec<u32>| async move {
/// #     Ok::<_, Infallible>(keys.into_iter().map(|k| (k, k)).collect::<HashMap<_, _>>())
/// # });
/// let batcher: Batcher<u32, u32> = Batcher::builder()
///     .name("objects")
///     .max_batch_size(32)
///     .concurrency(Concurrency::Auto { max: 16 }) // the default: found by measurement
///     .policy(FlushPolicy::Eager)
///     .timeout(Duration::from_millis(500))
///     .build(loader)?;
/// # Ok(()) }
/// ```
#[must_use = "builder does nothing until .build()"]
pub struct BatcherBuilder<K, V> {
    config: Config,
    _types: PhantomData<fn(K) -> V>,
}

impl<K, V> fmt::Debug for BatcherBuilder<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatcherBuilder")
            .field("config", &self.config)
            .finish()
    }
}

impl<K, V> Batcher<K, V>
where
    K: Clone + Eq + Hash + Send + 'static,
    V: Clone + Send + 'static,
{
    /// Starts configuring a batcher. (Here rather than beside `Batcher`,
    /// so that this module uses `handle` and not the other way round.)
    pub fn builder() -> BatcherBuilder<K, V> {
        BatcherBuilder::default()
    }
}

impl<K, V> Default for BatcherBuilder<K, V> {
    fn default() -> Self {
        Self {
            config: Config::default(),
            _types: PhantomData,
        }
    }
}

impl<K, V> BatcherBuilder<K, V>
where
    K: Clone + Eq + Hash + Send + 'static,
    V: Clone + Send + 'static,
{
    /// A name for this batcher in tracing spans and events. Default
    /// `"batcher"`.
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.config.name = name.into();
        self
    }

    /// The most distinct keys in one loader call, never exceeded. Must be
    /// at least 1. Default
    /// [`defaults::MAX_BATCH_SIZE`](crate::defaults::MAX_BATCH_SIZE), 1024.
    ///
    /// With the eager policy (the default), loads hold fewer until they
    /// must: while another load slot is free, a load takes at most
    /// [`defaults::SPREAD_BATCH_SIZE`](crate::defaults::SPREAD_BATCH_SIZE)
    /// (64) keys, so a burst goes out as parallel loads; the load that
    /// takes the last free slot takes its share of the keys waiting (what
    /// waits divided among the slots), at least 64 and at most this. So a
    /// load grows past 64 keys only under a backlog, where a bigger batch
    /// serves the keys sooner than a wait for another slot. The policies
    /// that wait for a batch to fill ([`FlushPolicy::FixedDelay`],
    /// [`FlushPolicy::Adaptive`]) fill batches up to this whole.
    pub fn max_batch_size(mut self, n: usize) -> Self {
        self.config.max_batch_size = n;
        self
    }

    /// With [`FlushPolicy::FixedDelay`] (and [`FlushPolicy::Adaptive`] when
    /// busy), how long after a batch's first key it is dispatched even if
    /// not full. Unused by the eager policy.
    /// Default [`defaults::MAX_DELAY`](crate::defaults::MAX_DELAY).
    pub fn max_delay(mut self, d: Duration) -> Self {
        self.config.max_delay = d;
        self
    }

    /// How many loader calls run at once, and so how big batches grow.
    /// Default [`defaults::CONCURRENCY`](crate::defaults::CONCURRENCY):
    /// [`Concurrency::Auto`], found by measurement, at most 16.
    ///
    /// Give the automatic limit a `max` no larger than the connections the
    /// loader may use (the pool's size): more loads than connections only
    /// wait for the pool. It starts at the square root of `max` (4 of 16),
    /// and moves a step at a time towards whatever serves callers fastest,
    /// measured over windows of at least 50 ms and 64 loads: tens of
    /// milliseconds next to a database, longer across a slow network. It
    /// never goes below 2 while callers may load directly
    /// ([`direct_when_idle`](Self::direct_when_idle)), nor above `max`.
    /// [`Batcher::stats`]'s `concurrency_limit` shows where it stands.
    ///
    /// [`Concurrency::Fixed`] keeps the limit where you put it: for a loader
    /// whose best concurrency you have measured, or that must never run
    /// more than so many calls. `max`, or the fixed value, must be at
    /// least 1.
    pub fn concurrency(mut self, concurrency: Concurrency) -> Self {
        self.config.concurrency = concurrency;
        self
    }

    /// A fixed limit of `n` loader calls at once: the same as
    /// [`concurrency`](Self::concurrency)`(`[`Concurrency::Fixed`]`(n))`.
    pub fn max_concurrent_batches(self, n: usize) -> Self {
        self.concurrency(Concurrency::Fixed(n))
    }

    /// How many requests may wait in the queue for the worker. Together with
    /// `max_batch_size × (the most loads at once + 1)` keys held by the
    /// worker, this bounds the batcher's memory: past that many waiters,
    /// requests fail with [`Error::Overloaded`](crate::Error::Overloaded)
    /// (with [`Overflow::Reject`]) or wait for room (with
    /// [`Overflow::Wait`]).
    /// Must be at least 1. Default
    /// [`defaults::CHANNEL_CAPACITY`](crate::defaults::CHANNEL_CAPACITY).
    pub fn channel_capacity(mut self, n: usize) -> Self {
        self.config.channel_capacity = n;
        self
    }

    /// When a batch that is not full is dispatched. Default
    /// [`FlushPolicy::Eager`].
    pub fn policy(mut self, policy: FlushPolicy) -> Self {
        self.config.policy = policy;
        self
    }

    /// What a request does when the queue is full. Default
    /// [`Overflow::Reject`].
    pub fn overflow(mut self, overflow: Overflow) -> Self {
        self.config.overflow = overflow;
        self
    }

    /// Each request's deadline, from the call to [`Batcher::load`] until its
    /// answer, including time waiting for room in the queue. The caller gets
    /// [`Error::Timeout`](crate::Error::Timeout) when it passes. Must be
    /// greater than zero. Default [`defaults::TIMEOUT`](crate::defaults::TIMEOUT).
    ///
    /// With [`Overflow::Reject`], the running worker answers the timeout
    /// itself, with one timer for the earliest deadline, so a request costs
    /// no timer of its own (a timer per request was the largest cost per
    /// key). With [`Overflow::Wait`], or before the worker runs, each
    /// caller keeps its own timer.
    pub fn timeout(mut self, d: Duration) -> Self {
        self.config.timeout = Some(d);
        self
    }

    /// Removes the per-request deadline: a request waits as long as its
    /// load takes. Only sensible with a [`load_timeout`](Self::load_timeout)
    /// or a loader that cannot hang.
    pub fn no_timeout(mut self) -> Self {
        self.config.timeout = None;
        self
    }

    /// Abandons a load that runs longer than this, failing its waiters with
    /// [`Error::LoadTimeout`](crate::Error::LoadTimeout) and freeing its slot,
    /// so a hung backend cannot take every slot. Must be greater than zero.
    /// Default: none (the per-request `timeout` still answers the callers).
    pub fn load_timeout(mut self, d: Duration) -> Self {
        self.config.load_timeout = Some(d);
        self
    }

    /// When a key is requested while a load for it is already running,
    /// attach the request to that load instead of loading the key again.
    /// Saves work on hot keys; the answer may then be as old as the running
    /// load's start. Default `false`.
    pub fn join_in_flight(mut self, yes: bool) -> Self {
        self.config.join_in_flight = yes;
        self
    }

    /// With the [`Eager`](FlushPolicy::Eager) and
    /// [`Adaptive`](FlushPolicy::Adaptive) policies: when a request finds
    /// the batcher idle (no load running and no request waiting for the
    /// worker, at least two slots in all, and
    /// [`join_in_flight`](Self::join_in_flight) off, since only the worker's
    /// loads can be joined), the caller runs its one-key load in its own
    /// task instead of handing it to the worker. The worker would have sent
    /// it alone anyway; skipping it saves two task hand-offs, each a thread
    /// wake-up when the runtime's threads are parked, which is most of what a
    /// lone caller pays for batching. The load counts against the
    /// [`concurrency`](Self::concurrency) limit and in the statistics like
    /// any batch of one. Default `true`.
    pub fn direct_when_idle(mut self, yes: bool) -> Self {
        self.config.direct_when_idle = yes;
        self
    }

    /// Counts loads and keys per scope, by the name the loader gives each
    /// ([`ScopedLoader::label`](crate::ScopedLoader::label): a `Scope`'s
    /// label, else its role), in
    /// [`StatsSnapshot::by_scope`](crate::StatsSnapshot::by_scope) and,
    /// with the `metrics` feature, as `pgbatch_batcher_scope_loads_total`
    /// and `pgbatch_batcher_scope_keys_total` with a `scope` label. At most
    /// `most` names are counted apart; the rest count together as
    /// [`OTHER_SCOPES`](crate::stats::OTHER_SCOPES), so the label's values
    /// stay bounded. Costs a map update per load. Default: off.
    pub fn scope_stats(mut self, most: usize) -> Self {
        self.config.scope_stats = most;
        self
    }

    /// Caps how many scopes one load serves, below what the loader allows
    /// ([`ScopedLoader::scopes_per_load`](crate::ScopedLoader::scopes_per_load)):
    /// 1 gives every scope loads of its own. Must be at least 1. Default:
    /// as many as the loader allows.
    pub fn max_scopes_per_load(mut self, most: usize) -> Self {
        self.config.scopes_per_load = most;
        self
    }

    fn validate(&self) -> Result<(), BuildError> {
        let c = &self.config;
        for (setting, value) in [
            ("max_batch_size", c.max_batch_size),
            ("concurrency", c.concurrency.max()),
            ("channel_capacity", c.channel_capacity),
            ("max_scopes_per_load", c.scopes_per_load),
        ] {
            if value == 0 {
                return Err(BuildError::TooSmall {
                    setting,
                    min: 1,
                    value,
                });
            }
        }
        if c.channel_capacity > Semaphore::MAX_PERMITS {
            return Err(BuildError::TooLarge {
                setting: "channel_capacity",
                max: Semaphore::MAX_PERMITS,
                value: c.channel_capacity,
            });
        }
        for (setting, value) in [("timeout", c.timeout), ("load_timeout", c.load_timeout)] {
            if value == Some(Duration::ZERO) {
                return Err(BuildError::ZeroDuration { setting });
            }
        }
        Ok(())
    }

    /// Validates the settings and returns a handle and its worker, without
    /// spawning the worker: run [`Worker::run`] on the executor of your
    /// choice (tests use this to drive the worker step by step).
    ///
    /// # Errors
    ///
    /// [`BuildError`] names the first invalid setting.
    pub fn build_pair<L>(self, loader: L) -> Result<Pair<K, V>, BuildError>
    where
        L: Loader<K, V>,
    {
        self.validate()?;
        Ok(super::handle::pair(self.config, run::load_fn(loader)))
    }

    /// Validates the settings, spawns the worker on the current Tokio
    /// runtime and returns a handle.
    ///
    /// # Errors
    ///
    /// [`BuildError`] names the first invalid setting, or
    /// [`BuildError::NoRuntime`] when called outside a Tokio runtime.
    pub fn build<L>(self, loader: L) -> Result<Batcher<K, V>, BuildError>
    where
        L: Loader<K, V>,
    {
        let rt = tokio::runtime::Handle::try_current().map_err(|_| BuildError::NoRuntime)?;
        let (batcher, worker) = self.build_pair(loader)?;
        rt.spawn(worker.run());
        Ok(batcher)
    }

    /// As [`build_pair`](Self::build_pair), for a scoped batcher (see
    /// [`build_scoped`](Self::build_scoped)).
    ///
    /// # Errors
    ///
    /// [`BuildError`] names the first invalid setting.
    pub fn build_scoped_pair<S, L>(self, loader: L) -> Result<Pair<K, V, S>, BuildError>
    where
        S: Clone + Eq + Hash + Send + Sync + 'static,
        L: ScopedLoader<S, K, V>,
    {
        self.validate()?;
        Ok(super::handle::pair(
            self.config,
            run::scoped_load_fn(loader),
        ))
    }

    /// Validates the settings, spawns the worker on the current Tokio
    /// runtime and returns a scoped handle: each caller loads as a scope
    /// `S` ([`Batcher::load_as`]), and each load serves one scope, through
    /// `loader`. The settings hold for the batcher as a whole: the
    /// concurrency limit is shared by every scope's loads (scopes with
    /// waiting keys take turns), as are the queue and the deadline.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use std::convert::Infallible;
    /// use pgbatch::{scoped_loader_fn, Batcher};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let notes: Batcher<u64, String, u32> = Batcher::builder()
    ///     .build_scoped(scoped_loader_fn(|tenant: u32, ids: Vec<u64>| async move {
    ///         // One query per tenant's batch, run as that tenant.
    ///         Ok::<_, Infallible>(
    ///             ids.into_iter()
    ///                 .map(|id| (id, format!("note {id} of tenant {tenant}")))
    ///                 .collect::<HashMap<_, _>>(),
    ///         )
    ///     }))?;
    /// let (a, b) = tokio::join!(notes.load_as(&1, 7), notes.load_as(&2, 7));
    /// assert_eq!(a?.as_deref(), Some("note 7 of tenant 1"));
    /// assert_eq!(b?.as_deref(), Some("note 7 of tenant 2"));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build).
    pub fn build_scoped<S, L>(self, loader: L) -> Result<Batcher<K, V, S>, BuildError>
    where
        S: Clone + Eq + Hash + Send + Sync + 'static,
        L: ScopedLoader<S, K, V>,
    {
        let rt = tokio::runtime::Handle::try_current().map_err(|_| BuildError::NoRuntime)?;
        let (batcher, worker) = self.build_scoped_pair(loader)?;
        rt.spawn(worker.run());
        Ok(batcher)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type B = BatcherBuilder<u32, u32>;

    #[test]
    fn zero_sizes_are_rejected_by_name() {
        let cases = [
            (B::default().max_batch_size(0), "max_batch_size"),
            (B::default().max_concurrent_batches(0), "concurrency"),
            (
                B::default().concurrency(Concurrency::Auto { max: 0 }),
                "concurrency",
            ),
            (B::default().channel_capacity(0), "channel_capacity"),
        ];
        for (builder, name) in cases {
            let err = builder.validate().unwrap_err();
            assert_eq!(
                err,
                BuildError::TooSmall {
                    setting: name,
                    min: 1,
                    value: 0
                }
            );
            assert!(err.to_string().contains(name), "{err}");
        }
    }

    #[test]
    fn huge_channel_and_zero_durations_are_rejected() {
        assert!(matches!(
            B::default().channel_capacity(usize::MAX).validate(),
            Err(BuildError::TooLarge { .. })
        ));
        assert_eq!(
            B::default().timeout(Duration::ZERO).validate(),
            Err(BuildError::ZeroDuration { setting: "timeout" })
        );
        assert_eq!(
            B::default().load_timeout(Duration::ZERO).validate(),
            Err(BuildError::ZeroDuration {
                setting: "load_timeout"
            })
        );
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(B::default().validate(), Ok(()));
        assert_eq!(B::default().no_timeout().validate(), Ok(()));
        // A zero delay is allowed: with FixedDelay it means "flush at once".
        assert_eq!(B::default().max_delay(Duration::ZERO).validate(), Ok(()));
    }
}
