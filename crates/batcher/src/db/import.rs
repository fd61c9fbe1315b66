//! Bulk imports, whatever the driver: what to do with an existing key,
//! what an import did, why it failed, and the SQL around the driver's
//! COPY (the temporary table, and the one statement that moves its rows
//! into the real table). Each driver only streams the rows.

use super::classify::Classify;
use super::sqlstate::DbErrorKind;
use crate::error::Chain;

/// What an import does with a row whose key already exists.
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

impl ImportCounts {
    /// The counts of an import of `rows` rows, from the one row
    /// [`merge_sql`]'s statement returns: the distinct keys, and how many
    /// of them were inserted and updated.
    pub(crate) fn from_totals(rows: u64, (distinct, inserted, updated): (i64, i64, i64)) -> Self {
        let (distinct, inserted, updated) = (distinct as u64, inserted as u64, updated as u64);
        Self {
            rows,
            inserted,
            updated,
            skipped: distinct - inserted - updated,
            superseded: rows - distinct,
        }
    }
}

/// Why an import or copy failed, with the source's error `E` and the
/// driver's error `D`. Nothing of an import was committed; a copy inside a
/// transaction of yours leaves that transaction failed, to be rolled back.
/// Its `Display` names the cause.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError<E: std::error::Error + 'static, D: std::error::Error + 'static> {
    /// The source could not produce row `row` (numbered from 1).
    #[error("input row {row} is invalid: {}", Chain(.error))]
    Source {
        /// The row's number, from 1.
        row: u64,
        /// What was wrong with it.
        error: E,
    },
    /// With [`ConflictPolicy::Fail`]: a row's key already exists.
    #[error("a row's key already exists: {}", Chain(.0))]
    Conflict(D),
    /// The database refused a row: a constraint, a value its column's type
    /// cannot hold, or (in CSV) a row with too many or too few values.
    #[error("the database refused a row: {}", Chain(.0))]
    Rejected(D),
    /// The database failed.
    #[error("the database failed during the import: {}", Chain(.0))]
    Db(D),
}

impl<E, D> ImportError<E, D>
where
    E: std::error::Error + 'static,
    D: std::error::Error + 'static,
{
    /// The driver's error, if the database failed.
    pub fn driver_error(&self) -> Option<&D> {
        match self {
            ImportError::Conflict(e) | ImportError::Rejected(e) | ImportError::Db(e) => Some(e),
            ImportError::Source { .. } => None,
        }
    }
}

#[allow(private_bounds)] // `Classify` is how the crate sorts each driver's errors
impl<E, D> ImportError<E, D>
where
    E: std::error::Error + 'static,
    D: std::error::Error + Classify + 'static,
{
    /// A database error, as the variant its kind makes it.
    pub(crate) fn from_db(e: D) -> Self {
        match e.kind() {
            DbErrorKind::UniqueViolation => ImportError::Conflict(e),
            kind if kind.is_row_fault() => ImportError::Rejected(e),
            _ => ImportError::Db(e),
        }
    }

    /// The kind of the database error, as the driver's `classify` sorts it
    /// ([`DbErrorKind::Other`] for a source error).
    pub fn kind(&self) -> DbErrorKind {
        self.driver_error()
            .map_or(DbErrorKind::Other, Classify::kind)
    }

    /// Whether importing again may succeed (see
    /// [`DbErrorKind::is_retryable`]; sqlx's pool timeout is retryable
    /// too). The import runs in one transaction, so a failed one left
    /// nothing behind.
    pub fn is_retryable(&self) -> bool {
        self.driver_error().is_some_and(|e| e.is_retryable())
    }
}

/// A row an import numbers (the temporary table's [`ROW_NUMBER`]), so the
/// last row of a key can win: each driver's `copy::RowValues`.
pub(crate) trait NumberedRow {
    /// Appends the row's number, as the driver sends a `bigint`.
    fn push_number(&mut self, number: u64);
}

/// Counts a copy's rows, calling `progress` with the running count every
/// 10,000 rows and once at the end.
/// An import's copy also numbers them.
pub(crate) struct Progress<F> {
    rows: u64,
    progress: F,
    numbered: bool,
}

impl<F: FnMut(u64)> Progress<F> {
    pub(crate) fn new(progress: F, numbered: bool) -> Self {
        Self {
            rows: 0,
            progress,
            numbered,
        }
    }

    /// Appends the next row's number to `values`, if rows are numbered.
    pub(crate) fn number(&self, values: &mut impl NumberedRow) {
        if self.numbered {
            values.push_number(self.next_row());
        }
    }

    /// The number the next row will have, from 1.
    pub(crate) fn next_row(&self) -> u64 {
        self.rows + 1
    }

    /// One more row copied.
    pub(crate) fn copied(&mut self) {
        self.rows += 1;
        if self.rows % 10_000 == 0 {
            (self.progress)(self.rows);
        }
    }

    /// The rows copied, reported once more.
    pub(crate) fn finish(mut self) -> u64 {
        (self.progress)(self.rows);
        self.rows
    }
}

