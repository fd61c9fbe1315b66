//! Whether the caches may be used: off while the cross-instance
//! invalidation listener ([`crate::service::invalidation`]) is down, because the
//! notifications sent meanwhile are lost.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Whether the caches may be used: shared by the lookups, the
/// authenticator and the listener. Without a listener (one instance, or a
/// benchmark building the state by hand) it stays on.
#[derive(Debug, Clone)]
pub struct Coherence(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    usable: AtomicBool,
    received: AtomicU64,
    connects: AtomicU64,
    failures: AtomicU64,
    unreadable: AtomicU64,
}

impl Default for Coherence {
    fn default() -> Self {
        Self(Arc::new(Inner {
            usable: AtomicBool::new(true),
            received: AtomicU64::new(0),
            connects: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            unreadable: AtomicU64::new(0),
        }))
    }
}

impl Coherence {
    /// Whether the caches hold nothing a committed change has made stale
    /// (as far as notifications tell): false while the listener is down.
    pub fn caches_usable(&self) -> bool {
        self.0.usable.load(Ordering::Acquire)
    }

    /// Marks the caches unusable: the listener is down, and what it would
    /// have heard is lost.
    pub fn set_usable(&self, usable: bool) {
        self.0.usable.store(usable, Ordering::Release);
    }

    /// The listener is listening again (after the caches were flushed).
    pub fn connected(&self) {
        self.0.connects.fetch_add(1, Ordering::Relaxed);
        self.set_usable(true);
    }

    /// The listener failed (to connect, LISTEN, or stay connected): the
    /// caches are bypassed until it is back.
    pub fn failed(&self) {
        self.0.failures.fetch_add(1, Ordering::Relaxed);
        self.set_usable(false);
    }

    /// Times the listener failed.
    pub fn failures(&self) -> u64 {
        self.0.failures.load(Ordering::Relaxed)
    }

    /// A notification this version could not read (every cache was
    /// flushed for it).
    pub fn count_unreadable(&self) {
        self.0.unreadable.fetch_add(1, Ordering::Relaxed);
    }

    /// Notifications that could not be read.
    pub fn unreadable(&self) -> u64 {
        self.0.unreadable.load(Ordering::Relaxed)
    }

    /// One notification applied.
    pub fn count_received(&self) {
        self.0.received.fetch_add(1, Ordering::Relaxed);
    }

    /// Notifications applied so far.
    pub fn received(&self) -> u64 {
        self.0.received.load(Ordering::Relaxed)
    }

    /// Times the listener has connected and LISTENed (1 after the first
    /// start; each reconnection adds one).
    pub fn connects(&self) -> u64 {
        self.0.connects.load(Ordering::Relaxed)
    }
}
