//! The `objects` table: stats by (repository, path) as a [`BatchQuery`],
//! the upsert the writer batches, the columns COPY fills, and delete.

use std::sync::Arc;

use pgbatch::pg::{BatchQuery, Params};
use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Row};

use crate::model::objects::{ObjectKey, ObjectStats, Stat};

/// Object metadata by (repository, path).
///
/// One statement answers both "no such repository" and "no such object":
/// the join on `repositories` drops keys of unknown repositories, and the
/// left join on `objects` leaves nulls for missing objects.
#[derive(Debug, Clone, Copy, Default)]
pub struct ObjectStatQuery;

const STAT_COLUMNS: &str = "r.default_branch, o.physical_address, o.checksum, o.size_bytes, \
     extract(epoch FROM o.mtime)::bigint, o.content_type, o.user_metadata";

impl BatchQuery for ObjectStatQuery {
    type Key = ObjectKey;
    type Value = Stat;

    fn batch_sql(&self) -> &str {
        static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            format!(
                "SELECT k.repository, k.path, {STAT_COLUMNS} \
                 FROM unnest($1::text[], $2::text[]) AS k(repository, path) \
                 JOIN repositories r ON r.name = k.repository \
                 LEFT JOIN objects o ON o.repository = k.repository AND o.path = k.path"
            )
        });
        &SQL
    }

    fn batch_params<'a>(&self, keys: &'a [ObjectKey]) -> Params<'a> {
        let repositories: Vec<&str> = keys.iter().map(|k| k.repository.as_str()).collect();
        let paths: Vec<&str> = keys.iter().map(|k| k.path.as_str()).collect();
        vec![Box::new(repositories), Box::new(paths)]
    }

    fn single_sql(&self) -> &str {
        static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            format!(
                "SELECT r.name, $2::text, {STAT_COLUMNS} \
                 FROM repositories r \
                 LEFT JOIN objects o ON o.repository = r.name AND o.path = $2 \
                 WHERE r.name = $1"
            )
        });
        &SQL
    }

    fn single_params<'a>(&self, key: &'a ObjectKey) -> Params<'a> {
        vec![
            Box::new(key.repository.as_str()),
            Box::new(key.path.as_str()),
        ]
    }

    fn map_row(&self, row: &Row) -> Result<(ObjectKey, Stat), tokio_postgres::Error> {
        let key = ObjectKey {
            repository: row.try_get(0)?,
            path: row.try_get(1)?,
        };
        let branch: String = row.try_get(2)?;
        let physical_address: Option<String> = row.try_get(3)?;
        let object = match physical_address {
            None => None,
            Some(physical_address) => Some(Arc::new(ObjectStats {
                path: key.path.clone(),
                physical_address,
                checksum: row.try_get(4)?,
                size_bytes: row.try_get(5)?,
                mtime: row.try_get(6)?,
                content_type: row.try_get(7)?,
                metadata: row.try_get(8)?,
            })),
        };
        let stat = Stat {
            branch: branch.into(),
            object,
        };
        Ok((key, stat))
    }

    /// A repository's row without an object: counted as not found.
    fn is_absent(&self, stat: &Stat) -> bool {
        stat.object.is_none()
    }
}

/// An object as written: by `PUT`, by an import line, or by the seeder.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectRow {
    /// The repository name.
    pub repository: String,
    /// The object's path.
    pub path: String,
    /// Where the data is stored.
    pub physical_address: String,
    /// Size of the data in bytes.
    pub size_bytes: i64,
    /// The data's checksum.
    pub checksum: String,
    /// MIME type of the data.
    pub content_type: String,
    /// User-defined metadata (a JSON object).
    pub metadata: serde_json::Value,
    /// When the object was last modified, in Unix seconds; `None` for the
    /// time of the write (a COPY import always takes that).
    pub mtime: Option<i64>,
}

impl ObjectRow {
    /// The row's key.
    pub fn key(&self) -> ObjectKey {
        ObjectKey {
            repository: self.repository.clone(),
            path: self.path.clone(),
        }
    }

    /// The row's values in [`OBJECT_COLUMNS`] order, for COPY.
    pub fn into_values(self) -> pgbatch::pg::copy::RowValues {
        vec![
            Box::new(self.repository),
            Box::new(self.path),
            Box::new(self.physical_address),
            Box::new(self.size_bytes),
            Box::new(self.checksum),
            Box::new(self.content_type),
            Box::new(self.metadata),
        ]
    }
}

/// The columns an [`ObjectRow`] fills, for COPY; `mtime` takes its default.
pub const OBJECT_COLUMNS: [(&str, Type); 7] = [
    ("repository", Type::TEXT),
    ("path", Type::TEXT),
    ("physical_address", Type::TEXT),
    ("size_bytes", Type::INT8),
    ("checksum", Type::TEXT),
    ("content_type", Type::TEXT),
    ("user_metadata", Type::JSONB),
];

/// The `objects` table for [`pgbatch::pg::copy::import`].
pub const OBJECT_TABLE: pgbatch::pg::copy::TableSpec<'static> = pgbatch::pg::copy::TableSpec {
    table: "objects",
    columns: &OBJECT_COLUMNS,
    key: &["repository", "path"],
};

/// Upserts objects; the write path's [`pgbatch::pg::Writer`] runs it.
#[derive(Debug, Clone, Copy, Default)]
pub struct ObjectUpsert;

const UPSERT_SET: &str = "ON CONFLICT (repository, path) DO UPDATE SET \
     physical_address = EXCLUDED.physical_address, size_bytes = EXCLUDED.size_bytes, \
     checksum = EXCLUDED.checksum, content_type = EXCLUDED.content_type, \
     user_metadata = EXCLUDED.user_metadata, mtime = EXCLUDED.mtime \
     RETURNING repository, path, (xmax = 0)";

