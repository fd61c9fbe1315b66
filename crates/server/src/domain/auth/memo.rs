//! The principals of a few tokens seen in the last moments, in front of
//! the token cache.
//!
//! Every authenticated request asks the token cache, and moka's lookup
//! with its bookkeeping of each read was about 4% of the no-database
//! route's CPU (BENCHMARKS.md, "Over HTTP"). Steady traffic presents the
//! same few tokens over and over; a slot here is a read lock and a
//! compare. moka keeps no such front itself, and a crate for it would be
//! a second cache; this is 64 slots.
//!
//! The memo serves a principal no longer than the cache would, give or
//! take a lifetime:
//! - every invalidation moves the memo's generation on once the cache's
//!   invalidation is done, and a slot holds the generation read before its
//!   lookup of the cache began. A lookup that could still see the old
//!   entry read the old generation, so its slot is refused from then on;
//! - a slot lives at most its lifetime, an eighth of the cache's
//!   TTL and at most 250 ms, counted from when it was filled: the only
//!   time by which it can outlast the cache's entry. That includes the
//!   cache's own narrow window after `invalidate_all`, where a load begun
//!   before it may store its value until it checks again and removes it
//!   (`pgbatch::cache`'s `Epochs::generation`): a lookup in that window
//!   keeps what it read here for at most a lifetime;
//! - unknown tokens are not kept: they go to the cache (and its negative
//!   TTL) as before.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use super::{Principal, TokenDigest};

/// Enough for the tokens of a service's busiest clients; a digest's first
/// byte picks its slot.
const SLOTS: usize = 64;

/// The longest a slot lives.
const MAX_LIFETIME: Duration = Duration::from_millis(250);

pub(super) struct Memo {
    slots: Box<[RwLock<Option<Slot>>]>,
    /// Moved on by every invalidation.
    generation: AtomicU64,
    lifetime: Duration,
    /// Lookups the memo answered, counted as the cache's hits.
    hits: AtomicU64,
}

struct Slot {
    digest: TokenDigest,
    principal: Arc<Principal>,
    /// The memo's generation before the lookup that found the principal.
    generation: u64,
    until: Instant,
}

impl Memo {
    /// A memo in front of a cache whose entries live `ttl`.
    pub(super) fn new(ttl: Duration) -> Self {
        Self {
            slots: (0..SLOTS).map(|_| RwLock::new(None)).collect(),
            generation: AtomicU64::new(0),
            lifetime: (ttl / 8).min(MAX_LIFETIME),
            hits: AtomicU64::new(0),
        }
    }

