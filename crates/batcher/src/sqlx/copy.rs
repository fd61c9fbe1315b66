//! Bulk loading with COPY, in CSV.
//!
//! [`import`] streams rows into a temporary table with COPY, then moves
//! them into the real table with one `INSERT ... SELECT ... ON CONFLICT`,
//! all in one transaction on one connection, as `pgbatch::pg::copy::import`
//! does. The temporary table is `ON COMMIT DROP`, private to that
//! connection's session: concurrent imports cannot clash over its name and
//! nothing is left behind. Since everything happens in that transaction,
//! an import also works through a transaction-mode pooler.
//!
//! [`copy_rows`] is the plain COPY into a table, for seeding empty tables
//! or inside a transaction of your own.
//!
//! Rows come from a [`RowSource`] one at a time, so memory does not grow
//! with the size of the input.
//!
//! ```no_run
//! use pgbatch::sqlx::copy::{self, ConflictPolicy, RowSource, RowValues, TableSpec};
//!
//! /// `(sku, name, stock)` lines, already parsed.
//! struct Lines(std::vec::IntoIter<(String, String, u32)>);
//!
//! impl RowSource for Lines {
//!     type Error = std::io::Error;
//!
//!     async fn next_row(&mut self) -> Result<Option<RowValues>, std::io::Error> {
//!         Ok(self.0.next().map(|(sku, name, stock)| {
//!             vec![Some(sku), Some(name), Some(stock.to_string())]
//!         }))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::PgPool::connect(&std::env::var("DATABASE_URL")?).await?;
//! let spec = TableSpec {
//!     table: "products",
//!     columns: &["sku", "name", "stock"],
//!     key: &["sku"],
//! };
//! let lines = Lines(vec![("A-1".into(), "bolt".into(), 40)].into_iter());
//! let mut conn = pool.acquire().await?;
//! let counts = copy::import(&mut conn, &spec, lines, ConflictPolicy::Overwrite).await?;
//! println!("{} new, {} replaced", counts.inserted, counts.updated);
//! # Ok(()) }
//! ```
//!
//! # What sqlx cannot do here
//!
//! sqlx streams COPY data as raw bytes (`PgCopyIn::send`) and has no writer
//! for binary COPY's row format, and the binary form its `Encode` writes
//! for query parameters is not that format. So rows travel as CSV text:
//! each value is given in Postgres's text form for its column's type (what
//! a `::text` cast prints and the type's input function reads: `42`,
//! `2024-05-01 12:00:00+00`, `\x0102` for `bytea`, `{1,2}` for an array),
//! and the server parses it, which costs more than binary for large
//! numbers, timestamps and `bytea`. The quoting is done here; a `None` is
//! `NULL`, distinct from an empty string.
//!
//! Unlike `pgbatch::pg::copy::import_with`, no statement timeout is set in
//! the import's transaction.

use std::future::Future;

use ::sqlx::postgres::{PgConnection, Postgres};
use ::sqlx::Connection as _;

use super::error::classify;
use crate::sqlstate::DbErrorKind;

/// One row's values, in the order of the columns being loaded: each in
/// Postgres's text form for its column's type, `None` for `NULL`.
pub type RowValues = Vec<Option<String>>;

/// Where rows come from.
pub trait RowSource: Send {
    /// Why a row could not be produced (for example a malformed input line).
    type Error: std::error::Error + Send + Sync + 'static;

    /// The next row, or `None` at the end.
    fn next_row(&mut self) -> impl Future<Output = Result<Option<RowValues>, Self::Error>> + Send;
}

/// The table rows are loaded into.
#[derive(Debug, Clone, Copy)]
pub struct TableSpec<'a> {
    /// The table's name.
    pub table: &'a str,
    /// The loaded columns, in row order. The server reads each value as
    /// its column's type.
    pub columns: &'a [&'a str],
    /// The columns of the unique key that conflicts are detected on.
    pub key: &'a [&'a str],
}

/// What [`import`] does with a row whose key already exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConflictPolicy {
    /// Keep the existing row.
    Skip,
    /// Replace the existing row.
    Overwrite,
    /// Abort the whole import ([`ImportError::Conflict`]).
    Fail,
}

/// What an import did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ImportCounts {
    /// Rows read from the source.
    pub rows: u64,
    /// Rows whose key was new.
    pub inserted: u64,
    /// Existing rows replaced (policy `Overwrite`).
    pub updated: u64,
    /// Rows not written because their key existed (policy `Skip`).
    pub skipped: u64,
    /// Rows replaced by a later row with the same key in the same import.
    pub superseded: u64,
}

