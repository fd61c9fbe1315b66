//! The registry of reads: one [`Lookup`] per query kind, built once from
//! [`ReadSettings`], and the reads that need no lookup (listing
//! repositories).
//!
//! A new read endpoint adds its query to [`crate::db::queries`] with its
//! [`Invalidated`] impl in [`crate::domain::invalidation`] (the tables it
//! reads), a field and one
//! `Registry::add` line in [`Reads::new`], a route, and its annotation in
//! `http::openapi`. Statistics, cache syncing, shutdown and invalidation
//! reach every registered lookup by themselves; the tests check each
//! query's tables against its SQL, so a cached lookup that would miss an
//! invalidation fails them.

use std::fmt;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt as _;
use pgbatch::cache::CacheStats;
use pgbatch::pg::{PgError, Statements};
use pgbatch::{BuildError, StatsSnapshot};
use tokio_postgres::types::PgLsn;

use crate::cluster::coherence::Coherence;
use crate::cluster::replicas::{Needs, ReadRouter};
use crate::db::queries::auth::PrincipalQuery;
use crate::db::queries::kv::KvQuery;
use crate::db::queries::objects::{self, ObjectStatQuery};
use crate::db::queries::repositories;
use crate::domain::failure::Failure;
#[cfg(test)]
use crate::domain::invalidation::Table;
use crate::domain::invalidation::{Change, Invalidated};
use crate::domain::listing::{self, ListRequest, Listing};
use crate::domain::lookup::Lookup;
use crate::model::repositories::Repository;
use crate::settings::{AuthSettings, ReadSettings};

/// Every read the service does. Cheap to clone.
#[derive(Clone)]
pub struct Reads {
    /// `random_read_test` payloads by key.
    pub kv: Lookup<KvQuery>,
    /// Object stats by repository and path.
    pub object_stat: Lookup<ObjectStatQuery>,
    /// Who a token is, by its digest (the authenticator reads through it).
    pub principal: Lookup<PrincipalQuery>,
    router: ReadRouter,
    /// Every lookup above, for what is done to all of them.
    registered: Arc<[Box<dyn Registered>]>,
}

impl fmt::Debug for Reads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reads")
            .field("kv", &self.kv)
            .field("object_stat", &self.object_stat)
            .field("principal", &self.principal)
            .finish_non_exhaustive()
    }
}

/// One lookup's name and statistics, for `/metrics`.
#[derive(Debug, Clone)]
pub struct LookupStats {
    /// The lookup's name (`kv`, `object_stat`, `auth`).
    pub name: &'static str,
    /// Its batcher's, on the batched and cached paths.
    pub batcher: Option<StatsSnapshot>,
    /// Its cache's, on the cached path.
    pub cache: Option<CacheStats>,
}

/// A lookup as the registry sees it, whatever its query.
trait Registered: Send + Sync {
    fn stats(&self) -> LookupStats;
    fn changed<'a>(&'a self, change: Change<'a>) -> BoxFuture<'a, ()>;
    fn sync_cache(&self) -> BoxFuture<'_, ()>;
    fn shutdown(&self) -> BoxFuture<'_, ()>;
    /// The query's tables and its two statements, for the tests.
    #[cfg(test)]
    fn tables_and_sql(&self) -> (&'static [Table], [String; 2]);
}

impl<Q: Invalidated> Registered for Lookup<Q> {
    fn stats(&self) -> LookupStats {
        LookupStats {
            name: self.name(),
            batcher: self.batcher_stats(),
            cache: self.cache_stats(),
        }
    }

    fn changed<'a>(&'a self, change: Change<'a>) -> BoxFuture<'a, ()> {
        async move {
            if !Q::TABLES.iter().any(|t| change.touches(*t)) {
                return;
            }
            match Q::changed_key(change) {
                Some(key) => self.invalidate(&key).await,
                None => self.invalidate_all(),
            }
        }
        .boxed()
    }

    fn sync_cache(&self) -> BoxFuture<'_, ()> {
        Lookup::sync_cache(self).boxed()
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Lookup::shutdown(self).boxed()
    }

