//! The `repositories` table.

use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Row};

use crate::model::repositories::Repository;

/// The columns a [`Repository`] is read from.
const COLUMNS: &str =
    "name, storage_namespace, extract(epoch FROM created_at)::bigint, default_branch, read_only";

/// A [`Repository`] from a row of [`COLUMNS`].
fn from_row(row: &Row) -> Result<Repository, tokio_postgres::Error> {
    Ok(Repository {
        name: row.try_get(0)?,
        storage_namespace: row.try_get(1)?,
        created_at: row.try_get(2)?,
        default_branch: row.try_get(3)?,
        read_only: row.try_get(4)?,
    })
}

/// Creates repository `name`; `None` if the name is taken.
///
/// # Errors
///
/// When the statement fails (an invalid name, for one).
pub async fn insert<C: GenericClient>(
    client: &C,
    name: &str,
    storage_namespace: &str,
) -> Result<Option<Repository>, tokio_postgres::Error> {
    insert_with(client, name, storage_namespace, "main", false).await
}

/// Creates repository `name` with its one branch `default_branch`, marked
/// `read_only` or not; `None` if the name is taken.
///
/// # Errors
///
/// When the statement fails (an invalid name or branch, for one).
pub async fn insert_with<C: GenericClient>(
    client: &C,
    name: &str,
    storage_namespace: &str,
    default_branch: &str,
    read_only: bool,
) -> Result<Option<Repository>, tokio_postgres::Error> {
    let sql = format!(
        "INSERT INTO repositories (name, storage_namespace, default_branch, read_only) \
         VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO NOTHING RETURNING {COLUMNS}"
    );
    client
        .query_typed_opt(
            &sql,
            &[
                (&name, Type::TEXT),
                (&storage_namespace, Type::TEXT),
                (&default_branch, Type::TEXT),
                (&read_only, Type::BOOL),
            ],
        )
        .await?
        .as_ref()
        .map(from_row)
        .transpose()
}

/// Repository `name`, if it exists.
///
/// # Errors
///
/// When the statement fails.
pub async fn get<C: GenericClient>(
    client: &C,
    name: &str,
) -> Result<Option<Repository>, tokio_postgres::Error> {
    let sql = format!("SELECT {COLUMNS} FROM repositories WHERE name = $1");
    client
        .query_typed_opt(&sql, &[(&name, Type::TEXT)])
        .await?
        .as_ref()
        .map(from_row)
        .transpose()
}

/// Whether repository `name` exists.
///
/// # Errors
///
/// When the statement fails.
pub async fn exists<C: GenericClient>(
    client: &C,
    name: &str,
) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_typed_opt(
            "SELECT 1 FROM repositories WHERE name = $1",
            &[(&name, Type::TEXT)],
        )
        .await?
        .is_some())
}

/// All repositories, by name.
///
/// # Errors
///
/// When the statement fails.
pub async fn list<C: GenericClient>(client: &C) -> Result<Vec<Repository>, tokio_postgres::Error> {
    let sql = format!("SELECT {COLUMNS} FROM repositories ORDER BY name COLLATE \"C\"");
    client
        .query_typed(&sql, &[])
        .await?
        .iter()
        .map(from_row)
        .collect()
}

/// Deletes repository `name` and (by cascade) its objects; `false` if there
/// was none.
///
/// # Errors
///
/// When the statement fails.
pub async fn delete<C: GenericClient>(
    client: &C,
    name: &str,
) -> Result<bool, tokio_postgres::Error> {
    let n = client
        .execute_typed(
            "DELETE FROM repositories WHERE name = $1",
            &[(&name, Type::TEXT)],
        )
        .await?;
    Ok(n > 0)
}