impl pgbatch::pg::UpsertQuery for ObjectUpsert {
    type Key = ObjectKey;
    type Row = ObjectRow;

    fn key(&self, row: &ObjectRow) -> ObjectKey {
        row.key()
    }

    fn batch_sql(&self) -> &str {
        static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            format!(
                "INSERT INTO objects (repository, path, physical_address, size_bytes, checksum, \
                 content_type, user_metadata, mtime) \
                 SELECT r, p, a, s, c, t, u, COALESCE(to_timestamp(m), now()) \
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::text[], \
                 $6::text[], $7::jsonb[], $8::int8[]) AS x(r, p, a, s, c, t, u, m) {UPSERT_SET}"
            )
        });
        &SQL
    }

    fn batch_params<'a>(&self, rows: &'a [ObjectRow]) -> Params<'a> {
        let text = |f: fn(&ObjectRow) -> &str| -> Vec<&'a str> { rows.iter().map(f).collect() };
        vec![
            Box::new(text(|r| &r.repository)),
            Box::new(text(|r| &r.path)),
            Box::new(text(|r| &r.physical_address)),
            Box::new(rows.iter().map(|r| r.size_bytes).collect::<Vec<i64>>()),
            Box::new(text(|r| &r.checksum)),
            Box::new(text(|r| &r.content_type)),
            Box::new(
                rows.iter()
                    .map(|r| &r.metadata)
                    .collect::<Vec<&serde_json::Value>>(),
            ),
            Box::new(rows.iter().map(|r| r.mtime).collect::<Vec<Option<i64>>>()),
        ]
    }

    fn single_sql(&self) -> &str {
        static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            format!(
                "INSERT INTO objects (repository, path, physical_address, size_bytes, checksum, \
                 content_type, user_metadata, mtime) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, COALESCE(to_timestamp($8::int8), now())) \
                 {UPSERT_SET}"
            )
        });
        &SQL
    }

    fn single_params<'a>(&self, r: &'a ObjectRow) -> Params<'a> {
        vec![
            Box::new(r.repository.as_str()),
            Box::new(r.path.as_str()),
            Box::new(r.physical_address.as_str()),
            Box::new(r.size_bytes),
            Box::new(r.checksum.as_str()),
            Box::new(r.content_type.as_str()),
            Box::new(&r.metadata),
            Box::new(r.mtime),
        ]
    }

    fn map_returned(&self, row: &Row) -> Result<(ObjectKey, bool), tokio_postgres::Error> {
        let key = ObjectKey {
            repository: row.try_get(0)?,
            path: row.try_get(1)?,
        };
        Ok((key, row.try_get(2)?))
    }

    /// Every column is set to the row's own value (`mtime` to the given
    /// one, or the time of the write), and the invalidation triggers only
    /// notify: a second write of a batch leaves what the first did.
    fn is_idempotent(&self) -> bool {
        true
    }
}

/// Objects of `repository` whose path is at least `from` and (with `below`)
/// less than `below`, in path order (bytes: the column is `COLLATE "C"`),
/// at most `limit`: one range scan of the primary key.
///
/// # Errors
///
/// When the statement fails.
pub async fn list<C: GenericClient>(
    client: &C,
    repository: &str,
    from: &str,
    below: Option<&str>,
    limit: i64,
) -> Result<Vec<ObjectStats>, tokio_postgres::Error> {
    const COLUMNS: &str = "path, physical_address, checksum, size_bytes, \
         extract(epoch FROM mtime)::bigint, content_type, user_metadata";
    let rows = match below {
        Some(below) => {
            client
                .query_typed(
                    &format!(
                        "SELECT {COLUMNS} FROM objects \
                         WHERE repository = $1 AND path >= $2 AND path < $3 \
                         ORDER BY path LIMIT $4"
                    ),
                    &[
                        (&repository, Type::TEXT),
                        (&from, Type::TEXT),
                        (&below, Type::TEXT),
                        (&limit, Type::INT8),
                    ],
                )
                .await?
        }
        None => {
            client
                .query_typed(
                    &format!(
                        "SELECT {COLUMNS} FROM objects \
                         WHERE repository = $1 AND path >= $2 \
                         ORDER BY path LIMIT $3"
                    ),
                    &[
                        (&repository, Type::TEXT),
                        (&from, Type::TEXT),
                        (&limit, Type::INT8),
                    ],
                )
                .await?
        }
    };
    rows.iter()
        .map(|row| {
            Ok(ObjectStats {
                path: row.try_get(0)?,
                physical_address: row.try_get(1)?,
                checksum: row.try_get(2)?,
                size_bytes: row.try_get(3)?,
                mtime: row.try_get(4)?,
                content_type: row.try_get(5)?,
                metadata: row.try_get(6)?,
            })
        })
        .collect()
}

/// Deletes the objects at `paths` in `repository` in one statement: one
/// round trip, one transaction, and one invalidation notice for them all.
/// Returns how many there were.
///
/// # Errors
///
/// When the statement fails (then none is deleted).
pub async fn delete_many<C: GenericClient>(
    client: &C,
    repository: &str,
    paths: &[&str],
) -> Result<u64, tokio_postgres::Error> {
    client
        .execute_typed(
            "DELETE FROM objects WHERE repository = $1 AND path = ANY($2)",
            &[(&repository, Type::TEXT), (&paths, Type::TEXT_ARRAY)],
        )
        .await
}