/// Why an import or copy failed. Nothing of an import was committed; a
/// [`copy_rows`] inside a transaction of yours leaves that transaction
/// failed, to be rolled back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError<E: std::error::Error + 'static> {
    /// The source could not produce row `row` (numbered from 1).
    #[error("input row {row} is invalid")]
    Source {
        /// The row's number, from 1.
        row: u64,
        /// What was wrong with it.
        #[source]
        error: E,
    },
    /// With [`ConflictPolicy::Fail`]: a row's key already exists.
    #[error("a row's key already exists")]
    Conflict(#[source] ::sqlx::Error),
    /// The database refused a row: a constraint, a value its column's type
    /// cannot read, or a row with too many or too few values.
    #[error("the database refused a row")]
    Rejected(#[source] ::sqlx::Error),
    /// The database failed.
    #[error("the database failed during the import")]
    Db(#[source] ::sqlx::Error),
}

impl<E: std::error::Error + 'static> ImportError<E> {
    fn from_db(e: ::sqlx::Error) -> Self {
        match classify(&e) {
            DbErrorKind::UniqueViolation => ImportError::Conflict(e),
            kind if kind.is_row_fault() => ImportError::Rejected(e),
            _ => ImportError::Db(e),
        }
    }

    /// The kind of the database error, as [`classify`]
    /// sorts it ([`DbErrorKind::Other`] for a source error).
    pub fn kind(&self) -> DbErrorKind {
        self.as_sqlx_error().map_or(DbErrorKind::Other, classify)
    }

    /// Whether importing again may succeed (see
    /// [`is_retryable`](super::is_retryable)). The import runs in one
    /// transaction, so a failed one left nothing behind.
    pub fn is_retryable(&self) -> bool {
        self.as_sqlx_error().is_some_and(super::is_retryable)
    }

    /// The database error, if the database failed.
    pub fn as_sqlx_error(&self) -> Option<&::sqlx::Error> {
        match self {
            ImportError::Conflict(e) | ImportError::Rejected(e) | ImportError::Db(e) => Some(e),
            ImportError::Source { .. } => None,
        }
    }
}

fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn list(names: &[&str]) -> String {
    names
        .iter()
        .map(|&n| ident(n))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How often `progress` is called, in rows.
const PROGRESS_EVERY: u64 = 10_000;

/// How much CSV is gathered before it is sent: each `send` is a write and
/// a flush of its own.
const CHUNK: usize = 64 * 1024;

/// Appends `values` as one CSV line. Every value is quoted (a quote inside
/// doubled), so commas, quotes, line breaks and a lone `\.` are data; a
/// `None` is an empty unquoted field, which CSV COPY reads as `NULL`.
fn write_csv_row(buf: &mut Vec<u8>, values: &[Option<String>]) {
    for (i, value) in values.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        if let Some(text) = value {
            buf.push(b'"');
            for &b in text.as_bytes() {
                if b == b'"' {
                    buf.push(b'"');
                }
                buf.push(b);
            }
            buf.push(b'"');
        }
    }
    buf.push(b'\n');
}

/// Streams `source` into `table`'s `columns` with COPY in CSV on `conn`,
/// calling `progress` with the running count every 10,000 rows and at the
/// end. With `freeze`, uses `COPY ... FREEZE`, which needs the table
/// created or truncated in the same transaction. Returns the number of
/// rows copied.
///
/// Outside a transaction the COPY commits on its own; inside one (`conn`
/// a `sqlx::Transaction`'s connection), with it.
///
/// # Errors
///
/// When the source or the database fails. A source error aborts the COPY
/// (nothing of it is written); a row the database refuses is reported
/// once all rows are sent.
///
/// # Cancel safety
///
/// Dropping the future aborts the COPY: sqlx sends the abort with the
/// connection's next use, which then fails, so a pool discards the
/// connection when it tests it on its return. Nothing of the COPY is
/// written.
pub async fn copy_rows<S: RowSource>(
    conn: &mut PgConnection,
    table: &str,
    columns: &[&str],
    mut source: S,
    freeze: bool,
    mut progress: impl FnMut(u64) + Send,
) -> Result<u64, ImportError<S::Error>> {
    let sql = format!(
        "COPY {} ({}) FROM STDIN (FORMAT csv{})",
        ident(table),
        list(columns),
        if freeze { ", FREEZE" } else { "" }
    );
    let mut copy = conn.copy_in_raw(&sql).await.map_err(ImportError::from_db)?;
    let mut buf = Vec::with_capacity(CHUNK + 4096);
    let mut n = 0u64;
    loop {
        let values = match source.next_row().await {
            Ok(Some(values)) => values,
            Ok(None) => break,
            Err(error) => {
                // Aborted explicitly: a `PgCopyIn` dropped unfinished only
                // queues its abort, for whoever uses the connection next.
                // The source's error is the one to report.
                let _ = copy.abort("the import's source failed").await;
                return Err(ImportError::Source { row: n + 1, error });
            }
        };
        write_csv_row(&mut buf, &values);
        n += 1;
        if buf.len() >= CHUNK {
            copy.send(buf.as_slice())
                .await
                .map_err(ImportError::from_db)?;
            buf.clear();
        }
        if n % PROGRESS_EVERY == 0 {
            progress(n);
        }
    }
    if !buf.is_empty() {
        copy.send(buf.as_slice())
            .await
            .map_err(ImportError::from_db)?;
    }
    // Without finish() the COPY is aborted when `copy` is dropped.
    copy.finish().await.map_err(ImportError::from_db)?;
    progress(n);
    Ok(n)
}

/// Imports `source` into `spec.table` through a temporary table, applying
/// `policy` to keys that already exist, in one transaction on `conn` (a
/// `PoolConnection` from `pool.acquire()` will do). Within the import, the
/// last row of a key wins.
///
/// # Errors
///
/// [`ImportError`]; nothing of the import is committed then.
///
/// # Cancel safety
///
/// Dropping the future rolls the transaction back; nothing is committed.
pub async fn import<S: RowSource>(
    conn: &mut PgConnection,
    spec: &TableSpec<'_>,
    source: S,
    policy: ConflictPolicy,
) -> Result<ImportCounts, ImportError<S::Error>> {
    let mut tx = conn.begin().await.map_err(ImportError::Db)?;
    // Plain statements with no parameters: sent unprepared (sqlx's
    // `raw_sql`), so nothing is left on the connection.
    let create = format!(
        "CREATE TEMP TABLE import_rows (LIKE {} INCLUDING DEFAULTS, import_row bigint NOT NULL) \
         ON COMMIT DROP",
        ident(spec.table)
    );
    ::sqlx::raw_sql(&create)
        .execute(&mut *tx)
        .await
        .map_err(ImportError::Db)?;

    let mut columns: Vec<&str> = spec.columns.to_vec();
    columns.push("import_row");
    let numbered = Numbered { source, next: 0 };
    let rows = copy_rows(&mut tx, "import_rows", &columns, numbered, false, |_| {}).await?;

    let cols = list(spec.columns);
    let key = list(spec.key);
    let on_conflict = match policy {
        ConflictPolicy::Skip => format!("ON CONFLICT ({key}) DO NOTHING"),
        ConflictPolicy::Overwrite => {
            let set: Vec<String> = spec
                .columns
                .iter()
                .copied()
                .filter(|c| !spec.key.contains(c))
                .map(|c| format!("{0} = EXCLUDED.{0}", ident(c)))
                .collect();
            // Every column in the key: nothing to overwrite, but the row
            // still counts as updated, so set a key column to itself (an
            // empty SET list is a syntax error).
            let set = if set.is_empty() {
                spec.key
                    .iter()
                    .take(1)
                    .map(|k| format!("{0} = EXCLUDED.{0}", ident(k)))
                    .collect()
            } else {
                set
            };
            format!("ON CONFLICT ({key}) DO UPDATE SET {}", set.join(", "))
        }
        ConflictPolicy::Fail => String::new(),
    };
    // Counted in SQL so that a million-row import returns one row.
    let sql = format!(
        "WITH latest AS ( \
             SELECT DISTINCT ON ({key}) * FROM import_rows ORDER BY {key}, import_row DESC \
         ), written AS ( \
             INSERT INTO {table} ({cols}) SELECT {cols} FROM latest {on_conflict} \
             RETURNING (xmax = 0) AS inserted \
         ) \
         SELECT (SELECT count(*) FROM latest), \
                count(*) FILTER (WHERE inserted), count(*) FILTER (WHERE NOT inserted) \
         FROM written",
        table = ident(spec.table),
    );
    // Unnamed (`persistent(false)`): a statement built for this import
    // would only fill the connection's statement cache.
    let (distinct, inserted, updated) = ::sqlx::query_as::<Postgres, (i64, i64, i64)>(&sql)
        .persistent(false)
        .fetch_one(&mut *tx)
        .await
        .map_err(ImportError::from_db)?;
    tx.commit().await.map_err(ImportError::Db)?;
    let (distinct, inserted, updated) = (distinct as u64, inserted as u64, updated as u64);
    Ok(ImportCounts {
        rows,
        inserted,
        updated,
        skipped: distinct - inserted - updated,
        superseded: rows - distinct,
    })
}

/// Appends each row's number, so the last row of a key can win.
struct Numbered<S> {
    source: S,
    next: i64,
}

impl<S: RowSource> RowSource for Numbered<S> {
    type Error = S::Error;

    async fn next_row(&mut self) -> Result<Option<RowValues>, S::Error> {
        let Some(mut values) = self.source.next_row().await? else {
            return Ok(None);
        };
        self.next += 1;
        values.push(Some(self.next.to_string()));
        Ok(Some(values))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csv(values: &[Option<&str>]) -> String {
        let values: Vec<Option<String>> = values.iter().map(|v| v.map(str::to_owned)).collect();
        let mut buf = Vec::new();
        write_csv_row(&mut buf, &values);
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn values_are_quoted_and_null_is_an_empty_field() {
        assert_eq!(csv(&[Some("a"), None, Some("")]), "\"a\",,\"\"\n");
        assert_eq!(
            csv(&[Some("say \"hi\", then\nleave"), Some("\\.")]),
            "\"say \"\"hi\"\", then\nleave\",\"\\.\"\n"
        );
        assert_eq!(csv(&[None]), "\n");
        assert_eq!(csv(&[Some("ünï")]), "\"ünï\"\n");
    }

    #[test]
    fn names_are_quoted_identifiers() {
        assert_eq!(ident("we\"ird"), "\"we\"\"ird\"");
        assert_eq!(list(&["a", "B"]), "\"a\", \"B\"");
    }
}