    #[cfg(test)]
    fn tables_and_sql(&self) -> (&'static [Table], [String; 2]) {
        let query = self.query();
        (
            Q::TABLES,
            [query.batch_sql().to_owned(), query.single_sql().to_owned()],
        )
    }
}

/// What [`Reads::new`] builds lookups from, keeping each one it builds.
struct Registry<'a> {
    router: &'a ReadRouter,
    coherence: &'a Coherence,
    lookups: Vec<Box<dyn Registered>>,
}

impl Registry<'_> {
    /// A lookup named `name` running `query` as `settings` say, kept in the
    /// registry, so a lookup is one field and one line of [`Reads::new`].
    fn add<Q: Invalidated>(
        &mut self,
        name: &'static str,
        query: Q,
        settings: &ReadSettings,
    ) -> Result<Lookup<Q>, BuildError> {
        let lookup = Lookup::with_freshness(name, query, self.router.clone(), settings, Q::FRESH)?
            .with_coherence(self.coherence.clone());
        self.lookups.push(Box::new(lookup.clone()));
        Ok(lookup)
    }
}

impl Reads {
    /// The reads, on the databases `router` chooses; on the batched and
    /// cached paths, starts one batcher per lookup on the current runtime.
    /// Tokens are looked up as `auth` says (through their own cache, or
    /// batched with none). The caches are used only while `coherence`
    /// allows.
    ///
    /// # Errors
    ///
    /// When a batcher or cache setting is invalid.
    pub fn new(
        router: impl Into<ReadRouter>,
        settings: &ReadSettings,
        auth: &AuthSettings,
        coherence: &Coherence,
    ) -> Result<Self, BuildError> {
        let router = router.into();
        let mut registry = Registry {
            router: &router,
            coherence,
            lookups: Vec::new(),
        };
        let kv = registry.add("kv", KvQuery, settings)?;
        let object_stat = registry.add("object_stat", ObjectStatQuery, settings)?;
        let principal = registry.add("auth", PrincipalQuery, &auth.reads(settings))?;
        let registered = registry.lookups.into();
        Ok(Self {
            kv,
            object_stat,
            principal,
            router,
            registered,
        })
    }

    /// Every lookup's statistics.
    pub fn stats(&self) -> Vec<LookupStats> {
        self.registered.iter().map(|r| r.stats()).collect()
    }

    /// Drops what `change` may have made stale from every lookup's cache.
    /// Once this returns, no load that started before can put an old
    /// value back.
    pub async fn changed(&self, change: Change<'_>) {
        for lookup in self.registered.iter() {
            lookup.changed(change).await;
        }
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
        futures_util::future::join_all(self.registered.iter().map(|r| r.sync_cache())).await;
    }

