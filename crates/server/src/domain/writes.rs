//! How writes reach Postgres: single-object upserts through the
//! micro-batched [`Writer`], deletes, NDJSON imports through COPY, and
//! repository management. Every acknowledged write invalidates the cache
//! entries it touched, through the read registry, so a read after it sees
//! the written value.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use pgbatch::pg::copy::{self, ConflictPolicy, ImportCounts};
use pgbatch::pg::{DbErrorKind, PgError, PgWriter, Pool, RowError, Statements, Writer, Written};
use pgbatch::{loader_fn, Batcher, BuildError};
use tokio_postgres::types::PgLsn;

use crate::db::queries::objects::{self, ObjectRow, ObjectUpsert, OBJECT_TABLE};
use crate::db::queries::repositories;
use crate::db::queries::system;
use crate::domain::failure::{Failure, Work};
use crate::domain::import::NdjsonObjects;
use crate::domain::invalidation::Change;
use crate::domain::reads::Reads;
use crate::model::objects::ObjectKey;
use crate::model::repositories::Repository;
use crate::settings::{ImportSettings, Pooler, WriteSettings};
use tokio::sync::Semaphore;

/// Longest wait for a write's commit position; past it the answer goes
/// without one.
const POSITION_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

/// A write's database or pool error, classified.
fn failed(e: impl Into<PgError>) -> Failure {
    Failure::from_pg(e.into(), Work::Write)
}

/// `$work`, an expression awaiting one query on the client `$c`, on a
/// connection of `$writes`' pool, its errors classified. Behind a pooler,
/// whose connections carry no statement timeout, in a transaction that
/// sets the write deadline as one, so the server gives up with us.
/// (A macro, not a function: `$work` runs on a client or on a transaction,
/// two types, and borrows either.)
macro_rules! on_write_connection {
    ($writes:expr, |$c:ident| $work:expr) => {{
        let mut client = crate::db::lease(&$writes.pool).await.map_err(failed)?;
        let done: Result<_, tokio_postgres::Error> = if $writes.statements.timeout().is_none() {
            let $c = &**client;
            $work
        } else {
            async {
                let tx = client.transaction().await?;
                $writes.statements.begin(&tx).await?;
                let out = {
                    let $c = &*tx;
                    $work?
                };
                tx.commit().await?;
                Ok(out)
            }
            .await
        };
        client.settle(&done);
        done.map_err(failed)?
    }};
}

/// Writes objects and repositories. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Writes {
    writer: Writer<ObjectRow>,
    pool: Pool,
    /// Imports' own connections: an upload holds one for as long as the
    /// client takes to send its body, so they never come from `pool`.
    import_pool: Pool,
    /// One permit per import running; more are refused, not queued.
    imports: Arc<Semaphore>,
    import: ImportSettings,
    /// How imports set their statement timeout (per transaction behind a
    /// pooler).
    import_statements: Statements,
    /// How writes send statements and set the write deadline as their
    /// statement timeout (per transaction behind a pooler).
    statements: Statements,
    reads: Reads,
    /// The primary's WAL position after a write, for its response: one
    /// statement for all the writes that ask at once.
    positions: Batcher<(), PgLsn>,
}

impl Writes {
    /// The write path over `pool`, with imports on `import_pool`,
    /// invalidating `reads`' caches, sending statements as `pooler`
    /// requires; starts the object writer on the current runtime.
    ///
    /// # Errors
    ///
    /// When the writer's batching settings are invalid.
    pub fn new(
        pool: Pool,
        import_pool: Pool,
        reads: Reads,
        settings: &WriteSettings,
        import: &ImportSettings,
        pooler: Pooler,
    ) -> Result<Self, BuildError> {
        let builder = settings.batch.builder("object_write", settings.timeout);
        let statements = pooler.statements(settings.timeout);
        let position_pool = pool.clone();
        // Never joins a statement already running: one that started before
        // a write committed could return a position before its commit.
        let positions = Batcher::builder()
            .name("commit_position")
            // Bounded well inside the write deadline: the write is
            // committed already, and a slow position read must not turn it
            // into a 504.
            .timeout(POSITION_TIMEOUT)
            .build(loader_fn(move |_: Vec<()>| {
                let pool = position_pool.clone();
                async move {
                    let client = crate::db::lease(&pool).await.map_err(PgError::from)?;
                    let lsn = system::wal_position(&**client).await;
                    client.settle(&lsn);
                    let lsn = lsn.map_err(PgError::from)?;
                    Ok::<_, PgError>(HashMap::from([((), lsn)]))
                }
            }))?;
        Ok(Self {
            positions,
            writer: Writer::new(
                PgWriter::with_statements(pool.clone(), ObjectUpsert, statements),
                builder,
            )?,
            pool,
            import_pool,
            import_statements: pooler.statements(import.timeout),
            statements,
            imports: Arc::new(Semaphore::new(import.concurrency)),
            import: *import,
            reads,
        })
    }

    /// The primary's WAL position now: at or past the commit of every
    /// write already acknowledged, so a replica that has replayed it shows
    /// them (read-your-writes, see [`crate::http::position`]).
    ///
    /// # Errors
    ///
    /// As the database fails, or past the write deadline.
    pub async fn commit_position(&self) -> Result<PgLsn, Failure> {
        self.positions
            .load(())
            .await
            .map_err(|e| Failure::from_batcher(e, Work::Write))?
            .ok_or_else(|| Failure::unavailable(anyhow::anyhow!("no WAL position returned")))
    }

    /// The writer's batcher statistics, for `/metrics`.
    pub fn batcher_stats(&self) -> pgbatch::StatsSnapshot {
        self.writer.stats()
    }

