//! The user-supplied side of a batcher: what turns a batch of keys into
//! values, for everyone ([`Loader`]) or as one scope ([`ScopedLoader`]).

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::hash::Hash;

use futures_util::FutureExt as _;

use super::loaded::Loaded;

/// Loads many keys at once, for example with one
/// `SELECT ... WHERE key = ANY($1)`.
///
/// The batcher calls [`load`](Loader::load) with distinct keys (never the
/// same key twice in one call), at most
/// [`max_batch_size`](crate::BatcherBuilder::max_batch_size) of them, and
/// with at most as many calls running at once as its
/// [`concurrency`](crate::BatcherBuilder::concurrency) allows. Each call runs in its own Tokio task, so it does
/// not depend on any one caller staying alive.
///
/// Return the values that were found, as a [`Loaded`] (collect the pairs,
/// or convert a `HashMap` with `.into()`). A key missing from it is
/// reported to its callers as "not found" (`Ok(None)`); a key
/// [failed](Loaded::fail) alone gets its own error while the other keys
/// get their values. Returning an error fails every caller of the batch
/// with [`Error::Load`](crate::Error::Load); a panic fails them with
/// [`Error::LoaderPanicked`](crate::Error::LoaderPanicked). Either way the
/// batcher keeps serving.
///
/// For a closure, use [`loader_fn`]. For loads that must run as the
/// caller (a tenant, a database role), see [`ScopedLoader`].
pub trait Loader<K, V>: Send + Sync + 'static {
    /// The error a failed batch reports.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Loads `keys`, returning the values found.
    fn load(&self, keys: Vec<K>) -> impl Future<Output = Result<Loaded<K, V>, Self::Error>> + Send;

    /// Whether `value` stands for a missing row, for loaders that answer
    /// "not found" with a value (a `LEFT JOIN`'s empty side, say) instead
    /// of leaving the key out. Such values still reach the caller; they are
    /// only counted as not found in [`StatsSnapshot::not_found`](crate::StatsSnapshot::not_found).
    /// By default no value is.
    fn is_absent(&self, value: &V) -> bool {
        let _ = value;
        false
    }
}

/// Loads many keys at once as one scope `S`: who the load runs as (a
/// tenant, a database role and its settings). A batcher built with
/// [`build_scoped`](crate::BatcherBuilder::build_scoped) never puts keys
/// of two scopes into one [`load`](Self::load): each call serves exactly
/// one scope, and its answers reach only that scope's callers.
///
/// A loader that can serve several scopes in one round trip (several
/// transactions pipelined on one connection, say) says how many with
/// [`scopes_per_load`](Self::scopes_per_load) and does it in
/// [`load_scopes`](Self::load_scopes): the batcher then fills a load from
/// several scopes' waiting keys, taking turns, while the load holds fewer
/// than 16 keys (past that, a scope's batch already spreads the cost of
/// its own transaction), and answers each key from its own scope's result
/// only. By default a load serves one scope.
///
/// Otherwise as [`Loader`]: distinct keys, at most
/// [`max_batch_size`](crate::BatcherBuilder::max_batch_size) of them, each
/// call in a task of its own. `pgbatch::pg::PgLoader` and
/// `pgbatch::sqlx::SqlxLoader` are scoped loaders over their `Scope` (a
/// role and transaction-local settings); for a closure, use
/// [`scoped_loader_fn`].
pub trait ScopedLoader<S, K, V>: Send + Sync + 'static {
    /// The error a failed batch reports.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Loads `keys` as `scope`, returning the values found.
    fn load(
        &self,
        scope: &S,
        keys: Vec<K>,
    ) -> impl Future<Output = Result<Loaded<K, V>, Self::Error>> + Send;

    /// How many scopes one load may serve: up to this many batches, each
    /// of one scope, go to [`load_scopes`](Self::load_scopes) together. By
    /// default 1: every load is one call of [`load`](Self::load).
    fn scopes_per_load(&self) -> usize {
        1
    }

    /// Loads several scopes' batches in one call: each scope's keys as that
    /// scope, one result per scope in the order given. A scope that fails
    /// (its role refused, say) fails its own keys alone; an error of the
    /// whole call (no connection to be had) fails every scope's. Called
    /// only with two scopes or more, at most
    /// [`scopes_per_load`](Self::scopes_per_load).
    ///
    /// By default each scope's [`load`](Self::load), run concurrently in
    /// the load's task.
    #[allow(clippy::type_complexity)] // one result per scope, and the call's
    fn load_scopes(
        &self,
        batches: Vec<(S, Vec<K>)>,
    ) -> impl Future<Output = Result<Vec<Result<Loaded<K, V>, Self::Error>>, Self::Error>> + Send
    where
        S: Send + Sync,
        K: Send,
        V: Send,
    {
        let loads = batches
            .into_iter()
            .map(|(scope, keys)| async move { self.load(&scope, keys).await });
        futures_util::future::join_all(loads).map(Ok)
    }

    /// As [`Loader::is_absent`].
    fn is_absent(&self, value: &V) -> bool {
        let _ = value;
        false
    }

    /// How `scope` is named in spans and logs: a label you chose, never
    /// what the scope carries (its settings may be secrets, such as a
    /// user's claims). By default none: the scope does not appear.
    fn label<'s>(&self, scope: &'s S) -> Option<Cow<'s, str>> {
        let _ = scope;
        None
    }
}

