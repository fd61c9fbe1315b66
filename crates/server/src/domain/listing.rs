//! Listing a repository's objects the way lakeFS lists them: in byte order
//! of their paths, under a prefix, strictly after a cursor, a page at a
//! time, with everything below a delimiter folded into one common prefix
//! (a "directory").
//!
//! The objects come from range scans of the primary key (`path >= from
//! AND path < below ORDER BY path LIMIT n`); this module decides which
//! scans to run and what they mean, and is tested without a database. A
//! page without a delimiter is one scan. With one, each common prefix
//! found costs a scan that starts past its subtree, so a directory of a
//! million objects costs one row, not a million.

use std::future::Future;

use crate::model::objects::ObjectStats;

/// Most entries in one page (lakeFS's `amount` maximum).
pub const MAX_AMOUNT: usize = 1000;
/// Entries in a page when the request names no amount, or one below 1.
pub const DEFAULT_AMOUNT: usize = 100;

/// What to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListRequest {
    /// Only paths that start with it.
    pub prefix: String,
    /// Only entries after it (an entry's path or common prefix; `""`: from
    /// the start).
    pub after: String,
    /// Folds paths into common prefixes at its first occurrence after
    /// `prefix` (`""`: no folding).
    pub delimiter: String,
    /// Most entries in the page (1 to [`MAX_AMOUNT`]).
    pub amount: usize,
}

impl ListRequest {
    /// The page size a request's `amount` asks for, as lakeFS reads it:
    /// missing or below 1 is [`DEFAULT_AMOUNT`], above [`MAX_AMOUNT`] is
    /// that.
    pub fn amount_of(asked: Option<i64>) -> usize {
        match asked {
            Some(n) if n >= 1 => usize::try_from(n).unwrap_or(MAX_AMOUNT).min(MAX_AMOUNT),
            _ => DEFAULT_AMOUNT,
        }
    }
}

/// One entry of a listing.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// An object.
    Object(ObjectStats),
    /// Every path that starts with this (ending in the delimiter).
    CommonPrefix(String),
}

impl Entry {
    /// The entry's path: the object's, or the common prefix.
    pub fn path(&self) -> &str {
        match self {
            Entry::Object(o) => &o.path,
            Entry::CommonPrefix(p) => p,
        }
    }
}

/// A page of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Listing {
    /// At most the request's `amount`, in order.
    pub entries: Vec<Entry>,
    /// Entries follow the last of `entries`.
    pub has_more: bool,
}

/// The smallest string above every string that starts with `prefix`: the
/// prefix with its last character incremented (byte order follows
/// character order in UTF-8). `None` for an empty prefix, or one whose
/// last character has no successor, which nothing bounds.
pub fn upper_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (u32::from(last) + 1..=u32::from(char::MAX)).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// The common prefix `path` folds into: `prefix` and what follows it up to
/// the first `delimiter` after it, that included. `None` with no delimiter
/// there, or none given: then `path` is an object's (a cursor equal to
/// `prefix` is the object at that path, a "directory marker").
fn common_prefix(path: &str, prefix: &str, delimiter: &str) -> Option<String> {
    if delimiter.is_empty() {
        return None;
    }
    let rest = path.strip_prefix(prefix)?;
    let at = rest.find(delimiter)?;
    Some(format!("{prefix}{}", &rest[..at + delimiter.len()]))
}

