//! Lists and pages: every row of a key, or the first N rows of a parent
//! after a cursor, for many keys in one statement.
//!
//! A page's statement is made by [`PageSql`] from the table, its parent
//! column and its order: one `LATERAL` subquery per parent, each an index
//! range scan that starts at the page's cursor (keyset pagination, not
//! `OFFSET`) and reads at most the page's size plus one row, which tells
//! whether a next page exists. Keys asking for pages of different sizes,
//! or after different cursors, share one statement: each key carries its
//! own size and cursor as array elements.

use std::fmt;
use std::hash::Hash;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

use super::import::ident;
use crate::Loaded;

/// Where a page starts: after the item this cursor came from. Opaque to
/// clients (a GraphQL connection's `endCursor`); made by the loader from an
/// item's order columns, and read back by [`PageSql::key`].
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Cursor(String);

impl Cursor {
    /// The cursor as text, to hand to a client.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The cursor of an item whose order columns read `values`, in the
    /// statement's order, as Postgres writes them as text (`'3'`,
    /// `'2024-01-01 00:00:00+00'`): where a page after that item starts.
    /// A loader makes each item's cursor itself (`Page::cursors`); this is
    /// for starting after a place the application knows.
    pub fn new<'a>(values: impl IntoIterator<Item = &'a str>) -> Self {
        // Each value length-prefixed, so any text survives; base64url so
        // the cursor is one opaque token in a URL or a query.
        let mut raw = String::new();
        for v in values {
            raw.push_str(&v.len().to_string());
            raw.push(':');
            raw.push_str(v);
        }
        Cursor(URL_SAFE_NO_PAD.encode(raw))
    }

    /// The order columns' values this cursor carries: exactly `count`
    /// of them, each read in place (a cursor is a client's input: its
    /// length is bounded before it is decoded, and reading it costs its
    /// length once).
    fn values(text: &str, count: usize) -> Result<Vec<String>, PageError> {
        let bad = PageError::BadCursor;
        if text.len() > MAX_CURSOR_PER_COLUMN.saturating_mul(count.max(1)) {
            return Err(bad("it is longer than any this statement makes"));
        }
        let raw = URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|_| bad("not base64url"))?;
        let raw = String::from_utf8(raw).map_err(|_| bad("not UTF-8"))?;
        let mut values = Vec::with_capacity(count);
        let mut rest = raw.as_str();
        while !rest.is_empty() {
            if values.len() == count {
                return Err(bad("it holds more values than the order has columns"));
            }
            let colon = rest.find(':').ok_or(bad("a value has no length"))?;
            let len: usize = rest[..colon]
                .parse()
                .map_err(|_| bad("a length is not a number"))?;
            let tail = &rest[colon + 1..];
            if tail.len() < len || !tail.is_char_boundary(len) {
                return Err(bad("a value is cut short"));
            }
            values.push(tail[..len].to_owned());
            rest = &tail[len..];
        }
        if values.len() != count {
            return Err(bad("it holds fewer values than the order has columns"));
        }
        Ok(values)
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cursor({:?})", self.0)
    }
}

/// One parent's page, as a key of a paged loader: the first `first`
/// children of `parent` after the cursor, if any. Made by
/// [`PageSql::key`], which checks the size and reads the cursor. Keys of
/// different sizes or cursors share a load.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PageKey<P> {
    parent: P,
    first: u32,
    /// The cursor's order-column values, as text.
    after: Option<Vec<String>>,
    /// Which statement made the key (a hash of its text): a loader of
    /// another fails it rather than read its cursor with other columns
    /// and types.
    sql: u64,
}

impl<P> PageKey<P> {
    /// The parent whose children the page holds.
    pub fn parent(&self) -> &P {
        &self.parent
    }

    /// The most items the page holds.
    pub fn first(&self) -> u32 {
        self.first
    }

    /// Whether the page starts after a cursor (else at the first child).
    pub fn is_after_cursor(&self) -> bool {
        self.after.is_some()
    }
}

/// A page of a parent's children: at most its key's `first` items, in
/// order, each with its cursor, and whether more follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<V> {
    /// The items, in the page's order.
    pub items: Vec<V>,
    /// Each item's cursor: a page after it starts with the next item.
    pub cursors: Vec<Cursor>,
    /// Whether the parent has children after the last item (the statement
    /// read one row more than the page holds).
    pub has_next_page: bool,
}

