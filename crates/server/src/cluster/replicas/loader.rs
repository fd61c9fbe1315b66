//! [`RoutedLoader`]: a batched query on whichever database the router
//! chooses.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use pgbatch::pg::{BatchQuery, PgError, PgLoader};
use pgbatch::{Loaded, Loader};

use super::{Needs, ReadRouter};

/// A [`BatchQuery`] run on the database [`ReadRouter`] chooses: one
/// [`PgLoader`] per pool, sharing the query. A [`Loader`] for the reads
/// that need what it was built or [`needing`](Self::needing) for.
pub struct RoutedLoader<Q> {
    router: ReadRouter,
    loaders: Arc<[PgLoader<Q>]>,
    needs: Needs,
    /// Keys a replica does not know are asked of the primary.
    confirm_misses: bool,
}

impl<Q> std::fmt::Debug for RoutedLoader<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoutedLoader")
            .field("needs", &self.needs)
            .field("confirm_misses", &self.confirm_misses)
            .field("pools", &self.loaders.len())
            .finish_non_exhaustive()
    }
}

impl<Q> Clone for RoutedLoader<Q> {
    fn clone(&self) -> Self {
        Self {
            router: self.router.clone(),
            loaders: Arc::clone(&self.loaders),
            needs: self.needs,
            confirm_misses: self.confirm_misses,
        }
    }
}

impl<Q: BatchQuery> RoutedLoader<Q> {
    /// `query` on every pool of `router`, for reads that need `needs`.
    pub fn new(router: ReadRouter, query: Q, needs: Needs) -> Self {
        let primary =
            PgLoader::with_statements(router.primary().clone(), query, router.statements());
        let loaders = router
            .pools()
            .iter()
            .enumerate()
            .map(|(i, pool)| {
                if i == 0 {
                    primary.clone()
                } else {
                    primary.with_pool(pool.clone())
                }
            })
            .collect();
        Self {
            router,
            loaders,
            needs,
            confirm_misses: false,
        }
    }

    /// This loader, asking the primary for the keys a replica does not
    /// know if `confirm`: a key may be newer than the replica's replay (a
    /// token made on another instance a moment ago).
    #[must_use]
    pub fn confirming_misses(mut self, confirm: bool) -> Self {
        self.confirm_misses = confirm;
        self
    }

    /// Where this loader's reads go.
    pub fn router(&self) -> &ReadRouter {
        &self.router
    }

    /// The query this loader runs.
    pub fn query(&self) -> &Q {
        self.loaders[0].query()
    }

    /// The same loader for reads that need `needs`.
    #[must_use]
    pub fn needing(&self, needs: Needs) -> Self {
        Self {
            needs,
            ..self.clone()
        }
    }

    /// One key with the single-key statement (the naive path).
    ///
    /// # Errors
    ///
    /// As [`PgLoader::load_one`] on the primary.
    pub async fn load_one(&self, key: &Q::Key) -> Result<Option<Q::Value>, PgError> {
        let (found, from_replica) = self.read(|i| self.loaders[i].load_one(key)).await?;
        if found.is_none() && self.confirm_misses && from_replica {
            return self.loaders[0].load_one(key).await;
        }
        Ok(found)
    }

    /// `attempt` on the pool the router chooses for this loader's reads,
    /// and whether a replica gave the answer (so that a key it did not
    /// know may be asked of the primary, and one the primary did not know
    /// is not asked twice).
    async fn read<T, F, Fut>(&self, attempt: F) -> Result<(T, bool), PgError>
    where
        F: Fn(usize) -> Fut,
        Fut: Future<Output = Result<T, PgError>>,
    {
        let answered = AtomicUsize::new(0);
        let value = self
            .router
            .read(self.needs, |i| {
                answered.store(i, Relaxed);
                attempt(i)
            })
            .await?;
        Ok((value, answered.load(Relaxed) != 0))
    }
}

impl<Q: BatchQuery> Loader<Q::Key, Q::Value> for RoutedLoader<Q> {
    type Error = PgError;

    async fn load(&self, keys: Vec<Q::Key>) -> Result<Loaded<Q::Key, Q::Value>, PgError> {
        // Kept for a retry on the primary only when a replica may be
        // chosen; a lone database takes the keys as they are.
        if !self.router.has_replicas() {
            return Loader::load(&self.loaders[0], keys).await;
        }
        let (mut loaded, from_replica) = self
            .read(|i| Loader::load(&self.loaders[i], keys.clone()))
            .await?;
        if self.confirm_misses && from_replica {
            let missing: Vec<Q::Key> = keys
                .into_iter()
                .filter(|k| matches!(loaded.answer(k), Ok(None)))
                .collect();
            if !missing.is_empty() {
                let again = Loader::load(&self.loaders[0], missing).await?;
                loaded.extend(again.into_values());
            }
        }
        Ok(loaded)
    }

    fn is_absent(&self, value: &Q::Value) -> bool {
        Loader::is_absent(&self.loaders[0], value)
    }
}
