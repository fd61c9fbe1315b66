//! Which loaded values the cache stores: every one, or only those of keys
//! that missed twice within a window (TinyLFU's doorkeeper).
//!
//! moka admits every insert while it has room and, once full, inserts the
//! candidate before its TinyLFU policy decides whether to keep it. Under
//! lookups spread over far more keys than the cache holds, nearly every
//! miss is then a key read once: measured in memory, each such fill cost
//! about 10 µs of CPU (its insert, the eviction it causes, and the rehashes
//! of moka's map), several times the batched load it followed. The
//! doorkeeper, a Bloom filter of the keys seen once, lets those keys pass
//! without touching moka at all.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use fastbloom::AtomicBloomFilter;

/// Which loaded values a [`Cache`](super::Cache) stores.
///
/// The default is [`SecondMiss`](Self::SecondMiss), chosen by measurement
/// (BENCHMARKS.md, "Which values the cache stores"): 300 callers reading
/// uniformly random keys through a cache of 1,000,000 entries in front of
/// the batcher read 1.15-1.53x faster with it than with
/// [`Always`](Self::Always) over 10,000,000 keys, which do not fit, and
/// 0.92-1.08x over 100,000 keys, which do (both admit every key after
/// its second miss; `Always` after its first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Admission {
    /// Store every loaded value: a key's second lookup within its TTL is
    /// a hit. Under lookups spread over many more keys than the cache
    /// holds, each miss then pays a store and an eviction for a value
    /// read once, and the cache reads slower than the batcher alone.
    /// Choose it where a key's second read must be a hit: a key asked for
    /// again within one request (a GraphQL query whose books share
    /// authors, as in the `graphql` example), or a value read twice in
    /// quick succession and never again.
    Always,
    /// Store a key's value only from its second miss within a window of
    /// about `max_capacity` first misses (the default); the first miss is
    /// answered but not stored, so a key is loaded twice before it is
    /// cached. For lookups spread over many more keys than the cache
    /// holds, where most keys are read once: their values no longer evict
    /// the hot keys', and a miss costs little more than the load. A hot
    /// key costs one extra load whenever it has to be admitted again:
    /// first, and after an expiry that falls in a later window than its
    /// last miss.
    #[default]
    SecondMiss,
}

/// The keys seen once in the current window.
pub(super) struct Doorkeeper {
    seen: AtomicBloomFilter,
    /// First sightings in this window; at `window` the filter is cleared,
    /// so a key read once long ago is a first miss again.
    first_sightings: AtomicU64,
    window: u64,
}

/// Bounds of the window, in first misses: small caches still get a useful
/// window, and a huge (or weighted) capacity no huge filter.
const MIN_WINDOW: u64 = 1_024;
const MAX_WINDOW: u64 = 1 << 22;
/// 8 bits per key and 3 hashes: about 3% of first misses pass as second
/// ones when the window is full, which only stores a value too early.
const BITS_PER_KEY: u64 = 8;
const HASHES: u32 = 3;

impl Doorkeeper {
    /// A doorkeeper whose window is about `capacity` first misses.
    pub(super) fn new(capacity: u64) -> Self {
        let window = capacity.clamp(MIN_WINDOW, MAX_WINDOW);
        let bits = usize::try_from(window * BITS_PER_KEY).unwrap_or(usize::MAX);
        Self {
            // Fed the cache's own hashes, whose seed is random per cache:
            // keys chosen to collide in one process's filter do not
            // collide in another's.
            seen: AtomicBloomFilter::with_num_bits(bits).hashes(HASHES),
            first_sightings: AtomicU64::new(0),
            window,
        }
    }

    /// Whether the value of the key hashed `hash` may be stored: it was
    /// seen before in this window. Otherwise it is marked as seen.
    pub(super) fn admit(&self, hash: u64) -> bool {
        if self.seen.insert_hash(hash) {
            return true;
        }
        // Racing clears only cost a few keys one extra miss.
        if self.first_sightings.fetch_add(1, Relaxed) + 1 >= self.window {
            self.first_sightings.store(0, Relaxed);
            self.seen.clear();
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::LazyLock;

    use super::*;

    /// A key's hash, as a cache computes it.
    fn h(key: u64) -> u64 {
        static HASHER: LazyLock<RandomState> = LazyLock::new(RandomState::new);
        HASHER.hash_one(key)
    }

    #[test]
    fn a_key_is_admitted_on_its_second_miss() {
        let d = Doorkeeper::new(10_000);
        assert!(!d.admit(h(1)));
        assert!(d.admit(h(1)));
        assert!(d.admit(h(1)));
        assert!(!d.admit(h(2)));
    }

    #[test]
    fn the_window_forgets_keys_seen_once() {
        let d = Doorkeeper::new(0); // the smallest window
        assert_eq!(d.window, MIN_WINDOW);
        assert!(!d.admit(h(u64::MAX)));
        // Other first sightings until the window ends and the filter is
        // cleared (a few are false positives and do not count).
        let mut k = 0u64;
        loop {
            d.admit(h(k));
            k += 1;
            if d.first_sightings.load(Relaxed) == 0 {
                break;
            }
            assert!(k < 4 * MIN_WINDOW, "the window never ended");
        }
        assert!(
            !d.admit(h(u64::MAX)),
            "a key seen once before the window ended is a first miss again"
        );
    }

    #[test]
    fn few_first_misses_pass_as_second_ones() {
        let d = Doorkeeper::new(100_000);
        // Fill most of a window, then count false admissions of new keys.
        for k in 0..90_000u64 {
            d.admit(h(k));
        }
        let passed = (1_000_000..1_010_000u64).filter(|&k| d.admit(h(k))).count();
        assert!(passed < 600, "{passed} of 10,000 new keys admitted");
    }
}
