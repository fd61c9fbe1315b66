//! Configuration of a [`Cache`].

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use moka::notification::RemovalCause;

use super::admission::{Admission, Doorkeeper};
use super::expiry::{JitteredExpiry, SlotExpiry};
use super::handle::Cache;
use super::shared::{Counters, MissFn, SharedWhen, Source};
use super::slot::Slot;
use crate::{Batcher, BuildError, Error};

type Weigher<K, V> = Arc<dyn Fn(&K, &V) -> u32 + Send + Sync>;

/// Builds a [`Cache`]; get one from [`Cache::builder`].
///
/// ```
/// use std::time::Duration;
/// use pgbatch::cache::Cache;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cache: Cache<u32, String> = Cache::builder()
///     .max_capacity(10_000)
///     .time_to_live(Duration::from_secs(20))
///     .jitter(Duration::from_secs(3))
///     .negative_ttl(Duration::from_secs(1))
///     .build(|id: u32| async move { Ok(Some(format!("user {id}"))) })?;
/// assert_eq!(cache.get(7).await?, Some("user 7".to_owned()));
/// # Ok(()) }
/// ```
#[must_use = "builder does nothing until .build()"]
pub struct CacheBuilder<K, V> {
    name: Option<String>,
    max_capacity: u64,
    weigher: Option<Weigher<K, V>>,
    time_to_live: Duration,
    jitter: Duration,
    negative_ttl: Option<Duration>,
    admission: Admission,
    shared_when: Option<SharedWhen<V>>,
    _types: PhantomData<fn(K) -> V>,
}

impl<K, V> fmt::Debug for CacheBuilder<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheBuilder")
            .field("name", &self.name)
            .field("max_capacity", &self.max_capacity)
            .field("weighted", &self.weigher.is_some())
            .field("time_to_live", &self.time_to_live)
            .field("jitter", &self.jitter)
            .field("negative_ttl", &self.negative_ttl)
            .field("admission", &self.admission)
            .field("shared_when", &self.shared_when.is_some())
            .finish()
    }
}

impl<K, V> Cache<K, V>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Starts configuring a cache. (Here rather than beside `Cache`, so
    /// that this module uses `handle` and not the other way round.)
    pub fn builder() -> CacheBuilder<K, V> {
        CacheBuilder::default()
    }
}

impl<K, V> Default for CacheBuilder<K, V> {
    fn default() -> Self {
        Self {
            name: None,
            max_capacity: 10_000,
            weigher: None,
            time_to_live: Duration::from_secs(20),
            jitter: Duration::from_secs(3),
            negative_ttl: None,
            admission: Admission::default(),
            shared_when: None,
            _types: PhantomData,
        }
    }
}

