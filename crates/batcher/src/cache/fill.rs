//! Misses over a [`Batcher`](crate::Batcher): the batcher fills the
//! store.
//!
//! The batcher's worker already knows every running load, so it joins a
//! miss to its key's load itself and the cache keeps no flights of its
//! own: a miss costs a stamp and a channel send. `FillFrom` is the
//! cache's side of the batcher's fill hook ([`crate::batcher::Fill`]):
//! the load's own task stores the batch's values, for the keys whose
//! stamps are still current, before the callers are answered.

use std::hash::Hash;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};

use futures_util::FutureExt as _;

use super::shared::{put_if_current, BoxFuture, Cached, Counters, Inner};
use crate::batcher::{Fill, Filled, Stamp};

/// A cache's side of the batcher it is built over (see
/// [`crate::batcher::Filled`]). Weak: the batcher holds it, and the cache
/// holds the batcher.
pub(super) struct FillFrom<K, V> {
    pub(super) cache: Weak<Inner<K, V>>,
    pub(super) counters: Arc<Counters>,
}

impl<K, V> Fill<K, V> for FillFrom<K, V>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Takes what a load returned for the cache's misses and returns the
    /// stores to make, which the load's task awaits before its callers
    /// are answered: a caller that got its answer and asks again finds it
    /// here. A key is stored only while its stamp is current, checked
    /// under moka's lock of the key, which `invalidate` takes too: a load
    /// that began before an invalidation never stores after it.
    fn fill(&self, filled: Filled<'_, K, V>) -> Option<BoxFuture<()>> {
        let inner = self.cache.upgrade()?; // None: the cache is gone
        let c = &inner.counters;
        let (stamped, values) = match filled {
            Filled::Loaded { stamped, values } => (stamped, values),
            Filled::Failed(keys) => {
                c.misses.fetch_add(keys as u64, Relaxed);
                c.load_errors.fetch_add(keys as u64, Relaxed);
                return None;
            }
        };
        c.misses.fetch_add(stamped.len() as u64, Relaxed);
        let puts: Vec<(K, Stamp, Cached<V>)> = stamped
            .into_iter()
            .filter(|(_, stamp)| inner.epochs.is_current(*stamp))
            .filter_map(|(key, stamp)| {
                let value = inner.to_store(stamp.hash, values.get(&key))?;
                Some((key, stamp, value))
            })
            .collect();
        if puts.is_empty() {
            return None;
        }
        Some(Box::pin(async move {
            for (key, stamp, value) in puts {
                if put_if_current(&inner, key, value, || inner.epochs.is_current(stamp)).await {
                    inner.counters.fills.fetch_add(1, Relaxed);
                }
            }
        }))
    }

    fn coalesced(&self) {
        self.counters.coalesced.fetch_add(1, Relaxed);
    }

    fn cached(&self, key: &K) -> Option<Option<V>> {
        let inner = self.cache.upgrade()?;
        // moka's `get` only waits to run its housekeeping, which it
        // resumes later if this future is dropped (it is cancel safe); a
        // look that would wait is given up, and the key loaded.
        let cached = inner.store.get(key).now_or_never()??;
        Some(cached.into_option())
    }
}
