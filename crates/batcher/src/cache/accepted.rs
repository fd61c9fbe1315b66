//! The scopes whose loads the database accepted lately: only they are
//! served a value shared by every scope.
//!
//! A value marked shared (`CacheBuilder::shared_when`, `insert_shared`)
//! was read as some scope, or put by the application; a scope whose own
//! loads the database refuses (a role it may not take, a policy that
//! fails) must not be served it from the cache where the database would
//! have refused it. So a scope is served shared values only once one of
//! its own loads has succeeded, and for a while after (a cached value's
//! lifetime).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The scopes the database accepted, each with when that last happened.
///
/// Hand-written rather than a moka cache: it is written from a load's
/// synchronous hook (where moka's future cache would need an await), once
/// per load, and read only for a shared value; a map under a short lock
/// does both.
pub(super) struct Accepted<S> {
    /// `None` for a scope type with one value (`()`, unscoped caches):
    /// there is no other scope to keep apart.
    scopes: Option<Mutex<HashMap<S, Instant>>>,
    /// How long an acceptance lasts: the longest a value lives.
    lasts: Duration,
}

/// The most scopes remembered; past it, those not seen within `lasts` are
/// dropped, and if that is not enough, all of them (each scope's next
/// load accepts it again).
const MOST: usize = 65_536;

impl<S: Eq + Hash> Accepted<S> {
    pub(super) fn new(lasts: Duration) -> Self {
        Self {
            scopes: (size_of::<S>() > 0).then(|| Mutex::new(HashMap::new())),
            lasts,
        }
    }

    /// `scope`'s load just succeeded.
    pub(super) fn accept(&self, scope: &S)
    where
        S: Clone,
    {
        let Some(scopes) = &self.scopes else { return };
        let now = Instant::now();
        let mut scopes = lock(scopes);
        if let Some(at) = scopes.get_mut(scope) {
            *at = now;
            return;
        }
        if scopes.len() >= MOST {
            scopes.retain(|_, at| now.duration_since(*at) < self.lasts);
            if scopes.len() >= MOST {
                scopes.clear();
            }
        }
        scopes.insert(scope.clone(), now);
    }

    /// Whether `scope` may be served a shared value.
    pub(super) fn is_accepted(&self, scope: &S) -> bool {
        let Some(scopes) = &self.scopes else {
            return true;
        };
        lock(scopes)
            .get(scope)
            .is_some_and(|at| at.elapsed() < self.lasts)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Single inserts, lookups and a retain: a panic cannot leave the map
    // half-updated.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_is_accepted_once_a_load_of_its_own_succeeded() {
        let accepted = Accepted::new(Duration::from_secs(60));
        assert!(!accepted.is_accepted(&1u32));
        accepted.accept(&1);
        assert!(accepted.is_accepted(&1));
        assert!(!accepted.is_accepted(&2));
    }

    #[test]
    fn an_acceptance_lapses() {
        let accepted = Accepted::new(Duration::ZERO);
        accepted.accept(&1u32);
        assert!(!accepted.is_accepted(&1));
    }

    #[test]
    fn a_scope_type_of_one_value_is_always_accepted() {
        assert!(Accepted::<()>::new(Duration::ZERO).is_accepted(&()));
    }
}