impl<V> Page<V> {
    /// The last item's cursor: where the next page starts.
    pub fn end_cursor(&self) -> Option<&Cursor> {
        self.cursors.last()
    }
}

impl<V> Default for Page<V> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            cursors: Vec::new(),
            has_next_page: false,
        }
    }
}

/// Why a page's statement could not be made, or a page could not be asked
/// for: a typed error naming the problem, before anything reaches the
/// database.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PageError {
    /// A page of no items was asked for.
    #[error("a page holds at least one item (`first` was 0)")]
    EmptyPage,
    /// A page larger than the statement's maximum was asked for.
    #[error("a page holds at most {max} items (`first` was {first})")]
    TooLarge {
        /// The size asked for.
        first: u32,
        /// The statement's maximum ([`PageSqlBuilder::max_first`]).
        max: u32,
    },
    /// The cursor is not one this statement made.
    #[error("the cursor does not decode: {0}")]
    BadCursor(&'static str),
    /// The cursor's value of this order column is not of its type.
    #[error("the cursor's value of order column {0:?} is not of its type")]
    BadCursorValue(String),
    /// The key was made by another page statement than the loader's.
    #[error("the page key was made by another page statement")]
    OtherStatement,
    /// A row's order column is NULL: a cursor cannot name its place.
    #[error("an order column of the page is NULL: order by NOT NULL columns")]
    NullOrder,
    /// A table or column name is not a plain identifier.
    #[error(
        "{0:?} is not a plain identifier (letters, digits and `_`, not starting with a digit)"
    )]
    BadName(String),
    /// A type name holds something other than letters, digits, spaces,
    /// `_`, `.`, parentheses and commas.
    #[error("{0:?} is not a type name")]
    BadType(String),
    /// The statement was given no order column, or no parent column.
    #[error("a page's statement needs {0}")]
    Missing(&'static str),
}

/// The statement of a paged loader: for each key, the first N + 1 rows of
/// its parent after its cursor, in the given order, in one statement for
/// every key of a load. Made with [`PageSql::builder`].
///
/// ```
/// use pgbatch::db::PageSql;
///
/// // Each book's reviews, newest first; `id` breaks ties, so the order is
/// // total and a cursor names one place in it.
/// let reviews = PageSql::builder("reviews")
///     .parent("book_id", "bigint")
///     .columns(["id", "rating", "body"])
///     .order_by("created_at", "timestamptz")
///     .order_by("id", "bigint")
///     .descending()
///     .max_first(50)
///     .build()?;
/// assert!(reviews.sql().contains("CROSS JOIN LATERAL"));
///
/// // A client's request: its size and cursor are checked here.
/// assert!(reviews.key(7_i64, 0, None).is_err());
/// assert!(reviews.key(7_i64, 10, Some("not a cursor")).is_err());
/// let first_page = reviews.key(7_i64, 10, None)?;
/// # let _ = first_page;
/// # Ok::<(), pgbatch::db::PageError>(())
/// ```
///
/// The statement it makes, for the example above (parameters: the parents,
/// each page's size plus one, and each order column's cursor values as
/// text, `NULL` for a first page):
///
/// ```text
/// SELECT c."id", c."rating", c."body", p.i, c."created_at"::text, c."id"::text
/// FROM unnest($1::bigint[], $2::int4[], $3::text[], $4::text[])
///      WITH ORDINALITY AS p(parent, lim, a1, a2, i)
/// CROSS JOIN LATERAL (
///   (SELECT * FROM "reviews" t WHERE t."book_id" = p.parent AND p.a1 IS NULL
///    ORDER BY t."created_at" DESC, t."id" DESC LIMIT p.lim)
///   UNION ALL
///   (SELECT * FROM "reviews" t WHERE t."book_id" = p.parent AND p.a1 IS NOT NULL
///      AND (t."created_at", t."id") < (p.a1::timestamptz, p.a2::bigint)
///    ORDER BY t."created_at" DESC, t."id" DESC LIMIT p.lim)
/// ) c
/// ORDER BY p.i, c."created_at" DESC, c."id" DESC
/// ```
///
/// Give the table an index on the parent column followed by the order
/// columns (`(book_id, created_at, id)`): each page is then one index
/// range scan starting at its cursor, whatever the page's depth. The
/// columns are read by position, from 0, in the order given; the last
/// order column should be unique within a parent (a primary key), so that
/// ties in the others are broken and no item is skipped or repeated.
#[derive(Debug, Clone)]
pub struct PageSql {
    sql: String,
    /// A hash of the statement, which its keys carry.
    id: u64,
    /// The order columns and their types, as given.
    order: Vec<(String, String)>,
    /// How many columns the page's values are read from, before the key's
    /// position and the cursor's values.
    columns: usize,
    orders: usize,
    max_first: u32,
}

