//! What the store holds for a key: the value each scope read, each with
//! when it expires, and a value every scope shares, if one was marked so.
//!
//! One store entry per key, whatever the scopes, so invalidating a key
//! removes every scope's copy at once (under the key's lock, as a fill's
//! checked put takes it). Unscoped, an entry holds one value, and a hit
//! costs what it did before scopes: moka's expiry is that value's own.

use std::sync::Arc;
use std::time::Instant;

/// A loaded answer as the store keeps it.
#[derive(Debug, Clone)]
pub(super) enum Cached<V> {
    Found(V),
    /// Only stored with a negative TTL.
    NotFound,
}

impl<V> Cached<V> {
    pub(super) fn into_option(self) -> Option<V> {
        match self {
            Cached::Found(v) => Some(v),
            Cached::NotFound => None,
        }
    }
}

/// Whose view a value is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Owner<S> {
    /// Read as this scope: served to it alone.
    Scope(S),
    /// Marked the same for every scope (see `CacheBuilder::shared_when`).
    Shared,
}

/// One scope's value of a key.
#[derive(Debug, Clone)]
pub(super) struct Held<S, V> {
    pub(super) owner: Owner<S>,
    pub(super) value: Cached<V>,
    pub(super) expires: Instant,
}

/// A key's entry.
#[derive(Debug, Clone)]
pub(super) enum Slot<S, V> {
    /// One scope's value (every entry, unscoped).
    One(Held<S, V>),
    /// Several scopes' values, behind an `Arc` so a hit clones no other
    /// scope's value.
    Many(Arc<Vec<Held<S, V>>>),
}

impl<S: Clone + PartialEq, V: Clone> Slot<S, V> {
    /// The value `scope` may be served, if any: its own, else a shared one
    /// if `may_share(scope)`.
    pub(super) fn find(&self, scope: &S, may_share: impl FnOnce(&S) -> bool) -> Option<Cached<V>> {
        match self {
            // moka expires a one-value entry at that value's own time.
            Slot::One(held) => match &held.owner {
                Owner::Scope(s) if s == scope => Some(held.value.clone()),
                Owner::Shared if may_share(scope) => Some(held.value.clone()),
                _ => None,
            },
            Slot::Many(helds) => {
                let now = Instant::now();
                let live = |h: &&Held<S, V>| h.expires > now;
                let own = helds
                    .iter()
                    .filter(live)
                    .find(|h| matches!(&h.owner, Owner::Scope(s) if s == scope));
                own.or_else(|| {
                    helds
                        .iter()
                        .filter(live)
                        .find(|h| h.owner == Owner::Shared)
                        .filter(|_| may_share(scope))
                })
                .map(|h| h.value.clone())
            }
        }
    }

    /// This entry with `held` in place of its owner's earlier value, and
    /// without values that expired.
    pub(super) fn with(old: Option<Self>, held: Held<S, V>) -> Self {
        let others: Vec<Held<S, V>> = match old {
            None => Vec::new(),
            Some(Slot::One(h)) => vec![h],
            Some(Slot::Many(hs)) => Arc::unwrap_or_clone(hs),
        };
        let now = Instant::now();
        let mut helds: Vec<Held<S, V>> = others
            .into_iter()
            .filter(|h| h.owner != held.owner && h.expires > now)
            .collect();
        if helds.is_empty() {
            return Slot::One(held);
        }
        helds.push(held);
        Slot::Many(Arc::new(helds))
    }

    /// When the last of its values expires: the entry's own expiry.
    pub(super) fn expires(&self) -> Instant {
        match self {
            Slot::One(h) => h.expires,
            Slot::Many(hs) => hs
                .iter()
                .map(|h| h.expires)
                .max()
                .unwrap_or_else(Instant::now),
        }
    }

    /// The entry's weight: its values' weights, a "not found" weighing 1.
    pub(super) fn weight(&self, weigh: impl Fn(&V) -> u32) -> u32 {
        let one = |h: &Held<S, V>| match &h.value {
            Cached::Found(v) => weigh(v),
            Cached::NotFound => 1,
        };
        match self {
            Slot::One(h) => one(h),
            Slot::Many(hs) => hs.iter().map(one).fold(0u32, u32::saturating_add),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn held(owner: Owner<u32>, value: &'static str, ttl: Duration) -> Held<u32, &'static str> {
        Held {
            owner,
            value: Cached::Found(value),
            expires: Instant::now() + ttl,
        }
    }

    const LONG: Duration = Duration::from_secs(60);

    #[test]
    fn a_scope_is_served_its_own_value_or_a_shared_one_never_another_scopes() {
        let slot = Slot::with(None, held(Owner::Scope(1), "one's", LONG));
        assert!(matches!(slot, Slot::One(_)));
        assert!(matches!(
            slot.find(&1, |_| true),
            Some(Cached::Found("one's"))
        ));
        assert!(slot.find(&2, |_| true).is_none());
        let slot = Slot::with(Some(slot), held(Owner::Scope(2), "two's", LONG));
        assert!(matches!(
            slot.find(&1, |_| true),
            Some(Cached::Found("one's"))
        ));
        assert!(matches!(
            slot.find(&2, |_| true),
            Some(Cached::Found("two's"))
        ));
        assert!(slot.find(&3, |_| true).is_none());
        let slot = Slot::with(Some(slot), held(Owner::Shared, "everyone's", LONG));
        assert!(matches!(
            slot.find(&3, |_| true),
            Some(Cached::Found("everyone's"))
        ));
        assert!(slot.find(&3, |_| false).is_none(), "not to a scope refused");
        let one = Slot::with(None, held(Owner::Shared, "everyone's", LONG));
        assert!(one.find(&3, |s| *s != 3).is_none());
        assert!(one.find(&4, |s| *s != 3).is_some());
        assert!(
            matches!(slot.find(&1, |_| true), Some(Cached::Found("one's"))),
            "a scope's own value first"
        );
    }

    #[test]
    fn a_scopes_new_value_replaces_its_old_one_and_expired_ones_go() {
        let slot = Slot::with(None, held(Owner::Scope(1), "old", LONG));
        let slot = Slot::with(Some(slot), held(Owner::Scope(2), "gone", Duration::ZERO));
        assert!(slot.find(&2, |_| true).is_none(), "expired");
        let slot = Slot::with(Some(slot), held(Owner::Scope(1), "new", LONG));
        assert!(
            matches!(slot, Slot::One(_)),
            "the expired value was dropped"
        );
        assert!(matches!(
            slot.find(&1, |_| true),
            Some(Cached::Found("new"))
        ));
        assert_eq!(slot.weight(|_| 5), 5);
    }
}
