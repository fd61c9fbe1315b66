//! Per-value expiry: the TTL plus a random share of the jitter, drawn when
//! a value is stored; a store entry lives until its last value expires.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use moka::Expiry;

use super::slot::{Cached, Slot};

#[derive(Debug)]
pub(super) struct JitteredExpiry {
    ttl: Duration,
    negative_ttl: Duration,
    jitter: Duration,
    /// splitmix64 state; seeded per cache so instances started together
    /// still draw different jitters.
    state: AtomicU64,
}

impl JitteredExpiry {
    pub(super) fn new(ttl: Duration, negative_ttl: Duration, jitter: Duration) -> Self {
        let seed = std::collections::hash_map::RandomState::new().hash_one(0u64);
        Self {
            ttl,
            negative_ttl,
            jitter,
            state: AtomicU64::new(seed),
        }
    }

    /// The longest any value lives.
    pub(super) fn longest(&self) -> Duration {
        self.ttl.max(self.negative_ttl) + self.jitter
    }

    /// A uniformly spread extra lifetime in `0..=jitter`.
    ///
    /// Hand-rolled (splitmix64 over an atomic counter) rather than a `rand`
    /// dependency: spreading expiry needs spread, not unpredictability.
    pub(super) fn sample_jitter(&self) -> Duration {
        let nanos = u64::try_from(self.jitter.as_nanos()).unwrap_or(u64::MAX);
        if nanos == 0 {
            return Duration::ZERO;
        }
        let mut x = self.state.fetch_add(0x9E37_79B9_7F4A_7C15, Relaxed);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 31;
        Duration::from_nanos(x % nanos.saturating_add(1))
    }

    fn lifetime<V>(&self, value: &Cached<V>) -> Duration {
        let base = match value {
            Cached::Found(_) => self.ttl,
            Cached::NotFound => self.negative_ttl,
        };
        base.saturating_add(self.sample_jitter())
    }

    /// When `value`, stored now, expires.
    pub(super) fn expires<V>(&self, value: &Cached<V>) -> Instant {
        let now = Instant::now();
        now.checked_add(self.lifetime(value)).unwrap_or(now)
    }
}

/// moka's expiry of an entry: when its last value expires.
#[derive(Debug)]
pub(super) struct SlotExpiry;

impl<K, S: Clone + PartialEq, V: Clone> Expiry<K, Slot<S, V>> for SlotExpiry {
    fn expire_after_create(&self, _key: &K, slot: &Slot<S, V>, at: Instant) -> Option<Duration> {
        Some(slot.expires().saturating_duration_since(at))
    }

    /// A stored value gives the entry the lifetime of its latest value.
    fn expire_after_update(
        &self,
        _key: &K,
        slot: &Slot<S, V>,
        at: Instant,
        _remaining: Option<Duration>,
    ) -> Option<Duration> {
        Some(slot.expires().saturating_duration_since(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes_spread_over_ttl_to_ttl_plus_jitter() {
        let e = JitteredExpiry::new(
            Duration::from_secs(20),
            Duration::from_secs(1),
            Duration::from_secs(3),
        );
        let found: Cached<()> = Cached::Found(());
        let lifetimes: Vec<Duration> = (0..10_000).map(|_| e.lifetime(&found)).collect();
        let (lo, hi) = (Duration::from_secs(20), Duration::from_secs(23));
        assert!(lifetimes.iter().all(|d| (lo..=hi).contains(d)));
        // Every tenth of the jitter range gets a fair share (≈1,000 each).
        let mut deciles = [0u32; 10];
        for d in &lifetimes {
            let frac = (*d - lo).as_secs_f64() / 3.0;
            deciles[((frac * 10.0) as usize).min(9)] += 1;
        }
        assert!(
            deciles.iter().all(|&n| (800..1200).contains(&n)),
            "{deciles:?}"
        );
        // And no two entries in a row share an expiry.
        assert!(lifetimes.windows(2).all(|w| w[0] != w[1]));
    }

    #[test]
    fn not_found_uses_the_negative_ttl_and_zero_jitter_is_exact() {
        let e = JitteredExpiry::new(
            Duration::from_secs(20),
            Duration::from_secs(2),
            Duration::ZERO,
        );
        assert_eq!(e.lifetime(&Cached::<()>::NotFound), Duration::from_secs(2));
        assert_eq!(e.lifetime(&Cached::Found(())), Duration::from_secs(20));
    }

    #[test]
    fn two_caches_draw_different_jitters() {
        let a = JitteredExpiry::new(Duration::ZERO, Duration::ZERO, Duration::from_secs(3));
        let b = JitteredExpiry::new(Duration::ZERO, Duration::ZERO, Duration::from_secs(3));
        let sa: Vec<_> = (0..8).map(|_| a.sample_jitter()).collect();
        let sb: Vec<_> = (0..8).map(|_| b.sample_jitter()).collect();
        assert_ne!(sa, sb);
    }
}
