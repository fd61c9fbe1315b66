//! What the two Postgres drivers share (features `postgres` and `sqlx`):
//! who a scoped load runs as ([`Scope`]), the SQLSTATE classification, how
//! statements are sent, the writer's batches and the import's counts and
//! errors. Each driver
//! ([`pg`](crate::pg) over tokio-postgres, [`sqlx`](crate::sqlx)) keeps
//! only what talks to its own client and re-exports these under its own
//! path, with the driver's error filled in (`pg::RowError` is
//! [`RowError`]`<tokio_postgres::Error>`, `pg::Writer<R>` is
//! [`Writer`]`<R, tokio_postgres::Error>`), so a user of either finds
//! them by the same names.
//!
//! Inside the crate, a module uses only those listed below it:
//!
//! ```text
//! scope      Scope: a role and transaction-local settings; the prologue that
//!            sets them and the role check
//! page       PageSql, PageKey, Page, Cursor: a page's statement, keys and
//!            answers
//! rows       Single, List, Paged: how rows answer keys; UnmappedRow,
//!            BadRows: rows that do not map fail their own keys
//! write      WriteRequest, Written, RowError, Writer; a batch's plan and answers
//! import     ConflictPolicy, ImportCounts, ImportError; the SQL around COPY
//! statement  StatementMode
//! classify   Classify (a driver error's kind), again_if_lost
//! sqlstate   DbErrorKind: one table of SQLSTATEs to kinds
//! ```

mod classify;
mod import;
mod page;
mod rows;
mod scope;
mod sqlstate;
mod statement;
mod write;

pub(crate) use classify::{again_if_lost, classified, Classify};
pub(crate) use import::{
    copy_sql, merge_sql, temp_table_sql, NumberedRow, Progress, IMPORT_TABLE, ROW_NUMBER,
};
pub use import::{ConflictPolicy, ImportCounts, ImportError};
pub(crate) use page::gather_pages;
pub use page::{
    Cursor, Page, PageError, PageKey, PageSql, PageSqlBuilder, DEFAULT_MAX_FIRST, MAX_FIRST,
};
pub(crate) use rows::{gather_lists, BadRows};
pub use rows::{List, Paged, Single, UnmappedRow};
pub(crate) use scope::{judge_role, CheckedRoles, Prologue, CLEAN_START, ROLE_CHECK_SQL};
pub use scope::{Scope, ScopeBuilder, ScopeError};
pub use sqlstate::DbErrorKind;
pub use statement::StatementMode;
pub(crate) use write::{returned, settle_row, write_batch, Outcomes, Savepoint, Upsert};
pub use write::{RowError, WriteRequest, WriteResult, Writer, Written};