    /// The generation to [`put`](Self::put) a lookup starting now with.
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(SeqCst)
    }

    /// The principal of `digest` if a lookup since the last invalidation
    /// found it, less than a lifetime ago.
    pub(super) fn get(&self, digest: &TokenDigest) -> Option<Arc<Principal>> {
        let slot = self
            .slot(digest)
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let slot = slot.as_ref()?;
        let current = slot.digest == *digest
            && slot.generation == self.generation()
            && Instant::now() < slot.until;
        if !current {
            return None;
        }
        self.hits.fetch_add(1, Relaxed);
        Some(Arc::clone(&slot.principal))
    }

    /// Keeps what a lookup that read `generation` before it began found,
    /// unless an invalidation came since.
    pub(super) fn put(&self, digest: &TokenDigest, principal: &Arc<Principal>, generation: u64) {
        let slot = Slot {
            digest: *digest,
            principal: Arc::clone(principal),
            generation,
            until: Instant::now() + self.lifetime,
        };
        // An invalidation between this check and the write leaves a slot
        // of the old generation, which `get` refuses.
        if generation == self.generation() {
            *self
                .slot(digest)
                .write()
                .unwrap_or_else(PoisonError::into_inner) = Some(slot);
        }
    }

    /// Makes every slot filled so far unusable. Called once the cache's
    /// invalidation is done, not before: a lookup could otherwise read the
    /// new generation, then the old entry, and keep it for a lifetime.
    pub(super) fn invalidate(&self) {
        self.generation.fetch_add(1, SeqCst);
    }

    /// Lookups answered here.
    pub(super) fn hits(&self) -> u64 {
        self.hits.load(Relaxed)
    }

    fn slot(&self, digest: &TokenDigest) -> &RwLock<Option<Slot>> {
        &self.slots[usize::from(digest[0]) % SLOTS]
    }
}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memo")
            .field("generation", &self.generation)
            .field("lifetime", &self.lifetime)
            .field("hits", &self.hits)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(user: &str) -> Arc<Principal> {
        Arc::new(Principal {
            user: user.to_owned(),
            grants: Vec::new(),
            expires_at_ms: None,
            user_created_at: 0,
        })
    }

    fn digest(first: u8, rest: u8) -> TokenDigest {
        let mut d = [rest; 32];
        d[0] = first;
        d
    }

    #[test]
    fn a_slot_answers_its_own_digest_until_invalidated() {
        let memo = Memo::new(Duration::from_secs(20));
        let (a, p) = (digest(1, 1), principal("a"));
        assert!(memo.get(&a).is_none());
        memo.put(&a, &p, memo.generation());
        assert_eq!(memo.get(&a).as_deref(), Some(&*p));
        assert_eq!(memo.hits(), 1);
        assert!(
            memo.get(&digest(1, 2)).is_none(),
            "another digest in the same slot"
        );
        memo.invalidate();
        assert!(memo.get(&a).is_none());
        assert_eq!(memo.hits(), 1);
    }

    #[test]
    fn a_lookup_that_began_before_an_invalidation_is_not_kept() {
        let memo = Memo::new(Duration::from_secs(20));
        let a = digest(7, 0);
        let before = memo.generation();
        memo.invalidate();
        memo.put(&a, &principal("old"), before);
        assert!(memo.get(&a).is_none());
        memo.put(&a, &principal("new"), memo.generation());
        assert_eq!(memo.get(&a).map(|p| p.user.clone()).as_deref(), Some("new"));
    }

    /// Threads fill and read one slot while another invalidates: a read
    /// never returns what was looked up before an invalidation it saw.
    #[test]
    fn no_read_returns_a_lookup_older_than_the_last_invalidation_it_saw() {
        let memo = Memo::new(Duration::from_secs(20));
        let a = digest(9, 9);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let answered = std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(SeqCst) {
                    memo.invalidate();
                    std::thread::sleep(Duration::from_micros(20));
                }
            });
            s.spawn(|| {
                while !stop.load(SeqCst) {
                    let generation = memo.generation();
                    memo.put(&a, &principal(&generation.to_string()), generation);
                }
            });
            let reader = s.spawn(|| {
                let mut answered = 0;
                for _ in 0..200_000 {
                    let seen = memo.generation();
                    let Some(p) = memo.get(&a) else {
                        memo.put(&a, &principal(&seen.to_string()), seen);
                        continue;
                    };
                    let looked_up: u64 = p.user.parse().unwrap();
                    answered += 1;
                    if looked_up < seen {
                        stop.store(true, SeqCst);
                        panic!("looked up at {looked_up}, read after {seen}");
                    }
                }
                stop.store(true, SeqCst);
                answered
            });
            reader.join().unwrap()
        });
        assert!(answered > 0, "the slot never answered: nothing was tested");
    }

    #[test]
    fn a_slot_lives_an_eighth_of_the_ttl_and_at_most_250_ms() {
        assert_eq!(Memo::new(Duration::from_secs(20)).lifetime, MAX_LIFETIME);
        assert_eq!(
            Memo::new(Duration::from_millis(400)).lifetime,
            Duration::from_millis(50)
        );
        let memo = Memo::new(Duration::from_millis(80));
        let a = digest(3, 3);
        memo.put(&a, &principal("a"), memo.generation());
        assert!(memo.get(&a).is_some());
        std::thread::sleep(Duration::from_millis(15));
        assert!(memo.get(&a).is_none(), "10 ms lifetime, 15 ms later");
    }
}
