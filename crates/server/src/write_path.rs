//! How writes reach Postgres: single-object upserts through the
//! micro-batched [`Writer`], deletes, NDJSON imports through COPY, and
//! repository management. Every acknowledged write invalidates the cache
//! entries it touched, so a read after it sees the written value.

use std::time::Duration;

use axum::body::Body;
use batcher::pg::copy::{self, ConflictPolicy, ImportCounts, ImportError, RowSource, RowValues};
use batcher::pg::{PgError, Pool, RowError, Writer, Written};
use http_body_util::BodyExt;
use serde::Serialize;

use crate::config::ServeArgs;
use crate::input::ObjectBody;
use crate::queries::{ObjectKey, ObjectRow, ObjectUpsert, OBJECT_TABLE};
use crate::read_path::{ReadError, Reader};

/// Why a write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The repository does not exist.
    #[error("repository `{0}` does not exist")]
    NoSuchRepository(String),
    /// The repository already exists (create).
    #[error("repository `{0}` already exists")]
    RepositoryExists(String),
    /// The database refused the data; the message is the server's.
    #[error("{0}")]
    Refused(String),
    /// With `policy=fail`: a key already exists; the message names it.
    #[error("{0}")]
    Conflict(String),
    /// An import line is malformed; nothing of the import was committed.
    #[error("line {line}: {message}")]
    BadLine {
        /// The line's number, from 1.
        line: u64,
        /// What is wrong with it.
        message: String,
    },
    /// The import body is larger than allowed.
    #[error("the body is larger than {0} bytes")]
    TooLarge(usize),
    /// Too many writes queued: shed load.
    #[error("server overloaded")]
    Overloaded,
    /// The write's deadline passed; it may still be committed.
    #[error("write timed out")]
    Timeout,
    /// The database failed.
    #[error("database unavailable")]
    Database(#[source] anyhow::Error),
}

impl From<ReadError> for WriteError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Overloaded => WriteError::Overloaded,
            ReadError::Timeout => WriteError::Timeout,
            ReadError::Database(cause) => WriteError::Database(cause),
        }
    }
}

impl From<PgError> for WriteError {
    fn from(e: PgError) -> Self {
        ReadError::from(e).into()
    }
}

impl From<tokio_postgres::Error> for WriteError {
    fn from(e: tokio_postgres::Error) -> Self {
        WriteError::Database(e.into())
    }
}

impl From<deadpool_postgres::PoolError> for WriteError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        PgError::Pool(e).into()
    }
}

/// A repository, as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Repository {
    /// Its name.
    pub name: String,
    /// Where its objects' data lives.
    pub storage_namespace: String,
    /// Creation time, seconds since the Unix epoch.
    pub created_at: i64,
}

/// Writes objects and repositories.
#[derive(Debug, Clone)]
pub struct Writes {
    writer: Writer<ObjectUpsert>,
    pool: Pool,
    reader: Reader,
    max_import_bytes: usize,
}

impl Writes {
    /// The write path over `pool`, invalidating `reader`'s caches.
    ///
    /// # Errors
    ///
    /// When the writer's batching settings are invalid.
    pub fn new(pool: Pool, reader: Reader, args: &ServeArgs) -> anyhow::Result<Self> {
        let builder = Writer::<ObjectUpsert>::builder()
            .name("object_write")
            .max_batch_size(args.write_batch_size)
            .max_concurrent_batches(args.write_concurrency)
            .channel_capacity(args.queue_capacity)
            .timeout(Duration::from_millis(args.write_timeout_ms));
        Ok(Self {
            writer: Writer::new(pool.clone(), ObjectUpsert, builder)?,
            pool,
            reader,
            max_import_bytes: args.max_import_bytes,
        })
    }

    /// The writer's batcher statistics, for `/metrics`.
    pub fn batcher_stats(&self) -> batcher::StatsSnapshot {
        self.writer.stats()
    }

    /// Creates or replaces an object; returns once committed.
    ///
    /// # Errors
    ///
    /// [`WriteError`]; `NoSuchRepository` when the repository is missing.
    pub async fn put(&self, row: ObjectRow) -> Result<Written, WriteError> {
        let key = row.key();
        let written = self.writer.write(row).await.map_err(|e| {
            let Some(refused) = e.load_error::<RowError>() else {
                // Not this row's fault: classified like a read failure
                // (overload, pool or statement timeout, database).
                return ReadError::from(e).into();
            };
            match refused.as_db_error() {
                // The only foreign key of `objects` is its repository.
                Some(db) if db.code().code() == "23503" => {
                    WriteError::NoSuchRepository(key.repository.clone())
                }
                Some(db) => WriteError::Refused(db.message().to_owned()),
                None => WriteError::Refused(refused.to_string()),
            }
        })?;
        self.reader.invalidate(&key).await;
        Ok(written)
    }

    /// Deletes an object; `false` if there was none.
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn delete(&self, key: &ObjectKey) -> Result<bool, WriteError> {
        let client = self.pool.get().await?;
        let n = client
            .execute(
                "DELETE FROM objects WHERE repository = $1 AND path = $2",
                &[&key.repository, &key.path],
            )
            .await?;
        self.reader.invalidate(key).await;
        Ok(n > 0)
    }