/// Describes a [`PageSql`]; from [`PageSql::builder`].
#[derive(Debug, Clone)]
#[must_use = "builder does nothing until .build()"]
pub struct PageSqlBuilder {
    table: String,
    parent: Option<(String, String)>,
    columns: Vec<String>,
    order: Vec<(String, String)>,
    descending: bool,
    max_first: u32,
}

/// The largest page by default.
pub const DEFAULT_MAX_FIRST: u32 = 100;

/// The largest page a statement may allow: a page is read whole, plus one
/// row.
pub const MAX_FIRST: u32 = 10_000;

/// The longest cursor, per order column, that decoding looks at.
const MAX_CURSOR_PER_COLUMN: usize = 1_024;

impl PageSql {
    /// Starts describing the pages of `table`'s rows (`schema.table` for
    /// another schema than the search path's).
    pub fn builder(table: impl Into<String>) -> PageSqlBuilder {
        PageSqlBuilder {
            table: table.into(),
            parent: None,
            columns: Vec::new(),
            order: Vec::new(),
            descending: false,
            max_first: DEFAULT_MAX_FIRST,
        }
    }

    /// The statement's text.
    pub fn sql(&self) -> &str {
        &self.sql
    }

    /// How many order columns a cursor carries.
    pub fn order_columns(&self) -> usize {
        self.orders
    }

    /// The largest page.
    pub fn max_first(&self) -> u32 {
        self.max_first
    }

    /// The key of `parent`'s page of `first` items after `after` (a cursor
    /// this statement made, as a client sent it back), checked.
    ///
    /// # Errors
    ///
    /// [`PageError::EmptyPage`], [`PageError::TooLarge`], or
    /// [`PageError::BadCursor`] for a cursor that does not decode.
    pub fn key<P>(
        &self,
        parent: P,
        first: u32,
        after: Option<&str>,
    ) -> Result<PageKey<P>, PageError> {
        if first == 0 {
            return Err(PageError::EmptyPage);
        }
        if first > self.max_first {
            return Err(PageError::TooLarge {
                first,
                max: self.max_first,
            });
        }
        let after = after
            .map(|text| Cursor::values(text, self.orders))
            .transpose()?;
        if let Some(values) = &after {
            for (value, (column, sql_type)) in values.iter().zip(&self.order) {
                if !reads_as(value, sql_type) {
                    return Err(PageError::BadCursorValue(column.clone()));
                }
            }
        }
        Ok(PageKey {
            parent,
            first,
            after,
            sql: self.id,
        })
    }

    /// Whether `key` was made by this statement ([`key`](Self::key)), with
    /// a size it allows.
    pub(crate) fn made<P>(&self, key: &PageKey<P>) -> bool {
        key.sql == self.id && key.first <= self.max_first
    }

    /// How many columns hold an item's value, read from position 0.
    pub(crate) fn value_columns(&self) -> usize {
        self.columns
    }

    /// The statement's parameters after the parents: each page's size plus
    /// one (the row that tells whether a next page exists), then for each
    /// order column its cursor values.
    pub(crate) fn bounds<P>(&self, keys: &[PageKey<P>]) -> (Vec<i32>, Vec<Vec<Option<String>>>) {
        let limits = keys
            .iter()
            .map(|k| i32::try_from(k.first.min(self.max_first)).unwrap_or(i32::MAX - 1) + 1)
            .collect();
        let afters = (0..self.orders)
            .map(|c| {
                keys.iter()
                    // `get`: never a panic (a loader reads only keys its
                    // statement `made`, whose cursors have every column).
                    .map(|k| k.after.as_ref().and_then(|values| values.get(c).cloned()))
                    .collect()
            })
            .collect();
        (limits, afters)
    }
}

