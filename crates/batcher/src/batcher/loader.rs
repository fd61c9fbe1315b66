//! The user-supplied side of a batcher: what turns a batch of keys into values.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::Hash;

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
/// Return the values that were found. A key missing from the map is reported
/// to its callers as "not found" (`Ok(None)`). Returning an error fails every
/// caller of the batch with [`Error::Load`](crate::Error::Load); a panic
/// fails them with [`Error::LoaderPanicked`](crate::Error::LoaderPanicked).
/// Either way the batcher keeps serving. If a single key can fail on its own,
/// make `V` a `Result`.
///
/// For a closure, use [`loader_fn`].
pub trait Loader<K, V>: Send + Sync + 'static {
    /// The error a failed batch reports.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Loads `keys`, returning the values found.
    fn load(&self, keys: Vec<K>)
        -> impl Future<Output = Result<HashMap<K, V>, Self::Error>> + Send;

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

/// Makes a [`Loader`] from an async closure taking the batch's keys.
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
pub fn loader_fn<K, V, E, F, Fut>(f: F) -> LoaderFn<F>
where
    F: Fn(Vec<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<HashMap<K, V>, E>> + Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    LoaderFn { f }
}

impl<K, V, E, F, Fut> Loader<K, V> for LoaderFn<F>
where
    K: Eq + Hash,
    F: Fn(Vec<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<HashMap<K, V>, E>> + Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    type Error = E;

    fn load(&self, keys: Vec<K>) -> impl Future<Output = Result<HashMap<K, V>, E>> + Send {
        (self.f)(keys)
    }
}
