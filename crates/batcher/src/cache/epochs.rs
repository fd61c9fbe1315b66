//! Invalidation epochs: how a cache filled from a batcher's completions
//! tells a load that began before an invalidation from one that began
//! after it, without a per-key lock or map entry for every miss.
//!
//! Each key hashes to one of [`STRIPES`] counters. Invalidating a key
//! bumps its stripe, invalidating everything bumps the generation shared
//! by all, and a key's stamp holds its hash and the sum of the two (so it
//! changes when either does). A fill stores a value only while the key's
//! stamp is still the one its callers read before the load; keys that
//! share a stripe with an invalidated key only lose a fill, never receive
//! a stale value.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use crate::batcher::Stamp;

/// 4,096 stripes (32 KiB): at a thousand invalidations a second, a
/// stripe changes about every four seconds, against loads of a
/// millisecond or so, so few fills are lost to a neighbour's write.
const STRIPES: usize = 1 << 12;

pub(super) struct Epochs {
    /// The cache's one hash of a key, also fed to its doorkeeper.
    hasher: RandomState,
    stripes: Box<[AtomicU64]>,
    all: AtomicU64,
}

impl Epochs {
    pub(super) fn new() -> Self {
        Self {
            hasher: RandomState::new(),
            stripes: (0..STRIPES).map(|_| AtomicU64::new(0)).collect(),
            all: AtomicU64::new(0),
        }
    }

    /// The hash of `key` (random per cache).
    pub(super) fn hash<K: Hash>(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The stamp of the key hashed `hash` now: read by a caller before it
    /// asks for a load.
    pub(super) fn stamp(&self, hash: u64) -> Stamp {
        Stamp {
            hash,
            epoch: self.epoch(hash),
        }
    }

    /// Whether no invalidation of the key stamped `stamp` happened since.
    pub(super) fn is_current(&self, stamp: Stamp) -> bool {
        stamp.epoch == self.epoch(stamp.hash)
    }

    /// Makes every stamp of the key hashed `hash` read before this call
    /// stale. Called before the store's remove of the key, which takes the
    /// key's lock as a fill's checked put does: the put either sees the
    /// new epoch or is removed.
    pub(super) fn invalidate(&self, hash: u64) {
        self.stripes[stripe(hash)].fetch_add(1, SeqCst);
    }

    /// Makes every stamp read before this call stale, and moves the
    /// generation on.
    pub(super) fn invalidate_all(&self) {
        self.all.fetch_add(1, SeqCst);
    }

    /// How many times everything was invalidated. Bumped before the store
    /// is cleared, and moka's clear is not serialized with a key's put, so
    /// a put that saw the old generation just before may land after the
    /// clear: a load checks again after storing and removes its value
    /// itself.
    pub(super) fn generation(&self) -> u64 {
        self.all.load(SeqCst)
    }

    fn epoch(&self, hash: u64) -> u64 {
        // Two counters that only grow: their sum changes when either does.
        self.all.load(SeqCst) + self.stripes[stripe(hash)].load(SeqCst)
    }
}

/// The low bits of a SipHash are as good as any.
fn stripe(hash: u64) -> usize {
    (hash as usize) & (STRIPES - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_stays_current_until_its_key_or_everything_is_invalidated() {
        let e = Epochs::new();
        let h = e.hash(&"a");
        let a = e.stamp(h);
        assert!(e.is_current(a));
        assert_eq!(a, e.stamp(h), "the same key, nothing invalidated");
        e.invalidate(h);
        assert!(!e.is_current(a));
        let a2 = e.stamp(h);
        assert!(a2 > a, "a key's stamps only grow");
        assert!(e.is_current(a2));
        e.invalidate_all();
        assert!(!e.is_current(a2));
        assert!(e.stamp(h) > a2);
    }

    #[test]
    fn another_stripes_invalidation_leaves_a_stamp_current() {
        let e = Epochs::new();
        let h = e.hash(&0u64);
        let a = e.stamp(h);
        let other = (1u64..)
            .map(|k| e.hash(&k))
            .find(|o| stripe(*o) != stripe(h))
            .expect("some key lands elsewhere");
        e.invalidate(other);
        assert!(e.is_current(a));
    }
}
