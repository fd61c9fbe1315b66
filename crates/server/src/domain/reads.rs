//! The registry of reads: one [`Lookup`] per query kind, built once from
//! [`ReadSettings`], and the reads that need no lookup (listing
//! repositories).
//!
//! A new read endpoint adds its query to [`crate::db::queries`], a field here
//! (with its entry in [`Reads::stats`] and [`Reads::shutdown`]), and a
//! route.

use pgbatch::cache::CacheStats;
use pgbatch::pg::PgError;
use pgbatch::{BuildError, StatsSnapshot};
use tokio_postgres::types::PgLsn;

use crate::cluster::coherence::Coherence;
use crate::cluster::replicas::{Needs, ReadRouter};
use crate::db::queries::kv::KvQuery;
use crate::db::queries::objects::{self, ObjectStatQuery};
use crate::db::queries::repositories::{self, Repository};
use crate::domain::failure::Failure;
use crate::domain::listing::{self, ListRequest, Listing};
use crate::domain::lookup::Lookup;
use crate::settings::ReadSettings;

/// Every read the service does. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Reads {
    /// `random_read_test` payloads by key.
    pub kv: Lookup<KvQuery>,
    /// Object stats by repository and path.
    pub object_stat: Lookup<ObjectStatQuery>,
    router: ReadRouter,
}

/// One lookup's name and statistics, for `/metrics`.
#[derive(Debug, Clone)]
pub struct LookupStats {
    /// The lookup's name (`kv`, `object_stat`).
    pub name: &'static str,
    /// Its batcher's, on the batched and cached paths.
    pub batcher: Option<StatsSnapshot>,
    /// Its cache's, on the cached path.
    pub cache: Option<CacheStats>,
}

impl Reads {
    /// The reads, on the databases `router` chooses; on the batched and
    /// cached paths, starts one batcher per lookup on the current runtime.
    /// The caches are used only while `coherence` allows.
    ///
    /// # Errors
    ///
    /// When a batcher or cache setting is invalid.
    pub fn new(
        router: impl Into<ReadRouter>,
        settings: &ReadSettings,
        coherence: &Coherence,
    ) -> Result<Self, BuildError> {
        let router = router.into();
        Ok(Self {
            kv: Lookup::new("kv", KvQuery, router.clone(), settings)?
                .with_coherence(coherence.clone()),
            object_stat: Lookup::new("object_stat", ObjectStatQuery, router.clone(), settings)?
                .with_coherence(coherence.clone()),
            router,
        })
    }

    /// Every lookup's statistics.
    pub fn stats(&self) -> [LookupStats; 2] {
        fn of<Q: pgbatch::pg::BatchQuery>(lookup: &Lookup<Q>) -> LookupStats {
            LookupStats {
                name: lookup.name(),
                batcher: lookup.batcher_stats(),
                cache: lookup.cache_stats(),
            }
        }
        [of(&self.kv), of(&self.object_stat)]
    }

    /// The batchers' statistics, by lookup name.
    pub fn batcher_stats(&self) -> Vec<(&'static str, StatsSnapshot)> {
        self.stats()
            .into_iter()
            .filter_map(|s| Some((s.name, s.batcher?)))
            .collect()
    }

    /// The caches' statistics, by lookup name.
    pub fn cache_stats(&self) -> Vec<(&'static str, CacheStats)> {
        self.stats()
            .into_iter()
            .filter_map(|s| Some((s.name, s.cache?)))
            .collect()
    }

    /// Applies every cache's pending bookkeeping, before reading counts.
    pub async fn sync_caches(&self) {
        tokio::join!(self.kv.sync_cache(), self.object_stat.sync_cache());
    }

    /// Stops the batchers after answering what they hold.
    pub async fn shutdown(&self) {
        tokio::join!(self.kv.shutdown(), self.object_stat.shutdown());
    }

    /// All repositories, by name; with a `position`, from a database that
    /// has replayed it.
    ///
    /// # Errors
    ///
    /// [`Failure::Overloaded`] when no connection is free in time, else as
    /// the database fails.
    pub async fn list_repositories(
        &self,
        position: Option<PgLsn>,
    ) -> Result<Vec<Repository>, Failure> {
        let pools = self.router.pools();
        let needs = position.map_or(Needs::Any, Needs::Position);
        let listed = self
            .router
            .read(needs, |i| async move {
                let client = pools[i].get().await?;
                Ok::<_, PgError>(repositories::list(&**client).await?)
            })
            .await?;
        Ok(listed)
    }

    /// Repository `name`, if it exists; with a `position`, from a
    /// database that has replayed it.
    ///
    /// # Errors
    ///
    /// As [`list_repositories`](Self::list_repositories).
    pub async fn repository(
        &self,
        name: &str,
        position: Option<PgLsn>,
    ) -> Result<Option<Repository>, Failure> {
        let pools = self.router.pools();
        let needs = position.map_or(Needs::Any, Needs::Position);
        Ok(self
            .router
            .read(needs, |i| async move {
                let client = pools[i].get().await?;
                Ok::<_, PgError>(repositories::get(&**client, name).await?)
            })
            .await?)
    }

    /// Repository `name`, if it exists, as the primary has it: for the
    /// checks before a write, which must see what the write will meet (a
    /// lakeFS client sends no position, and a lagging replica may not have
    /// the repository it has just created).
    ///
    /// # Errors
    ///
    /// As [`list_repositories`](Self::list_repositories).
    pub async fn repository_on_primary(&self, name: &str) -> Result<Option<Repository>, Failure> {
        let primary = self.router.primary();
        let repo = async {
            let client = primary.get().await?;
            Ok::<_, PgError>(repositories::get(&**client, name).await?)
        }
        .await?;
        Ok(repo)
    }

    /// A page of `repository`'s objects as `request` asks (see
    /// [`crate::domain::listing`]): range scans of its primary key on one
    /// connection, from a database that has replayed `position` if given.
    ///
    /// # Errors
    ///
    /// As [`list_repositories`](Self::list_repositories).
    pub async fn list_objects(
        &self,
        repository: &str,
        request: &ListRequest,
        position: Option<PgLsn>,
    ) -> Result<Listing, Failure> {
        let pools = self.router.pools();
        let needs = position.map_or(Needs::Any, Needs::Position);
        // Behind a pooler the connections carry no statement timeout: the
        // page's scans run in one transaction that sets it.
        let statements = self.router.statements();
        Ok(self
            .router
            .read(needs, |i| async move {
                let mut client = pools[i].get().await?;
                if statements.timeout().is_none() {
                    return Ok(list_on(&**client, repository, request).await?);
                }
                let tx = client.transaction().await?;
                statements.begin(&tx).await?;
                let page = list_on(&*tx, repository, request).await?;
                tx.commit().await?;
                Ok::<_, PgError>(page)
            })
            .await?)
    }

    /// Where reads go.
    pub fn router(&self) -> &ReadRouter {
        &self.router
    }
}

/// A page of `repository`'s objects as `request` asks, by range scans on
/// `client`.
async fn list_on<C: tokio_postgres::GenericClient + Sync>(
    client: &C,
    repository: &str,
    request: &ListRequest,
) -> Result<Listing, tokio_postgres::Error> {
    listing::list(request, |from, below, limit| async move {
        objects::list(client, repository, &from, below.as_deref(), limit).await
    })
    .await
}