    /// Creates or replaces an object; returns once committed.
    ///
    /// # Errors
    ///
    /// [`Failure::NoSuchRepository`] when the repository is missing,
    /// [`Failure::Rejected`] when the database refuses the row, or as the
    /// batch fails.
    pub async fn put(&self, row: ObjectRow) -> Result<Written, Failure> {
        let key = row.key();
        let written = self.writer.write(row).await.map_err(|e| {
            match e.load_error::<RowError>().map(RowError::kind) {
                // The only foreign key of `objects` is its repository.
                Some(DbErrorKind::ForeignKeyViolation) => {
                    Failure::NoSuchRepository(key.repository.clone())
                }
                _ => Failure::from_batcher(e, Work::Write),
            }
        })?;
        self.reads.changed(Change::Object(&key)).await;
        Ok(written)
    }

    /// Deletes the objects at `paths` of `repository`, those that exist,
    /// in one statement: all of them or, when it fails, none. Returns how
    /// many there were.
    ///
    /// # Errors
    ///
    /// As the database fails (a read-only repository's refusal included).
    pub async fn delete_many(&self, repository: &str, paths: &[&str]) -> Result<u64, Failure> {
        if paths.is_empty() {
            return Ok(0);
        }
        let deleted =
            on_write_connection!(self, |c| objects::delete_many(c, repository, paths).await);
        for path in paths {
            let key = ObjectKey {
                repository: repository.to_owned(),
                path: (*path).to_owned(),
            };
            self.reads.changed(Change::Object(&key)).await;
        }
        Ok(deleted)
    }

    /// Deletes an object.
    ///
    /// # Errors
    ///
    /// [`Failure::NoSuchObject`] if there was none, or as the database
    /// fails.
    pub async fn delete(&self, key: &ObjectKey) -> Result<(), Failure> {
        match self.delete_many(&key.repository, &[&key.path]).await? {
            0 => Err(Failure::NoSuchObject {
                repository: key.repository.clone(),
                path: key.path.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Imports NDJSON object lines from `body` into `repository`, all or
    /// nothing.
    ///
    /// # Errors
    ///
    /// [`Failure::BadImportLine`] naming the first malformed line,
    /// [`Failure::Conflict`] with [`ConflictPolicy::Fail`],
    /// [`Failure::TooLarge`], [`Failure::NoSuchRepository`],
    /// [`Failure::BodyStalled`] when the body pauses too long,
    /// [`Failure::Overloaded`] when the most imports already run, or as the
    /// database fails; nothing was committed then.
    pub async fn import(
        &self,
        repository: &str,
        body: Body,
        policy: ConflictPolicy,
    ) -> Result<ImportCounts, Failure> {
        // Refused before the body is read or a connection taken: queueing
        // uploads would only hold their clients' bodies in flight longer.
        let _running = self
            .imports
            .try_acquire()
            .map_err(|_| Failure::Overloaded)?;
        let mut client = pgbatch::pg::Lease::get_for(
            &self.import_pool,
            self.import.timeout + crate::db::LEASE_MARGIN,
        )
        .await
        .map_err(failed)?;
        let exists = repositories::exists(&**client, repository).await;
        if !exists.map_err(failed)? {
            client.release();
            return Err(Failure::NoSuchRepository(repository.to_owned()));
        }
        let source = NdjsonObjects::new(body, repository, &self.import);
        // A failed import may have left its connection mid-COPY: it goes
        // (the lease is dropped unreleased), only a finished one returns.
        let counts = copy::import_with(
            &mut client,
            &OBJECT_TABLE,
            source,
            policy,
            self.import_statements,
        )
        .await?;
        client.release();
        // An import may touch any number of keys: drop the whole cache
        // rather than remember them all.
        self.reads.changed(Change::Objects).await;
        Ok(counts)
    }

    /// Creates a repository.
    ///
    /// # Errors
    ///
    /// [`Failure::RepositoryExists`], or as the database fails.
    pub async fn create_repository(
        &self,
        name: &str,
        storage_namespace: &str,
    ) -> Result<Repository, Failure> {
        self.create_repository_as(name, storage_namespace, "main", false)
            .await
    }

    /// Creates a repository with its one branch named `default_branch`,
    /// read-only or not.
    ///
    /// # Errors
    ///
    /// [`Failure::RepositoryExists`], or as the database fails.
    pub async fn create_repository_as(
        &self,
        name: &str,
        storage_namespace: &str,
        default_branch: &str,
        read_only: bool,
    ) -> Result<Repository, Failure> {
        let created = on_write_connection!(self, |c| repositories::insert_with(
            c,
            name,
            storage_namespace,
            default_branch,
            read_only,
        )
        .await)
        .ok_or_else(|| Failure::RepositoryExists(name.to_owned()))?;
        // Lookups of this name may have cached "no such repository".
        self.reads.changed(Change::Objects).await;
        Ok(created)
    }

    /// Deletes a repository and its objects.
    ///
    /// # Errors
    ///
    /// [`Failure::NoSuchRepository`] if there was none, or as the database
    /// fails.
    pub async fn delete_repository(&self, name: &str) -> Result<(), Failure> {
        let deleted = on_write_connection!(self, |c| repositories::delete(c, name).await);
        self.reads.changed(Change::Objects).await;
        if deleted {
            Ok(())
        } else {
            Err(Failure::NoSuchRepository(name.to_owned()))
        }
    }

    /// Stops the writer after committing what it holds.
    pub async fn shutdown(&self) {
        tokio::join!(self.writer.shutdown(), self.positions.shutdown());
    }
}
