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

use crate::db::{
    self, copy_sql, merge_sql, temp_table_sql, NumberedRow, Progress, IMPORT_TABLE, ROW_NUMBER,
};

/// One row's values, in the order of the columns being loaded: each in
/// Postgres's text form for its column's type, `None` for `NULL`.
pub type RowValues = Vec<Option<String>>;

impl NumberedRow for RowValues {
    fn push_number(&mut self, number: u64) {
        self.push(Some(number.to_string()));
    }
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

pub use crate::db::{ConflictPolicy, ImportCounts};

/// Where rows come from, one at a time.
pub trait RowSource: Send {
    /// Why a row could not be produced (for example a malformed input line).
    type Error: std::error::Error + Send + Sync + 'static;

    /// The next row, or `None` at the end.
    fn next_row(&mut self) -> impl Future<Output = Result<Option<RowValues>, Self::Error>> + Send;
}

/// Why an import or copy failed, with the source's error `E`. Nothing of
/// an import was committed; a [`copy_rows`] inside a transaction of yours
/// leaves that transaction failed, to be rolled back.
pub type ImportError<E> = db::ImportError<E, ::sqlx::Error>;

impl<E: std::error::Error + 'static> ImportError<E> {
    /// The database error, if the database failed.
    pub fn as_sqlx_error(&self) -> Option<&::sqlx::Error> {
        self.driver_error()
    }
}

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
    source: S,
    freeze: bool,
    progress: impl FnMut(u64) + Send,
) -> Result<u64, ImportError<S::Error>> {
    copy(conn, table, columns, source, freeze, progress, false).await
}

/// [`copy_rows`], with each row's number appended if `numbered`.
async fn copy<S: RowSource>(
    conn: &mut PgConnection,
    table: &str,
    columns: &[&str],
    mut source: S,
    freeze: bool,
    progress: impl FnMut(u64) + Send,
    numbered: bool,
) -> Result<u64, ImportError<S::Error>> {
    let sql = copy_sql(table, columns, "csv", freeze);
    let mut copy = conn.copy_in_raw(&sql).await.map_err(ImportError::from_db)?;
    let mut buf = Vec::with_capacity(CHUNK + 4096);
    let mut progress = Progress::new(progress, numbered);
    loop {
        let mut values = match source.next_row().await {
            Ok(Some(values)) => values,
            Ok(None) => break,
            Err(error) => {
                // Aborted explicitly: a `PgCopyIn` dropped unfinished only
                // queues its abort, for whoever uses the connection next.
                // The source's error is the one to report.
                let _ = copy.abort("the import's source failed").await;
                return Err(ImportError::Source {
                    row: progress.next_row(),
                    error,
                });
            }
        };
        progress.number(&mut values);
        write_csv_row(&mut buf, &values);
        progress.copied();
        if buf.len() >= CHUNK {
            copy.send(buf.as_slice())
                .await
                .map_err(ImportError::from_db)?;
            buf.clear();
        }
    }
    if !buf.is_empty() {
        copy.send(buf.as_slice())
            .await
            .map_err(ImportError::from_db)?;
    }
    // Without finish() the COPY is aborted when `copy` is dropped.
    copy.finish().await.map_err(ImportError::from_db)?;
    Ok(progress.finish())
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
    ::sqlx::raw_sql(&temp_table_sql(spec.table))
        .execute(&mut *tx)
        .await
        .map_err(ImportError::Db)?;

    let mut columns: Vec<&str> = spec.columns.to_vec();
    columns.push(ROW_NUMBER);
    let rows = copy(&mut tx, IMPORT_TABLE, &columns, source, false, |_| {}, true).await?;

    let sql = merge_sql(spec.table, spec.columns, spec.key, policy);
    // Unnamed (`persistent(false)`): a statement built for this import
    // would only fill the connection's statement cache.
    let totals = ::sqlx::query_as::<Postgres, (i64, i64, i64)>(&sql)
        .persistent(false)
        .fetch_one(&mut *tx)
        .await
        .map_err(ImportError::from_db)?;
    tx.commit().await.map_err(ImportError::Db)?;
    Ok(ImportCounts::from_totals(rows, totals))
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
}
