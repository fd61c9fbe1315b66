//! What a batcher tells whoever watches its loads (a
//! [`Cache`](crate::cache::Cache) built over it): one narrow interface,
//! [`Observer`], which the watcher implements and whose state it owns.
//!
//! A request may carry a [`Stamp`]: the watcher's hash of the key and the
//! key's invalidation epoch when the caller read it. The batcher only
//! orders stamps, in two rules: a stamped request joins a running load of
//! its key (in its scope) only if that load's stamp is at least its own
//! (the load started after every invalidation the caller had seen), and a
//! pending key's stamp is the latest of its callers'. When a load ends,
//! its task hands the observer each stamped key with that stamp and the
//! load's answers, before any caller is answered.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use tokio::time::Instant;

use super::loaded::Loaded;

/// A request's view of its key, given by the observer: its hash of the
/// key (for its own use) and the key's invalidation epoch when the caller
/// asked. One key's stamps order by epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Stamp {
    pub(crate) hash: u64,
    pub(crate) epoch: u64,
}

/// How a load with stamped keys ended.
#[cfg_attr(not(feature = "cache"), allow(dead_code))]
pub(crate) enum Ended<'a, K, V> {
    /// Its answers, and each stamped key of the batch with the latest
    /// stamp its callers carried.
    Loaded {
        stamped: Vec<(K, Stamp)>,
        loaded: &'a Loaded<K, V>,
    },
    /// The load failed for this many stamped keys.
    Failed(usize),
}

/// What the observer asks a load's task to await before its callers are
/// answered.
pub(crate) type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Whoever watches a batcher's loads of scope `S`.
pub(crate) trait Observer<S, K, V>: Send + Sync {
    /// A load with stamped keys ended, in its own task: decides at once
    /// what to keep of it, and returns the work to await, if any.
    fn ended(&self, scope: &S, ended: Ended<'_, K, V>) -> Option<BoxFuture>;
    /// A stamped request shared a load another request of its key asked
    /// for (it joined the key's pending or running load).
    fn joined(&self);
    /// For a stamped request received while no load of its key is pending
    /// in its scope: an answer the observer can give now without waiting
    /// (something it stored since the caller asked), if any.
    fn answer_now(&self, scope: &S, key: &K, stamp: Stamp, asked_at: Instant) -> Option<Option<V>>;
}

pub(crate) type ObserverFn<S, K, V> = Arc<dyn Observer<S, K, V>>;

/// Set once, by the first observer of the batcher, for the batcher's life;
/// read by the worker at each dispatch.
pub(crate) type ObserverSlot<S, K, V> = Arc<OnceLock<ObserverFn<S, K, V>>>;
