//! A scoped load of one scope, and of several at once: each scope's
//! transaction (`BEGIN`, the clean start, its prologue, the statement,
//! `COMMIT`), and for several scopes all of them sent on one connection in
//! one round trip, one after another. Each scope's keys are read from its
//! own transaction's rows only; a scope whose role is refused, or whose
//! statement fails, fails its own keys and leaves nothing on the
//! connection for the next.

use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::loader::{as_refs, PageQuery, PgError, PgLoader};
use super::reads::Reads;
use super::scoped::{as_params, withhold, Pipelined, ScopedPgLoader};
use super::statements::Part;
use crate::db::{Page, PageKey, Paged, Scope};
use crate::Loaded;

impl<Q, R> ScopedPgLoader<Q, R> {
    /// Loads `keys` as `scope`, in a transaction of its own.
    pub(super) async fn load_scope<K, V>(
        &self,
        scope: &Scope,
        keys: Vec<K>,
    ) -> Result<Loaded<K, V>, PgError>
    where
        PgLoader<Q, R>: Reads<K, V>,
    {
        let values = self.prepare(scope).await?;
        let params = as_params(&values);
        let loaded = self.loader.load_with(keys, Some(self.start(&params))).await;
        loaded.map_err(|e| withhold(e, scope))
    }

    /// Loads each scope's keys as that scope, every scope's transaction
    /// pipelined on one connection.
    pub(super) async fn load_each<K, V>(&self, batches: Vec<(Scope, Vec<K>)>) -> Pipelined<K, V>
    where
        PgLoader<Q, R>: Reads<K, V>,
    {
        // Each role checked (the first time only) before anything is sent:
        // a scope refused here sends nothing.
        let mut values = Vec::with_capacity(batches.len());
        for (scope, _) in &batches {
            values.push(self.prepare(scope).await);
        }
        let asks: Vec<_> = batches
            .iter()
            .map(|(_, keys)| self.loader.statement(keys))
            .collect();
        let params: Vec<Vec<&(dyn ToSql + Sync)>> = asks
            .iter()
            .map(|ask| ask.as_ref().map_or_else(Vec::new, |(_, p)| as_refs(p)))
            .collect();
        let prologues: Vec<Vec<&(dyn ToSql + Sync)>> = values
            .iter()
            .map(|v| v.as_ref().map_or_else(|_| Vec::new(), |v| as_params(v)))
            .collect();
        let (mut sent, mut parts) = (Vec::new(), Vec::new());
        for (i, ask) in asks.iter().enumerate() {
            if let (Ok(_), Some((sql, _))) = (&values[i], ask) {
                sent.push(i);
                let (start, params) = (self.start(&prologues[i]), &params[i]);
                parts.push(Part { start, sql, params });
            }
        }
        let mut rows: Vec<Option<Result<Vec<Row>, PgError>>> =
            batches.iter().map(|_| None).collect();
        if !parts.is_empty() {
            for (i, each) in sent.into_iter().zip(self.loader.run_each(&parts).await?) {
                rows[i] = Some(each);
            }
        }
        // What was sent borrows the keys and the scopes' values: done with.
        drop(parts);
        drop(params);
        drop(prologues);
        drop(asks);
        let checked: Vec<Result<(), PgError>> = values.into_iter().map(|v| v.map(drop)).collect();
        let mut answers = Vec::with_capacity(batches.len());
        for (((scope, keys), checked), rows) in batches.into_iter().zip(checked).zip(rows) {
            let answer = match (checked, rows) {
                (Err(e), _) => Err(e),
                (Ok(()), Some(Err(e))) => Err(e),
                (Ok(()), rows) => self
                    .loader
                    .read(keys, rows.and_then(Result::ok).unwrap_or_default()),
            };
            answers.push(answer.map_err(|e| withhold(e, &scope)));
        }
        Ok(answers)
    }
}

impl<Q: PageQuery> ScopedPgLoader<Q, Paged> {
    /// [`load_each`](Self::load_each) for pages: a scope whose statement
    /// the database refused as a data error (a forged cursor whose value
    /// does not cast) is loaded again key by key, as a load of its own
    /// would be, so only the key at fault fails.
    pub(super) async fn load_each_page(
        &self,
        batches: Vec<(Scope, Vec<PageKey<Q::Parent>>)>,
    ) -> Pipelined<PageKey<Q::Parent>, Page<Q::Value>> {
        let copies = batches.clone();
        let mut each = self.load_each(batches).await?;
        for (answer, (scope, keys)) in each.iter_mut().zip(copies) {
            if !answer
                .as_ref()
                .is_err_and(|e| self.loader.is_data_fault(e, &keys))
            {
                continue;
            }
            *answer = match self.prepare(&scope).await {
                Ok(values) => {
                    let params = as_params(&values);
                    let start = Some(self.start(&params));
                    let shown = |e| withhold(e, &scope);
                    Ok(self.loader.pages_one_by_one(keys, start, shown).await)
                }
                Err(e) => Err(e),
            };
        }
        Ok(each)
    }
}
