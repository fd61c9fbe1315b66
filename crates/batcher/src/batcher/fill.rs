//! What a batcher hands a [`Cache`](crate::cache::Cache) built over it
//! when a load ends: each key a cache miss asked for, with the stamp its
//! callers read, and the value (or the failure), so the cache is filled
//! from the batch's completion instead of by each caller.
//!
//! The stamp is the cache's hash of the key and the key's invalidation
//! epoch when a caller read it; the batcher only orders stamps, in two
//! rules: a stamped request joins a running load of its key only if that
//! load's stamp is at least its own (the load started after every
//! invalidation the caller had seen), and a pending key's stamp is the
//! latest of its callers'.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

/// A cache miss's view of its key: the cache's hash of the key (for the
/// cache's own use) and the key's invalidation epoch when the caller
/// missed. One key's stamps order by epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Stamp {
    pub(crate) hash: u64,
    pub(crate) epoch: u64,
}

/// What one load gives the cache to store.
#[cfg_attr(not(feature = "cache"), allow(dead_code))]
pub(crate) enum Filled<'a, K, V> {
    /// The load's values, and each stamped key of the batch with the
    /// latest stamp its callers read.
    Loaded {
        stamped: Vec<(K, Stamp)>,
        values: &'a HashMap<K, V>,
    },
    /// The load failed for this many stamped keys; nothing is stored.
    Failed(usize),
}

/// The stores a fill asks its load's task to await.
pub(crate) type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The cache's side of a batcher it is built over.
pub(crate) trait Fill<K, V>: Send + Sync {
    /// Decides at once what of a finished load the cache stores (cloning
    /// only those values), and returns the stores to await, if any.
    fn fill(&self, filled: Filled<'_, K, V>) -> Option<BoxFuture>;
    /// A miss shared a load another miss of its key asked for (it joined
    /// the key's pending or running load).
    fn coalesced(&self);
    /// What the cache holds for `key` now, if it can tell without
    /// waiting: `Some(None)` for a stored "not found".
    fn cached(&self, key: &K) -> Option<Option<V>>;
}

pub(crate) type FillFn<K, V> = Arc<dyn Fill<K, V>>;

/// Set once, by the first cache built over the batcher, for the batcher's
/// life; read by the worker at each dispatch.
pub(crate) type FillSlot<K, V> = Arc<OnceLock<FillFn<K, V>>>;
