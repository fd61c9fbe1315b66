//! What one load returns: the values it found, and the keys that failed
//! on their own.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use crate::error::SharedError;

/// What a [`Loader`](crate::Loader) returns for a batch: each key's value,
/// if found, and the keys that failed on their own.
///
/// A key of the batch that is neither given a value nor failed is "not
/// found" (`Ok(None)` to its callers). A key that failed gets
/// [`Error::Load`](crate::Error::Load) with its own error, and the other
/// keys of the batch still get their values; to fail the whole batch,
/// return the loader's error instead.
///
/// Most loaders only find values: collect them (`Loaded` is
/// [`FromIterator`] of key-value pairs) or convert a `HashMap` with
/// [`From`].
///
/// ```
/// use pgbatch::Loaded;
///
/// let mut loaded: Loaded<u32, String> = [(1, "one".to_owned())].into_iter().collect();
/// loaded.fail(2, std::io::Error::other("row 2 is corrupt"));
/// assert_eq!(loaded.get(&1).map(String::as_str), Some("one"));
/// assert!(loaded.is_failed(&2));
/// assert!(!loaded.is_failed(&3)); // not found
/// ```
pub struct Loaded<K, V> {
    values: HashMap<K, V>,
    failed: HashMap<K, SharedError>,
    /// The error of every key that got neither a value nor an error of its
    /// own (see [`Loaded::fail_unanswered`]).
    unanswered: Option<SharedError>,
}

impl<K, V> Default for Loaded<K, V> {
    fn default() -> Self {
        Self {
            values: HashMap::new(),
            failed: HashMap::new(),
            unanswered: None,
        }
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for Loaded<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loaded")
            .field("values", &self.values)
            .field("failed", &self.failed.keys().collect::<Vec<_>>())
            .field("unanswered_fail", &self.unanswered.is_some())
            .finish()
    }
}

impl<K: Eq + Hash, V> Loaded<K, V> {
    /// Nothing found yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Nothing found yet, with room for `n` values.
    pub fn with_capacity(n: usize) -> Self {
        Self {
            values: HashMap::with_capacity(n),
            ..Self::default()
        }
    }

    /// Gives `key` its value, returning the value it had, if any.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        self.values.insert(key, value)
    }

    /// Fails `key` alone with `error`: its callers get
    /// [`Error::Load`](crate::Error::Load), and it is not cached.
    pub fn fail(&mut self, key: K, error: impl std::error::Error + Send + Sync + 'static) {
        self.fail_shared(key, Arc::new(error));
    }

    /// [`fail`](Self::fail) with an error already shared (one error for
    /// several keys).
    pub fn fail_shared(&mut self, key: K, error: SharedError) {
        self.values.remove(&key);
        self.failed.insert(key, error);
    }

    /// Fails every key of the batch that got neither a value nor an error
    /// of its own with `error`, instead of answering it "not found": for a
    /// loader that could not tell which key a bad row belonged to, so that
    /// no key is wrongly reported missing.
    pub fn fail_unanswered(&mut self, error: impl std::error::Error + Send + Sync + 'static) {
        self.unanswered = Some(Arc::new(error));
    }

    /// The value found for `key`, if any.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.values.get(key)
    }

    /// Whether `key` failed (on its own, or as an unanswered key of a batch
    /// with [`fail_unanswered`](Self::fail_unanswered)).
    pub fn is_failed(&self, key: &K) -> bool {
        self.failed.contains_key(key)
            || (self.unanswered.is_some() && !self.values.contains_key(key))
    }

    /// `key`'s answer as its callers get it: its value, "not found", or
    /// its error.
    ///
    /// # Errors
    ///
    /// The key's own error, or the error of the unanswered keys.
    pub fn answer(&self, key: &K) -> Result<Option<&V>, &SharedError> {
        if let Some(value) = self.values.get(key) {
            return Ok(Some(value));
        }
        match (self.failed.get(key), &self.unanswered) {
            (Some(e), _) | (None, Some(e)) => Err(e),
            (None, None) => Ok(None),
        }
    }

    /// How many values were found.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether no value was found.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The values found, without the failures.
    pub fn into_values(self) -> HashMap<K, V> {
        self.values
    }

    /// Takes `key`'s answer out: its value, "not found", or its error.
    pub(crate) fn take(&mut self, key: &K) -> Result<Option<V>, SharedError> {
        if let Some(value) = self.values.remove(key) {
            return Ok(Some(value));
        }
        if let Some(e) = self.failed.get(key) {
            return Err(Arc::clone(e));
        }
        match &self.unanswered {
            Some(e) => Err(Arc::clone(e)),
            None => Ok(None),
        }
    }
}

impl<K: Eq + Hash, V> From<HashMap<K, V>> for Loaded<K, V> {
    fn from(values: HashMap<K, V>) -> Self {
        Self {
            values,
            ..Self::default()
        }
    }
}

impl<K: Eq + Hash, V> FromIterator<(K, V)> for Loaded<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self::from(iter.into_iter().collect::<HashMap<K, V>>())
    }
}

impl<K: Eq + Hash, V> Extend<(K, V)> for Loaded<K, V> {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, iter: I) {
        self.values.extend(iter);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_key_takes_its_own_answer() {
        let mut loaded: Loaded<u32, &str> = [(1, "a"), (2, "b")].into_iter().collect();
        loaded.fail(2, std::io::Error::other("bad"));
        assert_eq!(loaded.take(&1).unwrap(), Some("a"));
        assert!(loaded.take(&2).is_err(), "a failed key is not its value");
        assert_eq!(loaded.take(&3).unwrap(), None, "not found");
        loaded.fail_unanswered(std::io::Error::other("a row did not map"));
        assert!(loaded.take(&3).is_err(), "unanswered keys fail");
        assert!(loaded.is_failed(&3) && loaded.is_failed(&2));
        loaded.insert(4, "d");
        assert!(!loaded.is_failed(&4));
        assert_eq!(loaded.take(&4).unwrap(), Some("d"));
    }
}
