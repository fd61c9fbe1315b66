//! Rows that do not map to a key's value: each fails its own key when its
//! key can be read, else the keys of its batch left without a value.

use std::fmt;
use std::hash::Hash;

use crate::Loaded;

/// A row whose value did not map (a NULL where a value was expected, a
/// column of another type): it fails its own key alone. Its `Display`
/// names the key; the driver's error, which names the column, is its
/// [`source`](std::error::Error::source), so `pgbatch::Error`'s `Display`
/// reads "batch load failed: the row of key 17 did not map: error
/// deserializing column 1: ...".
#[derive(Debug, thiserror::Error)]
#[error("the row of key {key} did not map")]
pub struct UnmappedRow<E: std::error::Error + 'static> {
    key: String,
    #[source]
    error: E,
}

impl<E: std::error::Error + 'static> UnmappedRow<E> {
    /// The key, as its `Debug` shows it.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The driver's error.
    pub fn error(&self) -> &E {
        &self.error
    }
}

/// The rows of one load that did not map, as the load reads them.
pub(crate) struct BadRows<E> {
    keyed: usize,
    unkeyed: usize,
    /// The first error of a row whose key could not be read.
    first: Option<E>,
}

impl<E> Default for BadRows<E> {
    fn default() -> Self {
        Self {
            keyed: 0,
            unkeyed: 0,
            first: None,
        }
    }
}

impl<E: std::error::Error + Send + Sync + 'static> BadRows<E> {
    /// A row that failed with `error`, whose key is `key` if it could be
    /// read: that key fails now, alone.
    pub(crate) fn add<K, V>(&mut self, loaded: &mut Loaded<K, V>, key: Option<K>, error: E)
    where
        K: Eq + Hash + fmt::Debug,
    {
        match key {
            Some(key) => {
                self.keyed += 1;
                let shown = format!("{key:?}");
                loaded.fail(key, UnmappedRow { key: shown, error });
            }
            None => {
                self.unkeyed += 1;
                self.first.get_or_insert(error);
            }
        }
    }

    /// Logs the load's bad rows once, and fails the keys left without a
    /// value with the first keyless row's error (as `wrap` makes it the
    /// loader's), if there was such a row: one of them was its key, and
    /// none may read as "not found".
    pub(crate) fn settle<K, V, F>(self, loaded: &mut Loaded<K, V>, wrap: impl FnOnce(E) -> F)
    where
        K: Eq + Hash,
        F: std::error::Error + Send + Sync + 'static,
    {
        if self.keyed + self.unkeyed == 0 {
            return;
        }
        match self.first {
            Some(e) => {
                tracing::warn!(
                    keyed = self.keyed,
                    unkeyed = self.unkeyed,
                    error = %e,
                    "rows did not map; their keys fail, and a row whose key could not be read \
                     fails its batch's keys without a value"
                );
                loaded.fail_unanswered(wrap(e));
            }
            None => tracing::warn!(rows = self.keyed, "rows did not map; their keys fail"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_whose_key_is_known_fails_that_key_alone() {
        let mut loaded: Loaded<u32, &str> = Loaded::new();
        loaded.insert(1, "one");
        let mut bad = BadRows::default();
        bad.add(
            &mut loaded,
            Some(7),
            std::io::Error::other("column 1 is NULL"),
        );
        bad.settle(&mut loaded, |e| e);
        assert!(loaded.is_failed(&7));
        assert!(!loaded.is_failed(&2), "a key with no row is not found");
        let err = loaded.answer(&7).unwrap_err();
        assert_eq!(err.to_string(), "the row of key 7 did not map");
        assert_eq!(err.source().unwrap().to_string(), "column 1 is NULL");
    }

    #[test]
    fn a_row_whose_key_is_unknown_fails_the_keys_without_a_value() {
        let mut loaded: Loaded<u32, &str> = Loaded::new();
        loaded.insert(1, "one");
        let mut bad = BadRows::default();
        bad.add(&mut loaded, None, std::io::Error::other("column 0 is NULL"));
        bad.settle(&mut loaded, |e| e);
        assert!(loaded.is_failed(&2));
        assert_eq!(loaded.answer(&1).unwrap(), Some(&"one"));
    }
}