/// A [`Loader`] made from a closure; see [`loader_fn`].
#[derive(Clone)]
pub struct LoaderFn<F> {
    f: F,
}

impl<F> fmt::Debug for LoaderFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoaderFn").finish_non_exhaustive()
    }
}

/// Makes a [`Loader`] from an async closure taking the batch's keys and
/// returning what it found: a `HashMap`, or a [`Loaded`].
///
/// ```
/// use std::collections::HashMap;
/// use std::convert::Infallible;
///
/// let loader = pgbatch::loader_fn(|keys: Vec<u64>| async move {
///     Ok::<_, Infallible>(keys.into_iter().map(|k| (k, k * 2)).collect::<HashMap<_, _>>())
/// });
/// # let _ = loader;
/// ```
pub fn loader_fn<K, V, M, E, F, Fut>(f: F) -> LoaderFn<F>
where
    F: Fn(Vec<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<M, E>> + Send + 'static,
    M: Into<Loaded<K, V>>,
    E: std::error::Error + Send + Sync + 'static,
{
    LoaderFn { f }
}

impl<K, V, M, E, F, Fut> Loader<K, V> for LoaderFn<F>
where
    K: Eq + Hash,
    F: Fn(Vec<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<M, E>> + Send + 'static,
    M: Into<Loaded<K, V>>,
    E: std::error::Error + Send + Sync + 'static,
{
    type Error = E;

    fn load(&self, keys: Vec<K>) -> impl Future<Output = Result<Loaded<K, V>, E>> + Send {
        let load = (self.f)(keys);
        async move { load.await.map(Into::into) }
    }
}

/// A [`ScopedLoader`] made from a closure; see [`scoped_loader_fn`].
#[derive(Clone)]
pub struct ScopedLoaderFn<F> {
    f: F,
    scopes_per_load: usize,
}

impl<F> ScopedLoaderFn<F> {
    /// Lets one load serve up to `n` scopes (at least 1): the closure is
    /// called once per scope, the calls running concurrently in the
    /// load's task (see [`ScopedLoader::load_scopes`]).
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use std::convert::Infallible;
    ///
    /// let loader = pgbatch::scoped_loader_fn(|tenant: u32, keys: Vec<u64>| async move {
    ///     Ok::<_, Infallible>(keys.into_iter().map(|k| (k, (tenant, k))).collect::<HashMap<_, _>>())
    /// })
    /// .scopes_per_load(16);
    /// # let _ = loader;
    /// ```
    #[must_use]
    pub fn scopes_per_load(mut self, n: usize) -> Self {
        self.scopes_per_load = n.max(1);
        self
    }
}

impl<F> fmt::Debug for ScopedLoaderFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedLoaderFn").finish_non_exhaustive()
    }
}

/// Makes a [`ScopedLoader`] from an async closure taking the scope (a
/// clone of it, so the future owns it) and the batch's keys.
///
/// ```
/// use std::collections::HashMap;
/// use std::convert::Infallible;
///
/// // Each tenant sees its own rows: the tenant is the scope.
/// let loader = pgbatch::scoped_loader_fn(|tenant: u32, keys: Vec<u64>| async move {
///     Ok::<_, Infallible>(
///         keys.into_iter()
///             .map(|k| (k, format!("tenant {tenant}'s row {k}")))
///             .collect::<HashMap<_, _>>(),
///     )
/// });
/// # let _ = loader;
/// ```
pub fn scoped_loader_fn<S, K, V, M, E, F, Fut>(f: F) -> ScopedLoaderFn<F>
where
    F: Fn(S, Vec<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<M, E>> + Send + 'static,
    M: Into<Loaded<K, V>>,
    E: std::error::Error + Send + Sync + 'static,
{
    ScopedLoaderFn {
        f,
        scopes_per_load: 1,
    }
}

impl<S, K, V, M, E, F, Fut> ScopedLoader<S, K, V> for ScopedLoaderFn<F>
where
    S: Clone,
    K: Eq + Hash,
    F: Fn(S, Vec<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<M, E>> + Send + 'static,
    M: Into<Loaded<K, V>>,
    E: std::error::Error + Send + Sync + 'static,
{
    type Error = E;

    fn load(
        &self,
        scope: &S,
        keys: Vec<K>,
    ) -> impl Future<Output = Result<Loaded<K, V>, E>> + Send {
        let load = (self.f)(scope.clone(), keys);
        async move { load.await.map(Into::into) }
    }

    fn scopes_per_load(&self) -> usize {
        self.scopes_per_load
    }
}
