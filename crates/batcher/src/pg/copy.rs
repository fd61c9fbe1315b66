//! Bulk loading with binary COPY.
//!
//! [`import`] streams rows into a temporary table with binary COPY, then
//! moves them into the real table with one `INSERT ... SELECT ... ON
//! CONFLICT`, all in one transaction on one connection. The temporary table
//! is `ON COMMIT DROP`, private to that connection's session: concurrent
//! imports cannot clash over its name and nothing is left behind. (Doing
//! the steps through separate pool calls is how OpenSauced's version broke:
//! a temporary table exists only on the connection that made it.)
//!
//! [`copy_rows`] is the plain COPY into a table, used to seed empty tables.
//!
//! Rows come from a [`RowSource`] one at a time, so memory does not grow
//! with the size of the input.

use std::future::Future;

use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Transaction};

use super::error::{classify, DbErrorKind};
use super::statements::Statements;

/// One row's values, in the order of the columns being loaded.
pub type RowValues = Vec<Box<dyn ToSql + Sync + Send>>;

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
    /// The loaded columns and their types, in row order.
    pub columns: &'a [(&'a str, Type)],
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

/// Why an import or copy failed. Nothing of it was committed.
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
    Conflict(#[source] tokio_postgres::Error),
    /// The database refused a row (a constraint or a bad value).
    #[error("the database refused a row")]
    Rejected(#[source] tokio_postgres::Error),
    /// The database failed.
    #[error("the database failed during the import")]
    Db(#[source] tokio_postgres::Error),
}

impl<E: std::error::Error + 'static> ImportError<E> {
    fn from_db(e: tokio_postgres::Error) -> Self {
        match classify(&e) {
            DbErrorKind::UniqueViolation => ImportError::Conflict(e),
            kind if kind.is_row_fault() => ImportError::Rejected(e),
            _ => ImportError::Db(e),
        }
    }

    /// The kind of the database error, as [`classify`] sorts it
    /// ([`DbErrorKind::Other`] for a source error).
    pub fn kind(&self) -> DbErrorKind {
        match self {
            ImportError::Conflict(e) | ImportError::Rejected(e) | ImportError::Db(e) => classify(e),
            ImportError::Source { .. } => DbErrorKind::Other,
        }
    }

    /// Whether importing again may succeed (see
    /// [`DbErrorKind::is_retryable`]). The import runs in one transaction,
    /// so a failed one left nothing behind.
    pub fn is_retryable(&self) -> bool {
        self.kind().is_retryable()
    }

    /// The server's report for a database error: constraint, detail.
    pub fn as_db_error(&self) -> Option<&tokio_postgres::error::DbError> {
        match self {
            ImportError::Conflict(e) | ImportError::Rejected(e) | ImportError::Db(e) => {
                e.as_db_error()
            }
            ImportError::Source { .. } => None,
        }
    }
}

fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn list(names: impl IntoIterator<Item = impl AsRef<str>>) -> String {
    names
        .into_iter()
        .map(|n| ident(n.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How often `progress` is called, in rows.
const PROGRESS_EVERY: u64 = 10_000;

/// Streams `source` into `table` with binary COPY inside `tx`, calling
/// `progress` with the running count every 10,000 rows. With `freeze`,
/// uses `COPY ... FREEZE`, which needs the table created or truncated in
/// the same transaction.
///
/// # Errors
///
/// When the source or the database fails; the caller's transaction should
/// then be rolled back (dropping it does that).
pub async fn copy_rows<S: RowSource>(
    tx: &Transaction<'_>,
    table: &str,
    columns: &[(&str, Type)],
    mut source: S,
    freeze: bool,
    mut progress: impl FnMut(u64) + Send,
) -> Result<u64, ImportError<S::Error>> {
    let sql = format!(
        "COPY {} ({}) FROM STDIN (FORMAT binary{})",
        ident(table),
        list(columns.iter().map(|c| c.0)),
        if freeze { ", FREEZE" } else { "" }
    );
    let sink = tx.copy_in(&sql).await.map_err(ImportError::from_db)?;
    let types: Vec<Type> = columns.iter().map(|c| c.1.clone()).collect();
    let mut writer = std::pin::pin!(BinaryCopyInWriter::new(sink, &types));
    let mut n = 0u64;
    loop {
        let row = source
            .next_row()
            .await
            .map_err(|error| ImportError::Source { row: n + 1, error })?;
        let Some(values) = row else { break };
        let refs: Vec<&(dyn ToSql + Sync)> = values
            .iter()
            .map(|v| v.as_ref() as &(dyn ToSql + Sync))
            .collect();
        writer
            .as_mut()
            .write(&refs)
            .await
            .map_err(ImportError::from_db)?;
        n += 1;
        if n % PROGRESS_EVERY == 0 {
            progress(n);
        }
    }
    // Without finish() the COPY is aborted when the writer is dropped.
    writer.finish().await.map_err(ImportError::from_db)?;
    progress(n);
    Ok(n)
}

/// Imports `source` into `spec.table` through a temporary table, applying
/// `policy` to keys that already exist, in one transaction on `client`.
/// Within the import, the last row of a key wins.
///
/// Everything happens in that one transaction (the temporary table is
/// created `ON COMMIT DROP`, and the COPY's statement is closed before the
/// commit), so an import also works through a transaction-mode pooler.
///
/// # Errors
///
/// [`ImportError`]; nothing of the import is committed then.
pub async fn import<S: RowSource>(
    client: &mut Client,
    spec: &TableSpec<'_>,
    source: S,
    policy: ConflictPolicy,
) -> Result<ImportCounts, ImportError<S::Error>> {
    import_with(client, spec, source, policy, Statements::default()).await
}

/// As [`import`], with `statements`' statement timeout set in the import's
/// transaction (`SET LOCAL`): where the connection cannot carry it as a
/// session setting, behind a transaction-mode pooler. (The statement mode
/// changes nothing here: every statement of an import runs inside its one
/// transaction.)
///
/// # Errors
///
/// [`ImportError`]; nothing of the import is committed then.
pub async fn import_with<S: RowSource>(
    client: &mut Client,
    spec: &TableSpec<'_>,
    source: S,
    policy: ConflictPolicy,
    statements: Statements,
) -> Result<ImportCounts, ImportError<S::Error>> {
    let tx = client.transaction().await.map_err(ImportError::Db)?;
    statements.begin(&tx).await.map_err(ImportError::Db)?;
    tx.batch_execute(&format!(
        "CREATE TEMP TABLE import_rows (LIKE {} INCLUDING DEFAULTS, import_row bigint NOT NULL) \
         ON COMMIT DROP",
        ident(spec.table)
    ))
    .await
    .map_err(ImportError::Db)?;

    let mut columns: Vec<(&str, Type)> = spec.columns.to_vec();
    columns.push(("import_row", Type::INT8));
    let numbered = Numbered { source, next: 0 };
    let rows = copy_rows(&tx, "import_rows", &columns, numbered, false, |_| {}).await?;

    let cols = list(spec.columns.iter().map(|c| c.0));
    let key = list(spec.key.iter());
    let on_conflict = match policy {
        ConflictPolicy::Skip => format!("ON CONFLICT ({key}) DO NOTHING"),
        ConflictPolicy::Overwrite => {
            let set: Vec<String> = spec
                .columns
                .iter()
                .filter(|c| !spec.key.contains(&c.0))
                .map(|c| format!("{0} = EXCLUDED.{0}", ident(c.0)))
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
    let row = tx
        .query_one(&sql, &[])
        .await
        .map_err(ImportError::from_db)?;
    let (distinct, inserted, updated): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
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
        values.push(Box::new(self.next));
        Ok(Some(values))
    }
}