    /// Stops the batchers after answering what they hold.
    pub async fn shutdown(&self) {
        futures_util::future::join_all(self.registered.iter().map(|r| r.shutdown())).await;
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
                let client = crate::db::lease(&pools[i]).await?;
                let found = repositories::list(&**client).await;
                client.settle(&found);
                Ok::<_, PgError>(found?)
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
                let client = crate::db::lease(&pools[i]).await?;
                let found = repositories::get(&**client, name).await;
                client.settle(&found);
                Ok::<_, PgError>(found?)
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
            let client = crate::db::lease(primary).await?;
            let found = repositories::get(&**client, name).await;
            client.settle(&found);
            Ok::<_, PgError>(found?)
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
                let mut client = crate::db::lease(&pools[i]).await?;
                let page = if statements.timeout().is_none() {
                    list_on(&**client, repository, request).await
                } else {
                    list_in_transaction(&mut client, statements, repository, request).await
                };
                client.settle(&page);
                Ok::<_, PgError>(page?)
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
/// A page in one transaction that sets the statement timeout (behind a
/// pooler, whose connections carry none).
async fn list_in_transaction(
    client: &mut deadpool_postgres::ClientWrapper,
    statements: Statements,
    repository: &str,
    request: &ListRequest,
) -> Result<Listing, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    statements.begin(&tx).await?;
    let page = list_on(&*tx, repository, request).await?;
    tx.commit().await?;
    Ok(page)
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::objects::ObjectKey;
    use crate::settings::ReadPath;

    /// Reads on the cached path over a pool that never connects: building
    /// them starts batchers and caches, and nothing here loads.
    fn cached_reads() -> Reads {
        let config: tokio_postgres::Config = "host=127.0.0.1 port=1 user=nobody".parse().unwrap();
        let pool = pgbatch::pg::pool(config, &pgbatch::pg::PoolOptions::with_max_size(2)).unwrap();
        let settings = ReadSettings {
            path: ReadPath::Cached,
            ..ReadSettings::default()
        };
        Reads::new(
            pool,
            &settings,
            &AuthSettings::default(),
            &Coherence::default(),
        )
        .unwrap()
    }

    /// The tables a statement names after `FROM` or `JOIN` (not the
    /// `unnest(...)` of its keys).
    fn tables_in(sql: &str) -> Vec<String> {
        let words: Vec<&str> = sql.split_whitespace().collect();
        words
            .windows(2)
            .filter(|w| w[0].eq_ignore_ascii_case("from") || w[0].eq_ignore_ascii_case("join"))
            .map(|w| w[1].trim_end_matches([',', ')', ';']).to_ascii_lowercase())
            .filter(|name| name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .collect()
    }

    #[test]
    fn the_table_scan_finds_joins_and_skips_key_lists() {
        let sql = "SELECT k.a FROM unnest($1::text[]) AS k(a) JOIN repositories r ON r.name = k.a \
                   LEFT JOIN objects o ON o.path = k.a";
        assert_eq!(tables_in(sql), ["repositories", "objects"]);
        assert_eq!(
            tables_in("SELECT extract(epoch FROM o.mtime) FROM kv"),
            ["kv"]
        );
    }

    /// A lookup whose statements read a table its `Invalidated::TABLES`
    /// leaves out would keep serving cached values after that table
    /// changes: this fails for it (and for a table no change knows).
    #[tokio::test]
    async fn every_lookup_declares_each_table_its_statements_read() {
        let reads = cached_reads();
        assert_eq!(reads.registered.len(), reads.stats().len());
        for lookup in reads.registered.iter() {
            let name = lookup.stats().name;
            let (declared, statements) = lookup.tables_and_sql();
            for sql in &statements {
                let read = tables_in(sql);
                assert!(!read.is_empty(), "{name}: no table found in {sql}");
                for table in read {
                    let known = Table::ALL.iter().find(|t| t.name() == table);
                    let known = known.unwrap_or_else(|| {
                        panic!("{name} reads `{table}`, which no Table (and so no Change) covers")
                    });
                    assert!(
                        declared.contains(known),
                        "{name} reads `{table}` but its Invalidated::TABLES leaves it out"
                    );
                }
            }
        }
        reads.shutdown().await;
    }

    fn invalidations(reads: &Reads) -> Vec<(&'static str, u64)> {
        reads
            .stats()
            .into_iter()
            .map(|s| (s.name, s.cache.expect("cached path").invalidations))
            .collect()
    }

    #[tokio::test]
    async fn a_change_reaches_every_cache_over_a_table_it_touches() {
        let reads = cached_reads();
        let key = ObjectKey {
            repository: "demo".into(),
            path: "a/b".into(),
        };
        let counts =
            |kv, object_stat, auth| [("kv", kv), ("object_stat", object_stat), ("auth", auth)];
        assert_eq!(invalidations(&reads), counts(0, 0, 0));
        reads.changed(Change::Object(&key)).await;
        assert_eq!(invalidations(&reads), counts(0, 1, 0));
        reads.changed(Change::Objects).await;
        assert_eq!(invalidations(&reads), counts(0, 2, 0));
        reads.changed(Change::Token(&[7; 32])).await;
        assert_eq!(invalidations(&reads), counts(0, 2, 1));
        reads.changed(Change::Auth).await;
        assert_eq!(invalidations(&reads), counts(0, 2, 2));
        reads.changed(Change::Everything).await;
        assert_eq!(invalidations(&reads), counts(1, 3, 3));
        reads.shutdown().await;
    }
}
