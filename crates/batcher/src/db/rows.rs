//! How a load's rows answer its keys: one row a key ([`Single`]), every
//! row of a key in order ([`List`]), or a page of a parent's children
//! ([`Paged`], see [`super::page`]); and rows that do not map, each
//! failing its own key when its key can be read, else the keys of its
//! batch left without a value.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;

use crate::Loaded;

/// A loader's rows answer each key with one value: its row's (a second row
/// of the key replaces the first). What `PgLoader::new` and
/// `SqlxLoader::new` make; "not found" for a key with no row.
#[derive(Debug, Clone, Copy, Default)]
pub struct Single;

/// A loader's rows answer each key with all of its rows' values, in the
/// order the statement returns them: an empty list for a key with none.
/// What `lists()` makes of a loader.
#[derive(Debug, Clone, Copy, Default)]
pub struct List;

/// A loader's rows answer each [`PageKey`](super::PageKey) with a
/// [`Page`](super::Page): what `PgLoader::pages` and `SqlxLoader::pages`
/// make.
#[derive(Debug, Clone, Copy, Default)]
pub struct Paged;

/// The rows of one list load, gathered into each key's list: `rows` in the
/// statement's order, each a key and value, or why it did not map (with
/// its key, if it could be read). Every one of `keys` is answered: its
/// list, empty if it had no row; or its row's error; or, if a row whose
/// key could not be read failed, that error for every key without a row
/// (one of them was its key, and none may read as empty).
pub(crate) fn gather_lists<K, V, E>(
    keys: &[K],
    rows: impl IntoIterator<Item = Result<(K, V), (Option<K>, E)>>,
) -> Loaded<K, Vec<V>>
where
    K: Clone + Eq + Hash + fmt::Debug,
    E: std::error::Error + Send + Sync + 'static,
{
    let mut lists: HashMap<K, Vec<V>> = HashMap::with_capacity(keys.len());
    let mut failures = Vec::new();
    for row in rows {
        match row {
            Ok((key, value)) => lists.entry(key).or_default().push(value),
            Err(failure) => failures.push(failure),
        }
    }
    let mut loaded = Loaded::with_capacity(keys.len());
    let unkeyed = failures.iter().any(|(key, _)| key.is_none());
    for key in keys {
        match lists.remove(key) {
            Some(list) => {
                loaded.insert(key.clone(), list);
            }
            // With an unkeyed bad row, a key without rows is not known to
            // be empty: `settle` fails it.
            None if !unkeyed => {
                loaded.insert(key.clone(), Vec::new());
            }
            None => {}
        }
    }
    let mut bad = BadRows::default();
    for (key, e) in failures {
        bad.add(&mut loaded, key, e);
    }
    bad.settle(&mut loaded, |e| e);
    loaded
}

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

    /// A row of a list load: a key and value, or a key (if read) and why
    /// not.
    type Row = Result<(u32, &'static str), (Option<u32>, std::io::Error)>;

    #[test]
    fn a_list_holds_every_row_of_its_key_in_order_and_a_bad_row_fails_its_key() {
        let rows: Vec<Row> = vec![
            Ok((1, "a")),
            Ok((2, "x")),
            Ok((1, "b")),
            Err((Some(3), std::io::Error::other("NULL"))),
            Ok((3, "c")),
        ];
        let mut loaded = gather_lists(&[1, 2, 3, 4], rows);
        assert_eq!(loaded.take(&1).unwrap(), Some(vec!["a", "b"]));
        assert_eq!(loaded.take(&2).unwrap(), Some(vec!["x"]));
        assert!(loaded.take(&3).is_err(), "its bad row fails the whole list");
        assert_eq!(loaded.take(&4).unwrap(), Some(vec![]), "no rows: empty");
        let unkeyed: Vec<Row> = vec![Ok((1, "a")), Err((None, std::io::Error::other("NULL key")))];
        let mut loaded = gather_lists(&[1, 2], unkeyed);
        assert_eq!(loaded.take(&1).unwrap(), Some(vec!["a"]));
        assert!(loaded.take(&2).is_err(), "not known to be empty");
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