impl PageSqlBuilder {
    /// The column naming each row's parent, and its SQL type (`bigint`,
    /// `uuid`, `text`), which the parents' array is cast to.
    pub fn parent(mut self, column: impl Into<String>, sql_type: impl Into<String>) -> Self {
        self.parent = Some((column.into(), sql_type.into()));
        self
    }

    /// The columns each item is read from, by position from 0, in this
    /// order.
    pub fn columns<I, C>(mut self, columns: I) -> Self
    where
        I: IntoIterator<Item = C>,
        C: Into<String>,
    {
        self.columns = columns.into_iter().map(Into::into).collect();
        self
    }

    /// Orders each parent's children by `column` (of SQL type `sql_type`,
    /// which a cursor's value is cast back to), after the order columns
    /// given before it. End with a column unique within a parent.
    pub fn order_by(mut self, column: impl Into<String>, sql_type: impl Into<String>) -> Self {
        self.order.push((column.into(), sql_type.into()));
        self
    }

    /// Orders from the highest values down (every order column: a keyset
    /// cursor compares the order columns together).
    pub fn descending(mut self) -> Self {
        self.descending = true;
        self
    }

    /// The largest page a key may ask for; larger ones are refused by
    /// [`PageSql::key`]. Default [`DEFAULT_MAX_FIRST`].
    pub fn max_first(mut self, max: u32) -> Self {
        self.max_first = max;
        self
    }

