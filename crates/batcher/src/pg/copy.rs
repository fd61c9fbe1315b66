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

use super::statements::Statements;
use crate::db::{
    self, copy_sql, merge_sql, temp_table_sql, NumberedRow, Progress, IMPORT_TABLE, ROW_NUMBER,
};

/// One row's values, in the order of the columns being loaded.
pub type RowValues = Vec<Box<dyn ToSql + Sync + Send>>;

impl NumberedRow for RowValues {
    fn push_number(&mut self, number: u64) {
        self.push(Box::new(number as i64));
    }
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

pub use crate::db::{ConflictPolicy, ImportCounts};

/// Where rows come from, one at a time.
pub trait RowSource: Send {
    /// Why a row could not be produced (for example a malformed input line).
    type Error: std::error::Error + Send + Sync + 'static;

    /// The next row, or `None` at the end.
    fn next_row(&mut self) -> impl Future<Output = Result<Option<RowValues>, Self::Error>> + Send;
}

/// Why an import or copy failed, with the source's error `E`. Nothing of
/// it was committed.
pub type ImportError<E> = db::ImportError<E, tokio_postgres::Error>;

impl<E: std::error::Error + 'static> ImportError<E> {
    /// The server's report for a database error: constraint, detail.
    pub fn as_db_error(&self) -> Option<&tokio_postgres::error::DbError> {
        self.driver_error()?.as_db_error()
    }
}

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
    source: S,
    freeze: bool,
    progress: impl FnMut(u64) + Send,
) -> Result<u64, ImportError<S::Error>> {
    copy(tx, table, columns, source, freeze, progress, false).await
}

/// [`copy_rows`], with each row's number appended if `numbered`.
async fn copy<S: RowSource>(
    tx: &Transaction<'_>,
    table: &str,
    columns: &[(&str, Type)],
    mut source: S,
    freeze: bool,
    progress: impl FnMut(u64) + Send,
    numbered: bool,
) -> Result<u64, ImportError<S::Error>> {
    let names: Vec<&str> = columns.iter().map(|c| c.0).collect();
    let sink = tx
        .copy_in(&copy_sql(table, &names, "binary", freeze))
        .await
        .map_err(ImportError::from_db)?;
    let types: Vec<Type> = columns.iter().map(|c| c.1.clone()).collect();
    let mut writer = std::pin::pin!(BinaryCopyInWriter::new(sink, &types));
    let mut progress = Progress::new(progress, numbered);
    loop {
        let row = source
            .next_row()
            .await
            .map_err(|error| ImportError::Source {
                row: progress.next_row(),
                error,
            })?;
        let Some(mut values) = row else { break };
        progress.number(&mut values);
        let refs: Vec<&(dyn ToSql + Sync)> = values
            .iter()
            .map(|v| v.as_ref() as &(dyn ToSql + Sync))
            .collect();
        writer
            .as_mut()
            .write(&refs)
            .await
            .map_err(ImportError::from_db)?;
        progress.copied();
    }
    // Without finish() the COPY is aborted when the writer is dropped.
    writer.finish().await.map_err(ImportError::from_db)?;
    Ok(progress.finish())
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
    tx.batch_execute(&temp_table_sql(spec.table))
        .await
        .map_err(ImportError::Db)?;

    let mut columns: Vec<(&str, Type)> = spec.columns.to_vec();
    columns.push((ROW_NUMBER, Type::INT8));
    let rows = copy(&tx, IMPORT_TABLE, &columns, source, false, |_| {}, true).await?;

    let names: Vec<&str> = spec.columns.iter().map(|c| c.0).collect();
    let sql = merge_sql(spec.table, &names, spec.key, policy);
    let row = tx
        .query_one(&sql, &[])
        .await
        .map_err(ImportError::from_db)?;
    tx.commit().await.map_err(ImportError::Db)?;
    Ok(ImportCounts::from_totals(
        rows,
        (row.get(0), row.get(1), row.get(2)),
    ))
}