impl<K, V> CacheBuilder<K, V>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// A name for the cache, shown in `Debug`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The most entries, or with a [`weigher`](Self::weigher) the most total
    /// weight. Default 10,000.
    pub fn max_capacity(mut self, n: u64) -> Self {
        self.max_capacity = n;
        self
    }

    /// Bounds the cache by weight instead of entry count: each found value
    /// weighs `weigher(key, value)`, a cached "not found" weighs 1.
    pub fn weigher(mut self, weigher: impl Fn(&K, &V) -> u32 + Send + Sync + 'static) -> Self {
        self.weigher = Some(Arc::new(weigher));
        self
    }

    /// How long a found value stays, before jitter. Default 20 s (lakeFS's
    /// credential cache).
    pub fn time_to_live(mut self, ttl: Duration) -> Self {
        self.time_to_live = ttl;
        self
    }

    /// Up to this much is added to each entry's lifetime, drawn uniformly
    /// per entry. Default 3 s.
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// Also cache "not found", for this long (plus jitter). Default: not
    /// cached.
    pub fn negative_ttl(mut self, ttl: Duration) -> Self {
        self.negative_ttl = Some(ttl);
        self
    }

    /// Which loaded values are stored. Default
    /// [`Admission::SecondMiss`]: a key's value from its second miss on;
    /// [`Admission::Always`] where a key's first repeat must be a hit.
    pub fn admission(mut self, admission: Admission) -> Self {
        self.admission = admission;
        self
    }

    /// Marks the values that read the same for every scope (public rows,
    /// say): a value for which `shared` returns true, loaded as any scope,
    /// is served to every scope of a scoped cache, instead of to the scope
    /// that read it alone. Only found values are shared: a "not found"
    /// read as one scope may be a row another scope can see.
    ///
    /// ```
    /// # #[derive(Clone)] struct Doc { public: bool }
    /// let builder = pgbatch::cache::Cache::<u64, Doc>::builder()
    ///     .shared_when(|doc: &Doc| doc.public);
    /// # let _ = builder;
    /// ```
    ///
    /// Say so only of data whose every row marked this way every scope
    /// may read: a shared value skips the scope's own check. By default
    /// nothing is shared.
    pub fn shared_when(mut self, shared: impl Fn(&V) -> bool + Send + Sync + 'static) -> Self {
        self.shared_when = Some(Arc::new(shared));
        self
    }

    fn validate(&self) -> Result<(), BuildError> {
        if self.max_capacity == 0 {
            return Err(BuildError::TooSmall {
                setting: "max_capacity",
                min: 1,
                value: 0,
            });
        }
        for (setting, value) in [
            ("time_to_live", Some(self.time_to_live)),
            ("negative_ttl", self.negative_ttl),
        ] {
            if value.is_some_and(|d| d.is_zero()) {
                return Err(BuildError::ZeroDuration { setting });
            }
        }
        Ok(())
    }

    /// A cache whose misses call `load(key)`. The load is polled by the
    /// callers waiting for it; if one is dropped before it finishes, the
    /// rest runs in a task spawned on the Tokio runtime current at that
    /// time.
    ///
    /// # Errors
    ///
    /// [`BuildError`] names the first invalid setting.
    pub fn build<F, Fut>(self, load: F) -> Result<Cache<K, V>, BuildError>
    where
        F: Fn(K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<V>, Error>> + Send + 'static,
    {
        self.build_scoped(move |(), k| load(k))
    }

    /// A scoped cache whose misses call `load(scope, key)` (a clone of the
    /// caller's scope): each caller reads with
    /// [`get_as`](Cache::get_as), and a value read as one scope is served
    /// to that scope alone (see [`shared_when`](Self::shared_when)).
    /// Concurrent misses of a key share a load only within a scope.
    /// Otherwise as [`build`](Self::build).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use pgbatch::cache::Cache;
    ///
    /// let notes: Cache<u64, String, u32> = Cache::builder()
    ///     .build_scoped(|tenant: u32, id: u64| async move {
    ///         Ok(Some(format!("note {id} of tenant {tenant}")))
    ///     })
    ///     .unwrap();
    /// assert_eq!(notes.get_as(&1, 7).await.unwrap().as_deref(), Some("note 7 of tenant 1"));
    /// assert_eq!(notes.get_as(&2, 7).await.unwrap().as_deref(), Some("note 7 of tenant 2"));
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`BuildError`] names the first invalid setting.
    pub fn build_scoped<S, F, Fut>(self, load: F) -> Result<Cache<K, V, S>, BuildError>
    where
        S: Clone + Eq + Hash + Send + Sync + 'static,
        F: Fn(S, K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<V>, Error>> + Send + 'static,
    {
        let load: MissFn<S, K, V> = Arc::new(move |scope, k| Box::pin(load(scope, k)));
        self.build_over(Source::Load(load))
    }

    /// A cache whose misses call `load(key)`, which fails with an error
    /// of its own type `E` (a `sqlx::Error`, say): each failure reaches the
    /// callers as [`Error::Load`], from which
    /// [`load_error::<E>`](Error::load_error) takes it back. Otherwise as
    /// [`build`](Self::build).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use pgbatch::cache::Cache;
    ///
    /// let cache: Cache<u32, String> = Cache::builder()
    ///     .build_fallible(|id: u32| async move {
    ///         if id == 0 {
    ///             return Err(std::io::Error::other("no id 0"));
    ///         }
    ///         Ok(Some(format!("user {id}")))
    ///     })
    ///     .unwrap();
    /// assert_eq!(cache.get(7).await.unwrap().as_deref(), Some("user 7"));
    /// let err = cache.get(0).await.unwrap_err();
    /// assert!(err.load_error::<std::io::Error>().is_some());
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`BuildError`] names the first invalid setting.
    pub fn build_fallible<F, Fut, E>(self, load: F) -> Result<Cache<K, V>, BuildError>
    where
        F: Fn(K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<V>, E>> + Send + 'static,
        E: std::error::Error + Send + Sync + 'static,
    {
        self.build(move |key| {
            let load = load(key);
            async move { load.await.map_err(Error::load) }
        })
    }

    /// A cache in front of `batcher`: concurrent misses for different keys
    /// go out together in the batcher's batches.
    ///
    /// The batcher's worker keeps one load per key for the cache's misses
    /// (joining a miss to a running load of its key unless an invalidation
    /// came between them), and the cache is filled in the load's task (in
    /// its slot) from its result, before the callers are answered: a miss
    /// costs little more than the batched load. A miss always goes
    /// through the worker, never as a direct load when idle.
    ///
    /// The first cache built over a batcher fills from it for the
    /// batcher's life; another cache over the same batcher (or one built
    /// after the first was dropped) coalesces its misses itself, as
    /// [`build`](Self::build) does. The batcher's other callers are not
    /// affected.
    ///
    /// Over a scoped batcher (`Batcher<K, V, S>`), the cache is scoped
    /// too: a miss of [`get_as`](Cache::get_as) loads as its scope, and
    /// the value is kept for that scope alone.
    ///
    /// # Errors
    ///
    /// [`BuildError`] names the first invalid setting.
    pub fn build_with_batcher<S>(
        self,
        batcher: Batcher<K, V, S>,
    ) -> Result<Cache<K, V, S>, BuildError>
    where
        S: Clone + Eq + Hash + Send + Sync + 'static,
    {
        self.build_over(Source::Batcher(batcher))
    }

    fn build_over<S>(self, source: Source<S, K, V>) -> Result<Cache<K, V, S>, BuildError>
    where
        S: Clone + Eq + Hash + Send + Sync + 'static,
    {
        self.validate()?;
        let counters = Arc::new(Counters::default());
        #[cfg(feature = "metrics")]
        counters.export(self.name.as_deref().unwrap_or("cache"));
        let listener_counters = Arc::clone(&counters);
        let mut store = moka::future::Cache::builder()
            .max_capacity(self.max_capacity)
            .expire_after(SlotExpiry)
            .eviction_listener(move |_k, _v, cause| match cause {
                RemovalCause::Size => {
                    listener_counters.evictions.fetch_add(1, Relaxed);
                }
                RemovalCause::Expired => {
                    listener_counters.expirations.fetch_add(1, Relaxed);
                }
                RemovalCause::Explicit | RemovalCause::Replaced => {}
            });
        if let Some(name) = &self.name {
            store = store.name(name);
        }
        if let Some(weigher) = self.weigher {
            store = store.weigher(move |k, slot: &Slot<S, V>| slot.weight(|v| weigher(k, v)));
        } else if size_of::<S>() > 0 {
            // A key's entry holds each scope's value: each counts against
            // the capacity, as a value of its own would.
            store = store.weigher(|_, slot: &Slot<S, V>| slot.weight(|_| 1));
        }
        let doorkeeper = match self.admission {
            Admission::Always => None,
            Admission::SecondMiss => Some(Doorkeeper::new(self.max_capacity)),
        };
        let lifetimes = JitteredExpiry::new(
            self.time_to_live,
            self.negative_ttl.unwrap_or_default(),
            self.jitter,
        );
        Ok(Cache::new(
            store.build(),
            source,
            self.negative_ttl.is_some(),
            doorkeeper,
            lifetimes,
            self.shared_when,
            counters,
        ))
    }
}