    /// The statement.
    ///
    /// # Errors
    ///
    /// [`PageError`] naming a name or type that is not plain, or what is
    /// missing (a parent column, an order column, columns to read).
    pub fn build(self) -> Result<PageSql, PageError> {
        let (parent, parent_type) = self.parent.ok_or(PageError::Missing("a parent column"))?;
        if self.order.is_empty() {
            return Err(PageError::Missing("an order column"));
        }
        if self.columns.is_empty() {
            return Err(PageError::Missing("columns to read"));
        }
        if self.max_first == 0 {
            return Err(PageError::EmptyPage);
        }
        if self.max_first > MAX_FIRST {
            return Err(PageError::TooLarge {
                first: self.max_first,
                max: MAX_FIRST,
            });
        }
        let table = self
            .table
            .split('.')
            .map(|part| name(part).map(|_| ident(part)))
            .collect::<Result<Vec<_>, _>>()?
            .join(".");
        let parent = ident(name(&parent)?);
        let parent_type = sql_type(&parent_type)?;
        let columns: Vec<String> = self
            .columns
            .iter()
            .map(|c| name(c).map(ident))
            .collect::<Result<_, _>>()?;
        let order: Vec<(String, &str)> = self
            .order
            .iter()
            .map(|(c, t)| Ok((ident(name(c)?), sql_type(t)?)))
            .collect::<Result<_, PageError>>()?;
        let direction = if self.descending { " DESC" } else { "" };
        let cmp = if self.descending { "<" } else { ">" };
        let n = order.len();
        let list = |prefix: &str, f: &dyn Fn(usize, &(String, &str)) -> String| {
            order
                .iter()
                .enumerate()
                .map(|(i, o)| format!("{prefix}{}", f(i, o)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let order_t = list("t.", &|_, (c, _)| format!("{c}{direction}"));
        let order_c = list("c.", &|_, (c, _)| format!("{c}{direction}"));
        let row_t = list("t.", &|_, (c, _)| c.clone());
        let row_a = list("p.", &|i, (_, t)| format!("a{}::{t}", i + 1));
        let texts = list("c.", &|_, (c, _)| format!("{c}::text"));
        let arrays: String = (0..n).map(|i| format!(", ${}::text[]", i + 3)).collect();
        let names: String = (0..n).map(|i| format!(", a{}", i + 1)).collect();
        let values = columns
            .iter()
            .map(|c| format!("c.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "SELECT {values}, p.i, {texts} \
             FROM unnest($1::{parent_type}[], $2::int4[]{arrays}) \
             WITH ORDINALITY AS p(parent, lim{names}, i) \
             CROSS JOIN LATERAL (\
             (SELECT * FROM {table} t WHERE t.{parent} = p.parent AND p.a1 IS NULL \
             ORDER BY {order_t} LIMIT p.lim) \
             UNION ALL \
             (SELECT * FROM {table} t WHERE t.{parent} = p.parent AND p.a1 IS NOT NULL \
             AND ({row_t}) {cmp} ({row_a}) ORDER BY {order_t} LIMIT p.lim)\
             ) c \
             ORDER BY p.i, {order_c}"
        );
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        Hash::hash(&sql, &mut hasher);
        Ok(PageSql {
            id: std::hash::Hasher::finish(&hasher),
            sql,
            columns: columns.len(),
            orders: n,
            order: self.order,
            max_first: self.max_first,
        })
    }
}

/// `text`, if it is a plain identifier.
fn name(text: &str) -> Result<&str, PageError> {
    let plain = !text.is_empty()
        && text.len() <= 63
        && !text.starts_with(|c: char| c.is_ascii_digit())
        && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain {
        Ok(text)
    } else {
        Err(PageError::BadName(text.to_owned()))
    }
}

/// `text`, if it can only be a type name: an identifier, or one qualified
/// by a schema (`bigint`, `public.my_type`), or one of SQL's types of
/// several words (`double precision`, `timestamp with time zone`,
/// `character varying`), each with an optional modifier of one or two
/// numbers (`numeric(10, 2)`) and an optional `[]`. Nothing else: the type
/// is written into the statement unquoted.
fn sql_type(text: &str) -> Result<&str, PageError> {
    if is_type_name(text) {
        Ok(text)
    } else {
        Err(PageError::BadType(text.to_owned()))
    }
}

/// SQL's type names of several words.
const SEVERAL_WORDS: [&str; 9] = [
    "double precision",
    "character varying",
    "bit varying",
    "timestamp with time zone",
    "timestamp without time zone",
    "time with time zone",
    "time without time zone",
    "national character varying",
    "national character",
];

fn is_type_name(text: &str) -> bool {
    let text = text.trim();
    let text = text.strip_suffix("[]").unwrap_or(text);
    // The modifier, if any: `(n)` or `(n, m)`.
    let (base, modifier) = match text.find('(') {
        Some(at) => (text[..at].trim_end(), Some(&text[at..])),
        None => (text, None),
    };
    let modifier_ok = modifier.is_none_or(|m| {
        m.strip_prefix('(')
            .and_then(|m| m.strip_suffix(')'))
            .is_some_and(|inside| {
                let numbers: Vec<&str> = inside.split(',').map(str::trim).collect();
                numbers.len() <= 2
                    && numbers.iter().all(|n| {
                        !n.is_empty() && n.len() <= 6 && n.bytes().all(|b| b.is_ascii_digit())
                    })
            })
    });
    let words: Vec<String> = base
        .split_whitespace()
        .map(str::to_ascii_lowercase)
        .collect();
    let base_ok = match words.as_slice() {
        [] => false,
        [one] => {
            let parts: Vec<&str> = one.split('.').collect();
            parts.len() <= 2 && parts.iter().all(|p| name(p).is_ok())
        }
        several => SEVERAL_WORDS.contains(&several.join(" ").as_str()),
    };
    base_ok && modifier_ok
}

/// Whether a cursor's `value` reads as `sql_type`, where the type is one
/// whose text form is checked cheaply here (integers, booleans, UUIDs,
/// numbers, dates and times); other types are left to the database. A
/// cursor is a client's input, and a value the database cannot cast fails
/// the load it is in (its keys are then loaded one by one, so only the
/// forger's fails).
fn reads_as(value: &str, sql_type: &str) -> bool {
    let ty = sql_type.trim().to_ascii_lowercase();
    let ty = ty.split('(').next().unwrap_or("").trim();
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match ty {
        "smallint" | "int2" => value.parse::<i16>().is_ok(),
        "integer" | "int" | "int4" => value.parse::<i32>().is_ok(),
        "bigint" | "int8" => value.parse::<i64>().is_ok(),
        "boolean" | "bool" => matches!(value, "true" | "false" | "t" | "f"),
        "uuid" => {
            value.len() == 36
                && value.char_indices().all(|(i, c)| {
                    if [8, 13, 18, 23].contains(&i) {
                        c == '-'
                    } else {
                        c.is_ascii_hexdigit()
                    }
                })
        }
        "numeric" | "decimal" => {
            let (whole, fraction) = value.split_once('.').unwrap_or((value, "0"));
            digits(whole.strip_prefix('-').unwrap_or(whole)) && digits(fraction)
        }
        "date"
        | "timestamp"
        | "timestamptz"
        | "timestamp with time zone"
        | "timestamp without time zone"
        | "time"
        | "timetz" => {
            !value.is_empty()
                && value.len() <= 64
                && value.starts_with(|c: char| c.is_ascii_digit())
                && value
                    .chars()
                    .all(|c| c.is_ascii_digit() || "-:.+ T".contains(c))
        }
        _ => true,
    }
}

/// The rows of one paged load, gathered into each key's page: a row is
/// `(the key's position in the load, its order columns as text, its value
/// or why it did not map)`, in the statement's order.
pub(crate) fn gather_pages<P, V, E>(
    keys: Vec<PageKey<P>>,
    rows: impl IntoIterator<Item = (usize, Option<Vec<String>>, Result<V, E>)>,
) -> Loaded<PageKey<P>, Page<V>>
where
    P: Eq + Hash + fmt::Debug,
    E: std::error::Error + Send + Sync + 'static,
{
    let mut pages: Vec<Page<V>> = keys.iter().map(|_| Page::default()).collect();
    let mut failed: Vec<Option<E>> = keys.iter().map(|_| None).collect();
    let mut null_order = vec![false; keys.len()];
    for (at, order, value) in rows {
        let (Some(page), Some(key)) = (pages.get_mut(at), keys.get(at)) else {
            continue; // not a position of this load: the statement is not ours
        };
        if page.items.len() == key.first as usize {
            page.has_next_page = true;
            continue;
        }
        match (value, order) {
            (Ok(value), Some(order)) => {
                page.items.push(value);
                page.cursors
                    .push(Cursor::new(order.iter().map(String::as_str)));
            }
            // A NULL order column: no cursor can name the item's place.
            (Ok(_), None) => null_order[at] = true,
            (Err(e), _) => {
                failed[at].get_or_insert(e);
            }
        }
    }
    let mut loaded = Loaded::with_capacity(keys.len());
    let mut bad = super::BadRows::default();
    let outcomes = pages.into_iter().zip(failed).zip(null_order);
    for (key, ((page, failure), null)) in keys.into_iter().zip(outcomes) {
        match failure {
            Some(e) => bad.add(&mut loaded, Some(key), e),
            None if null => loaded.fail(key, PageError::NullOrder),
            None => {
                loaded.insert(key, page);
            }
        }
    }
    bad.settle(&mut loaded, |e| e);
    loaded
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reviews() -> PageSql {
        PageSql::builder("reviews")
            .parent("book_id", "bigint")
            .columns(["id", "body"])
            .order_by("created_at", "timestamptz")
            .order_by("id", "bigint")
            .max_first(10)
            .build()
            .unwrap()
    }

    #[test]
    fn a_cursor_round_trips_any_text() {
        for values in [
            vec!["2024-01-01 00:00:00+00", "7"],
            vec!["a:b", "1:x:"],
            vec!["", "é"],
        ] {
            let cursor = Cursor::new(values.iter().copied());
            assert!(cursor
                .as_str()
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c)));
            assert_eq!(Cursor::values(cursor.as_str(), 2).unwrap(), values);
        }
    }

    #[test]
    fn bad_input_is_a_typed_error_naming_the_problem() {
        let sql = reviews();
        assert_eq!(sql.key(1, 0, None).unwrap_err(), PageError::EmptyPage);
        assert_eq!(
            sql.key(1, 11, None).unwrap_err(),
            PageError::TooLarge { first: 11, max: 10 }
        );
        let one_value = Cursor::new(["x"]);
        for bad in ["!!", "bm9sZW5ndGg", one_value.as_str(), "Mjp4"] {
            assert!(
                matches!(sql.key(1, 5, Some(bad)), Err(PageError::BadCursor(_))),
                "{bad}"
            );
        }
        let built = |b: PageSqlBuilder| b.build().unwrap_err();
        let base = || {
            PageSql::builder("reviews")
                .parent("book_id", "bigint")
                .columns(["id"])
                .order_by("id", "bigint")
        };
        assert_eq!(
            built(base().order_by("x; DROP TABLE y", "int")),
            PageError::BadName("x; DROP TABLE y".into())
        );
        assert_eq!(
            built(base().order_by("x", "int'); --")),
            PageError::BadType("int'); --".into())
        );
        assert_eq!(
            built(PageSql::builder("r").columns(["id"]).order_by("id", "int")),
            PageError::Missing("a parent column")
        );
        assert_eq!(
            built(PageSql::builder("r").parent("p", "int").columns(["id"])),
            PageError::Missing("an order column")
        );
    }

    #[test]
    fn the_statement_starts_each_page_at_its_cursor_and_reads_one_row_more() {
        let sql = reviews();
        let text = sql.sql();
        assert!(
            text.starts_with(r#"SELECT c."id", c."body", p.i, c."created_at"::text, c."id"::text"#),
            "{text}"
        );
        assert!(
            text.contains(r#"(t."created_at", t."id") > (p.a1::timestamptz, p.a2::bigint)"#),
            "{text}"
        );
        assert!(
            text.contains("$1::bigint[], $2::int4[], $3::text[], $4::text[]"),
            "{text}"
        );
        let keys = vec![
            sql.key(1, 3, None).unwrap(),
            sql.key(
                2,
                5,
                Some(Cursor::new(["2024-01-01 00:00:00+00", "9"]).as_str()),
            )
            .unwrap(),
        ];
        let (limits, afters) = sql.bounds(&keys);
        assert_eq!(limits, [4, 6]);
        assert_eq!(
            afters,
            [
                vec![None, Some("2024-01-01 00:00:00+00".into())],
                vec![None, Some("9".into())]
            ]
        );
        let descending = PageSql::builder("s.r")
            .parent("p", "uuid")
            .columns(["v"])
            .order_by("id", "bigint")
            .descending()
            .build()
            .unwrap();
        assert!(
            descending.sql().contains(r#"FROM "s"."r" t"#),
            "{}",
            descending.sql()
        );
        assert!(descending.sql().contains(r#"(t."id") < (p.a1::bigint)"#));
    }

    #[test]
    fn rows_become_pages_with_their_cursors_and_a_next_page_flag() {
        let sql = reviews();
        let keys = vec![
            sql.key(10, 2, None).unwrap(),
            sql.key(20, 2, None).unwrap(),
            sql.key(30, 2, None).unwrap(),
            sql.key(40, 2, None).unwrap(),
        ];
        let row = |at: usize, id: &str, value: Result<&'static str, std::io::Error>| {
            (at, Some(vec!["t".to_owned(), id.to_owned()]), value)
        };
        let rows = vec![
            // 10: three rows for a page of two: a next page.
            row(0, "1", Ok("a")),
            row(0, "2", Ok("b")),
            row(0, "3", Ok("c")),
            // 20: exactly two.
            row(1, "4", Ok("d")),
            row(1, "5", Ok("e")),
            // 30: none. 40: a row that did not map.
            row(3, "6", Err(std::io::Error::other("NULL body"))),
        ];
        let mut loaded = gather_pages(keys.clone(), rows);
        let first = loaded.take(&keys[0]).unwrap().unwrap();
        assert_eq!(first.items, ["a", "b"]);
        assert!(first.has_next_page);
        assert_eq!(first.end_cursor(), Some(&Cursor::new(["t", "2"])));
        let second = loaded.take(&keys[1]).unwrap().unwrap();
        assert_eq!(second.items, ["d", "e"]);
        assert!(!second.has_next_page);
        assert_eq!(loaded.take(&keys[2]).unwrap().unwrap(), Page::default());
        let err = loaded.take(&keys[3]).unwrap_err().to_string();
        assert!(err.contains("did not map"), "{err}");
    }
}