/// One page for `request`, from range scans by `scan(from, below, limit)`:
/// the objects with `from <= path < below` (no upper bound with `None`) in
/// path order, at most `limit` of them.
///
/// # Errors
///
/// The first error of `scan`.
pub async fn list<E, F, Fut>(request: &ListRequest, mut scan: F) -> Result<Listing, E>
where
    F: FnMut(String, Option<String>, i64) -> Fut,
    Fut: Future<Output = Result<Vec<ObjectStats>, E>>,
{
    let prefix = request.prefix.as_str();
    let delimiter = request.delimiter.as_str();
    let below = upper_bound(prefix);
    let want = request.amount.clamp(1, MAX_AMOUNT) + 1;
    // Where the next scan starts, and a path at its start to skip (the
    // cursor itself: entries come strictly after it).
    let (mut from, mut skip) = if request.after.as_str() < prefix {
        (prefix.to_owned(), None)
    } else if let Some(common) = common_prefix(&request.after, prefix, delimiter) {
        // Everything under it was listed with it, at or before the cursor.
        match upper_bound(&common) {
            Some(past) => (past, None),
            None => {
                return Ok(Listing {
                    entries: Vec::new(),
                    has_more: false,
                })
            }
        }
    } else {
        (request.after.clone(), Some(request.after.clone()))
    };
    let mut entries: Vec<Entry> = Vec::new();
    'scans: while entries.len() < want {
        if below.as_deref().is_some_and(|b| from.as_str() >= b) {
            break;
        }
        let limit = want - entries.len() + usize::from(skip.is_some());
        let rows = scan(
            from.clone(),
            below.clone(),
            i64::try_from(limit).unwrap_or(i64::MAX),
        )
        .await?;
        let exhausted = rows.len() < limit;
        let mut last = None;
        for row in rows {
            if skip.as_deref() == Some(row.path.as_str()) {
                continue;
            }
            if let Some(common) = common_prefix(&row.path, prefix, delimiter) {
                // Past its subtree: the next scan starts there.
                match upper_bound(&common) {
                    Some(past) => {
                        from = past;
                        skip = None;
                    }
                    None => {
                        entries.push(Entry::CommonPrefix(common));
                        break 'scans;
                    }
                }
                entries.push(Entry::CommonPrefix(common));
                continue 'scans;
            }
            last = Some(row.path.clone());
            entries.push(Entry::Object(row));
            if entries.len() >= want {
                break 'scans;
            }
        }
        match last {
            Some(path) if !exhausted => {
                from.clone_from(&path);
                skip = Some(path);
            }
            _ => break,
        }
    }
    let has_more = entries.len() > request.amount;
    entries.truncate(request.amount);
    Ok(Listing { entries, has_more })
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::convert::Infallible;

    use super::*;

    fn object(path: &str) -> ObjectStats {
        ObjectStats {
            path: path.to_owned(),
            physical_address: format!("s3://b/{path}"),
            checksum: "c".to_owned(),
            size_bytes: 1,
            mtime: 0,
            content_type: "text/plain".to_owned(),
            metadata: serde_json::json!({}),
        }
    }

    /// Lists `paths` (sorted here) as the database would, counting scans.
    async fn listed(
        paths: &[&str],
        request: ListRequest,
        scans: &Cell<usize>,
    ) -> (Vec<String>, bool) {
        let mut sorted: Vec<&str> = paths.to_vec();
        sorted.sort_unstable();
        let page = list(&request, |from, below, limit| {
            scans.set(scans.get() + 1);
            let rows: Vec<ObjectStats> = sorted
                .iter()
                .filter(|p| **p >= from.as_str() && below.as_deref().is_none_or(|b| **p < b))
                .take(usize::try_from(limit).unwrap())
                .map(|p| object(p))
                .collect();
            async move { Ok::<_, Infallible>(rows) }
        })
        .await
        .unwrap();
        let names = page.entries.iter().map(|e| match e {
            Entry::Object(o) => o.path.clone(),
            Entry::CommonPrefix(p) => format!("{p}*"),
        });
        (names.collect(), page.has_more)
    }

    fn req(prefix: &str, after: &str, delimiter: &str, amount: usize) -> ListRequest {
        ListRequest {
            prefix: prefix.to_owned(),
            after: after.to_owned(),
            delimiter: delimiter.to_owned(),
            amount,
        }
    }

    const TREE: [&str; 8] = ["a/1", "a/2", "a/b/3", "b/1", "c", "d", "e", "z/9"];

    #[tokio::test]
    async fn pages_in_byte_order_strictly_after_the_cursor() {
        let scans = Cell::new(0);
        assert_eq!(
            listed(&TREE, req("", "", "", 3), &scans).await,
            (vec!["a/1".into(), "a/2".into(), "a/b/3".into()], true)
        );
        assert_eq!(scans.get(), 1, "one range scan per page");
        assert_eq!(
            listed(&TREE, req("", "a/b/3", "", 3), &scans).await,
            (vec!["b/1".into(), "c".into(), "d".into()], true)
        );
        assert_eq!(
            listed(&TREE, req("", "d", "", 3), &scans).await,
            (vec!["e".into(), "z/9".into()], false)
        );
        assert_eq!(
            listed(&TREE, req("a/", "", "", 10), &scans).await,
            (vec!["a/1".into(), "a/2".into(), "a/b/3".into()], false)
        );
    }

    #[tokio::test]
    async fn a_delimiter_folds_subtrees_into_common_prefixes_across_pages() {
        let scans = Cell::new(0);
        let mut pages = Vec::new();
        let mut after = String::new();
        loop {
            let (page, more) = listed(&TREE, req("", &after, "/", 2), &scans).await;
            after = page.last().unwrap().trim_end_matches('*').to_owned();
            pages.push(page);
            if !more {
                break;
            }
        }
        assert_eq!(
            pages,
            vec![
                vec!["a/*".to_owned(), "b/*".to_owned()],
                vec!["c".to_owned(), "d".to_owned()],
                vec!["e".to_owned(), "z/*".to_owned()],
            ]
        );
        // Under a prefix, the next level.
        assert_eq!(
            listed(&TREE, req("a/", "", "/", 10), &Cell::new(0)).await,
            (vec!["a/1".into(), "a/2".into(), "a/b/*".into()], false)
        );
    }

    #[tokio::test]
    async fn a_cursor_equal_to_the_prefix_is_an_object_not_a_directory() {
        // "a/" is a directory marker object, listed under prefix "a/";
        // a page that ends on it must not skip the rest of "a/".
        let tree = ["a/", "a/1", "a/b/2", "a/c", "b"];
        let scans = Cell::new(0);
        let mut pages = Vec::new();
        let mut after = String::new();
        loop {
            let (page, more) = listed(&tree, req("a/", &after, "/", 1), &scans).await;
            after = page.last().unwrap().trim_end_matches('*').to_owned();
            pages.extend(page);
            if !more {
                break;
            }
        }
        assert_eq!(pages, ["a/", "a/1", "a/b/*", "a/c"]);
    }

    #[tokio::test]
    async fn a_cursor_inside_a_common_prefix_resumes_past_it() {
        // A cursor a client made up, below the common prefix "a/b/": that
        // prefix is at or before the cursor, so it is not listed again.
        let tree = ["a/1", "a/b/2", "a/b/3/4", "a/c"];
        assert_eq!(
            listed(&tree, req("a/", "a/b/2", "/", 10), &Cell::new(0)).await,
            (vec!["a/c".into()], false)
        );
        assert_eq!(
            listed(&tree, req("", "a/b/", "/", 10), &Cell::new(0)).await,
            (vec![], false)
        );
    }

    #[tokio::test]
    async fn a_large_directory_costs_one_row_not_all_of_them() {
        let many: Vec<String> = (0..5000).map(|i| format!("big/{i:05}")).collect();
        let mut paths: Vec<&str> = many.iter().map(String::as_str).collect();
        paths.extend(["a", "c"]);
        let scans = Cell::new(0);
        assert_eq!(
            listed(&paths, req("", "", "/", 10), &scans).await,
            (vec!["a".into(), "big/*".into(), "c".into()], false)
        );
        assert!(scans.get() <= 3, "{} scans", scans.get());
    }

    #[test]
    fn upper_bounds_and_amounts() {
        assert_eq!(upper_bound("a/").as_deref(), Some("a0"));
        assert_eq!(upper_bound("ab").as_deref(), Some("ac"));
        assert_eq!(upper_bound(""), None);
        assert_eq!(upper_bound("a\u{d7ff}").as_deref(), Some("a\u{e000}"));
        assert_eq!(upper_bound("a\u{10ffff}").as_deref(), Some("b"));
        assert_eq!(ListRequest::amount_of(None), DEFAULT_AMOUNT);
        assert_eq!(ListRequest::amount_of(Some(0)), DEFAULT_AMOUNT);
        assert_eq!(ListRequest::amount_of(Some(-1)), DEFAULT_AMOUNT);
        assert_eq!(ListRequest::amount_of(Some(7)), 7);
        assert_eq!(ListRequest::amount_of(Some(5000)), MAX_AMOUNT);
    }
}