/// `name` as a quoted identifier.
pub(crate) fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `names` as a list of quoted identifiers.
pub(crate) fn list<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names.into_iter().map(ident).collect::<Vec<_>>().join(", ")
}

/// `COPY table (columns) FROM STDIN` in `format` (`binary`, `csv`), with
/// `FREEZE` if asked.
pub(crate) fn copy_sql(table: &str, columns: &[&str], format: &str, freeze: bool) -> String {
    format!(
        "COPY {} ({}) FROM STDIN (FORMAT {format}{})",
        ident(table),
        list(columns.iter().copied()),
        if freeze { ", FREEZE" } else { "" }
    )
}

/// The temporary table an import copies into: `table`'s columns, and each
/// row's number, dropped at commit.
pub(crate) fn temp_table_sql(table: &str) -> String {
    format!(
        "CREATE TEMP TABLE {IMPORT_TABLE} (LIKE {} INCLUDING DEFAULTS, {ROW_NUMBER} bigint NOT NULL) \
         ON COMMIT DROP",
        ident(table)
    )
}

/// The temporary table's name.
pub(crate) const IMPORT_TABLE: &str = "import_rows";
/// Its column numbering the rows, so the last row of a key wins.
pub(crate) const ROW_NUMBER: &str = "import_row";

/// The statement moving the imported rows into `table`: per key the last
/// row, `policy` for keys that exist, counted in SQL so that a
/// million-row import returns one row (the distinct keys, how many were
/// inserted, how many updated).
pub(crate) fn merge_sql(
    table: &str,
    columns: &[&str],
    key: &[&str],
    policy: ConflictPolicy,
) -> String {
    let cols = list(columns.iter().copied());
    let key_list = list(key.iter().copied());
    let on_conflict = match policy {
        ConflictPolicy::Skip => format!("ON CONFLICT ({key_list}) DO NOTHING"),
        ConflictPolicy::Overwrite => {
            // Every column in the key: nothing to overwrite, but the row
            // still counts as updated, so set a key column to itself (an
            // empty SET list is a syntax error).
            let assign = |c: &&str| format!("{0} = EXCLUDED.{0}", ident(c));
            let mut set: Vec<String> = columns
                .iter()
                .filter(|c| !key.contains(c))
                .map(assign)
                .collect();
            if set.is_empty() {
                set.extend(key.iter().take(1).map(assign));
            }
            format!("ON CONFLICT ({key_list}) DO UPDATE SET {}", set.join(", "))
        }
        ConflictPolicy::Fail => String::new(),
    };
    format!(
        "WITH latest AS ( \
             SELECT DISTINCT ON ({key_list}) * FROM {IMPORT_TABLE} \
             ORDER BY {key_list}, {ROW_NUMBER} DESC \
         ), written AS ( \
             INSERT INTO {table} ({cols}) SELECT {cols} FROM latest {on_conflict} \
             RETURNING (xmax = 0) AS inserted \
         ) \
         SELECT (SELECT count(*) FROM latest), \
                count(*) FILTER (WHERE inserted), count(*) FILTER (WHERE NOT inserted) \
         FROM written",
        table = ident(table),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_names_its_cause_in_its_text() {
        type E = ImportError<std::io::Error, std::io::Error>;
        let io = std::io::Error::other;
        let source = E::Source {
            row: 3,
            error: io("bad date"),
        };
        assert_eq!(source.to_string(), "input row 3 is invalid: bad date");
        assert!(std::error::Error::source(&source).is_none());
        let texts = [
            (E::Conflict(io("dup")), "a row's key already exists: dup"),
            (
                E::Rejected(io("too long")),
                "the database refused a row: too long",
            ),
            (
                E::Db(io("gone")),
                "the database failed during the import: gone",
            ),
        ];
        for (error, text) in texts {
            assert_eq!(error.to_string(), text);
        }
    }

    #[test]
    fn names_are_quoted_identifiers() {
        assert_eq!(ident("we\"ird"), "\"we\"\"ird\"");
        assert_eq!(list(["a", "B"]), "\"a\", \"B\"");
    }

    #[test]
    fn overwrite_sets_the_other_columns_or_else_a_key_column() {
        let sql = merge_sql("t", &["k", "a", "b"], &["k"], ConflictPolicy::Overwrite);
        assert!(
            sql.contains("DO UPDATE SET \"a\" = EXCLUDED.\"a\", \"b\" = EXCLUDED.\"b\" "),
            "{sql}"
        );
        let sql = merge_sql("t", &["k1", "k2"], &["k1", "k2"], ConflictPolicy::Overwrite);
        assert!(
            sql.contains("DO UPDATE SET \"k1\" = EXCLUDED.\"k1\" "),
            "{sql}"
        );
        let sql = merge_sql("t", &["k", "a"], &["k"], ConflictPolicy::Skip);
        assert!(sql.contains("ON CONFLICT (\"k\") DO NOTHING"), "{sql}");
        assert!(!merge_sql("t", &["k"], &["k"], ConflictPolicy::Fail).contains("ON CONFLICT"));
    }
}