    /// Imports NDJSON object lines from `body` into `repository`, all or
    /// nothing.
    ///
    /// # Errors
    ///
    /// `BadLine` naming the first malformed line, `Conflict` with
    /// `ConflictPolicy::Fail`, `TooLarge`, or a database failure; nothing
    /// was committed then.
    pub async fn import(
        &self,
        repository: &str,
        body: Body,
        policy: ConflictPolicy,
    ) -> Result<ImportCounts, WriteError> {
        let mut client = self.pool.get().await?;
        if client
            .query_opt("SELECT 1 FROM repositories WHERE name = $1", &[&repository])
            .await?
            .is_none()
        {
            return Err(WriteError::NoSuchRepository(repository.to_owned()));
        }
        let source = NdjsonObjects {
            body,
            buf: Vec::new(),
            line: 0,
            read: 0,
            limit: self.max_import_bytes,
            done: false,
            repository: repository.to_owned(),
        };
        let result = copy::import(&mut client, &OBJECT_TABLE, source, policy).await;
        let counts = result.map_err(|e| match e {
            ImportError::Source { error, .. } => error.into(),
            ImportError::Conflict(ref db) | ImportError::Rejected(ref db) => {
                let message = db.as_db_error().map_or_else(
                    || db.to_string(),
                    |d| {
                        format!(
                            "{}{}",
                            d.message(),
                            d.detail().map(|x| format!(": {x}")).unwrap_or_default()
                        )
                    },
                );
                if matches!(e, ImportError::Conflict(_)) {
                    WriteError::Conflict(message)
                } else {
                    WriteError::Refused(message)
                }
            }
            other => WriteError::Database(other.into()),
        })?;
        // An import may touch any number of keys: drop the whole cache
        // rather than remember them all.
        self.reader.invalidate_all();
        Ok(counts)
    }

    /// Creates a repository.
    ///
    /// # Errors
    ///
    /// `RepositoryExists`, or a database failure.
    pub async fn create_repository(
        &self,
        name: &str,
        namespace: &str,
    ) -> Result<Repository, WriteError> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                "INSERT INTO repositories (name, storage_namespace) VALUES ($1, $2) \
                 ON CONFLICT (name) DO NOTHING \
                 RETURNING name, storage_namespace, extract(epoch FROM created_at)::bigint",
                &[&name, &namespace],
            )
            .await?
            .ok_or_else(|| WriteError::RepositoryExists(name.to_owned()))?;
        // Lookups of this name may have cached "no such repository".
        self.reader.invalidate_all();
        Ok(Repository {
            name: row.get(0),
            storage_namespace: row.get(1),
            created_at: row.get(2),
        })
    }

    /// All repositories, by name.
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn list_repositories(&self) -> Result<Vec<Repository>, WriteError> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT name, storage_namespace, extract(epoch FROM created_at)::bigint \
                 FROM repositories ORDER BY name",
                &[],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| Repository {
                name: r.get(0),
                storage_namespace: r.get(1),
                created_at: r.get(2),
            })
            .collect())
    }

    /// Deletes a repository and its objects; `false` if there was none.
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn delete_repository(&self, name: &str) -> Result<bool, WriteError> {
        let client = self.pool.get().await?;
        let n = client
            .execute("DELETE FROM repositories WHERE name = $1", &[&name])
            .await?;
        self.reader.invalidate_all();
        Ok(n > 0)
    }

    /// Stops the writer after committing what it holds.
    pub async fn shutdown(&self) {
        self.writer.shutdown().await;
    }
}

/// The longest import line accepted, in bytes.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// What is wrong with an import body.
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    /// Line `line` is not a valid object.
    #[error("line {line}: {message}")]
    Bad {
        /// The line's number, from 1.
        line: u64,
        /// What is wrong.
        message: String,
    },
    /// The body exceeds the import limit.
    #[error("the body is larger than {0} bytes")]
    TooLarge(usize),
}

impl From<LineError> for WriteError {
    fn from(e: LineError) -> Self {
        match e {
            LineError::Bad { line, message } => WriteError::BadLine { line, message },
            LineError::TooLarge(n) => WriteError::TooLarge(n),
        }
    }
}

/// Object rows parsed from an NDJSON request body as it arrives: memory
/// holds at most one line (and one network chunk), however large the body.
struct NdjsonObjects {
    body: Body,
    buf: Vec<u8>,
    /// Lines consumed so far.
    line: u64,
    /// Body bytes read so far.
    read: usize,
    limit: usize,
    done: bool,
    repository: String,
}

impl NdjsonObjects {
    fn parse(&self, bytes: &[u8]) -> Result<ObjectRow, LineError> {
        let bad = |message: String| LineError::Bad {
            line: self.line,
            message,
        };
        let body: ObjectBody = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        let path = body
            .path
            .clone()
            .ok_or_else(|| bad("`path` is required".to_owned()))?;
        crate::input::object_path(&path, "path").map_err(|e| bad(e.message().to_owned()))?;
        body.into_row(&self.repository, path).map_err(bad)
    }
}

impl RowSource for NdjsonObjects {
    type Error = LineError;

    async fn next_row(&mut self) -> Result<Option<RowValues>, LineError> {
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                self.line += 1;
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue; // blank lines are allowed
                }
                return self.parse(&line).map(|row| Some(row.into_values()));
            }
            if self.done {
                if self.buf.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None);
                }
                // A last line without a trailing newline.
                self.buf.push(b'\n');
                continue;
            }
            if self.buf.len() > MAX_LINE_BYTES {
                return Err(LineError::Bad {
                    line: self.line + 1,
                    message: format!("longer than {MAX_LINE_BYTES} bytes"),
                });
            }
            match self.body.frame().await {
                None => self.done = true,
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.read += data.len();
                        if self.read > self.limit {
                            return Err(LineError::TooLarge(self.limit));
                        }
                        self.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => {
                    return Err(LineError::Bad {
                        line: self.line + 1,
                        message: format!("the body could not be read: {e}"),
                    })
                }
            }
        }
    }
}
