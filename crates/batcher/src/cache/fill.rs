//! Misses over a [`Batcher`](crate::Batcher): the batcher's loads fill the
//! store.
//!
//! The batcher's worker already knows every running load, so it joins a
//! miss to its key's load (in its scope) itself and the cache keeps no
//! flights of its own: a miss costs a stamp and a channel send.
//! `FillFrom` is the cache's side of the batcher's one hook
//! ([`crate::batcher::Observer`]): the load's own task stores the batch's
//! answers, for the keys whose stamps are still current, before the
//! callers are answered; and the worker asks it whether a miss that
//! waited in the channel can be answered from what a load stored since
//! (`RecentFills`, the cache's own record of that).

use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};

use futures_util::FutureExt as _;
use tokio::time::Instant;

use super::shared::{put_if_current, Counters, Inner};
use super::slot::Held;
use crate::batcher::{BoxFuture, Ended, Observer, Stamp};

/// A cache's side of the batcher it is built over. Weak: the batcher holds
/// it, and the cache holds the batcher.
pub(super) struct FillFrom<K, V, S> {
    pub(super) cache: Weak<Inner<K, V, S>>,
    pub(super) counters: Arc<Counters>,
    pub(super) recent: RecentFills,
}

impl<K, V, S> Observer<S, K, V> for FillFrom<K, V, S>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: Clone + Eq + Hash + Send + Sync + 'static,
{
    /// Takes what a load answered the cache's misses and returns the stores
    /// to make, which the load's task awaits before its callers are
    /// answered: a caller that got its answer and asks again finds it
    /// here. A key is stored only while its stamp is current, checked
    /// under moka's lock of the key, which `invalidate` takes too: a load
    /// that began before an invalidation never stores after it. A key the
    /// load failed alone is not stored.
    fn ended(&self, scope: &S, ended: Ended<'_, K, V>) -> Option<BoxFuture> {
        let inner = self.cache.upgrade()?; // None: the cache is gone
        let c = &inner.counters;
        let (stamped, loaded) = match ended {
            Ended::Loaded { stamped, loaded } => (stamped, loaded),
            Ended::Failed(keys) => {
                c.misses.fetch_add(keys as u64, Relaxed);
                c.load_errors.fetch_add(keys as u64, Relaxed);
                return None;
            }
        };
        // The database ran this load as `scope`: it may now be served
        // values shared by every scope.
        inner.accepted.accept(scope);
        c.misses.fetch_add(stamped.len() as u64, Relaxed);
        let puts: Vec<(K, Stamp, Held<S, V>)> = stamped
            .into_iter()
            .filter(|(key, stamp)| {
                let failed = loaded.is_failed(key);
                if failed {
                    c.load_errors.fetch_add(1, Relaxed);
                }
                !failed && inner.epochs.is_current(*stamp)
            })
            .filter_map(|(key, stamp)| {
                let held = inner.to_store(scope, stamp.hash, loaded.get(&key))?;
                Some((key, stamp, held))
            })
            .collect();
        if puts.is_empty() {
            return None;
        }
        let recent = self.recent.clone();
        Some(Box::pin(async move {
            for (key, stamp, held) in puts {
                if put_if_current(&inner, key, held, || inner.epochs.is_current(stamp)).await {
                    inner.counters.fills.fetch_add(1, Relaxed);
                    recent.filled(stamp.hash);
                }
            }
            recent.mark();
        }))
    }

    fn joined(&self) {
        self.counters.coalesced.fetch_add(1, Relaxed);
    }

    fn answer_now(&self, scope: &S, key: &K, stamp: Stamp, asked_at: Instant) -> Option<Option<V>> {
        if !self.recent.may_have_filled(stamp.hash, asked_at) {
            return None;
        }
        let inner = self.cache.upgrade()?;
        // moka's `get` only waits to run its housekeeping, which it
        // resumes later if this future is dropped (it is cancel safe); a
        // look that would wait is given up, and the key loaded.
        let slot = inner.store.get(key).now_or_never()??;
        Some(
            slot.find(scope, |s| inner.accepted.is_accepted(s))?
                .into_option(),
        )
    }
}

/// The cache's hashes of keys recent loads stored, and when a load last
/// stored: a miss asked for before then, whose hash is here, may find its
/// key stored. Misses of keys nobody just loaded (uniform keys over a
/// large table) then cost one read of 32 bytes, not a cache lookup.
///
/// Each hash goes in the set its low bits name, four ways, the oldest
/// pushed out (with one way, a burst's later fills overwrote about one in
/// thirty of its earlier keys: 300 keys in 4,096 slots, and a miss of such
/// a key loaded it again). Written by the loads' tasks without a lock: a
/// race can only drop a hash or leave a stale one, which costs a load or a
/// lookup, never a wrong answer.
#[derive(Clone)]
pub(super) struct RecentFills {
    inner: Arc<Recent>,
}

struct Recent {
    sets: Box<[[AtomicU64; WAYS]]>,
    /// Nanoseconds from `since` to the last load's stores, plus one (0:
    /// none yet).
    last: AtomicU64,
    since: Instant,
}

/// Enough for the keys of a burst of misses (a GraphQL query's N+1
/// lookups) in 32 KiB.
const SETS: usize = 1024;
const WAYS: usize = 4;

impl RecentFills {
    pub(super) fn new() -> Self {
        Self {
            inner: Arc::new(Recent {
                sets: (0..SETS).map(|_| Default::default()).collect(),
                last: AtomicU64::new(0),
                since: Instant::now(),
            }),
        }
    }

    fn set(&self, hash: u64) -> &[AtomicU64; WAYS] {
        // The low bits of a well-mixed hash; `SETS` is a power of two.
        &self.inner.sets[(hash as usize) & (SETS - 1)]
    }

    fn filled(&self, hash: u64) {
        let set = self.set(hash);
        if set.iter().any(|w| w.load(Relaxed) == hash) {
            return;
        }
        for i in (1..WAYS).rev() {
            set[i].store(set[i - 1].load(Relaxed), Relaxed);
        }
        set[0].store(hash, Relaxed);
    }

    /// A load's stores are done.
    fn mark(&self) {
        let nanos = self.inner.since.elapsed().as_nanos();
        let nanos = u64::try_from(nanos).unwrap_or(u64::MAX - 1) + 1;
        self.inner.last.store(nanos, Relaxed);
    }

    /// Whether the key hashed `hash`, asked for at `asked_at`, may have
    /// been stored since.
    fn may_have_filled(&self, hash: u64, asked_at: Instant) -> bool {
        let last = self.inner.last.load(Relaxed);
        if last == 0 {
            return false;
        }
        let asked = asked_at
            .saturating_duration_since(self.inner.since)
            .as_nanos();
        u128::from(last - 1) >= asked && self.set(hash).iter().any(|w| w.load(Relaxed) == hash)
    }
}
