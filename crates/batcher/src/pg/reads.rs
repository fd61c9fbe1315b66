//! What a load of each row shape sends for its keys, and how it reads the
//! rows back: shared by a load of one scope and a pipelined load of
//! several, so both answer alike.

use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::error::is_unavailable;
use super::loader::{as_refs, BatchQuery, PageQuery, Params, PgError, PgLoader};
use super::statements::{Part, Sql, Start};
use crate::db::{gather_lists, gather_pages, BadRows, List, Page, PageError, PageKey, Paged};
use crate::Loaded;

/// A statement for some keys, and its parameters.
pub(super) type Ask<'k> = (&'k Sql, Params<'k>);

/// How a load of one row shape asks for its keys and reads the answer.
pub(super) trait Reads<K, V> {
    /// The statement for `keys`, if there is anything to ask.
    fn statement<'k>(&'k self, keys: &'k [K]) -> Option<Ask<'k>>;
    /// `keys`' answers from the statement's rows (none if nothing was
    /// asked). A row that does not map fails its own key, not the load.
    fn read(&self, keys: Vec<K>, rows: Vec<Row>) -> Result<Loaded<K, V>, PgError>;
}

impl<Q, R> PgLoader<Q, R> {
    /// Loads `keys`, in a scope's transaction if `start` is given.
    pub(super) async fn load_with<K, V>(
        &self,
        keys: Vec<K>,
        start: Option<Start<'_>>,
    ) -> Result<Loaded<K, V>, PgError>
    where
        Self: Reads<K, V>,
    {
        let rows = match self.statement(&keys) {
            Some((sql, params)) => self.run(sql, &as_refs(&params), start).await?,
            None => Vec::new(),
        };
        self.read(keys, rows)
    }

    /// Runs each part on one connection, pipelined (see
    /// [`Statements::query_each_as`](super::Statements::query_each_as)):
    /// each part's rows or error. If the connection turns out to be lost,
    /// once more on a new one, as [`run`](Self::run) does.
    ///
    /// # Errors
    ///
    /// When no connection can be had: every part fails alike.
    pub(super) async fn run_each(
        &self,
        parts: &[Part<'_>],
    ) -> Result<Vec<Result<Vec<Row>, PgError>>, PgError> {
        let mut again = true;
        loop {
            let mut lease = super::Lease::get(self.pool()).await?;
            let each = self.statements().query_each_as(&mut lease, parts).await;
            let lost = each.iter().any(|r| r.as_ref().is_err_and(is_unavailable));
            if lost {
                lease.discard(true);
            } else {
                lease.release();
            }
            if lost && again {
                again = false;
                tracing::debug!("database connection lost; reading again on a new one");
                continue;
            }
            return Ok(each
                .into_iter()
                .map(|r| r.map_err(PgError::Query))
                .collect());
        }
    }
}

/// The batch statement (the single-key one for one key).
fn keys_statement<'k, Q: BatchQuery, R>(
    loader: &'k PgLoader<Q, R>,
    keys: &'k [Q::Key],
) -> Option<Ask<'k>> {
    let (query, batch, single) = loader.queries();
    Some(match keys {
        [] => return None,
        [key] => (single, query.single_params(key)),
        _ => (batch, query.batch_params(keys)),
    })
}

/// Each key's row.
impl<Q: BatchQuery> Reads<Q::Key, Q::Value> for PgLoader<Q> {
    fn statement<'k>(&'k self, keys: &'k [Q::Key]) -> Option<Ask<'k>> {
        keys_statement(self, keys)
    }

    fn read(
        &self,
        _keys: Vec<Q::Key>,
        rows: Vec<Row>,
    ) -> Result<Loaded<Q::Key, Q::Value>, PgError> {
        let q = self.query();
        let mut loaded = Loaded::with_capacity(rows.len());
        let mut bad = BadRows::default();
        for row in &rows {
            match q.map_row(row) {
                Ok((key, value)) => {
                    loaded.insert(key, value);
                }
                Err(e) => bad.add(&mut loaded, q.row_key(row), e),
            }
        }
        bad.settle(&mut loaded, PgError::Query);
        Ok(loaded)
    }
}

/// Every row of each key, in the statement's order.
impl<Q: BatchQuery> Reads<Q::Key, Vec<Q::Value>> for PgLoader<Q, List> {
    fn statement<'k>(&'k self, keys: &'k [Q::Key]) -> Option<Ask<'k>> {
        keys_statement(self, keys)
    }

    fn read(
        &self,
        keys: Vec<Q::Key>,
        rows: Vec<Row>,
    ) -> Result<Loaded<Q::Key, Vec<Q::Value>>, PgError> {
        let q = self.query();
        let rows = rows.iter().map(|row| {
            q.map_row(row)
                .map_err(|e| (q.row_key(row), PgError::Query(e)))
        });
        Ok(gather_lists(&keys, rows))
    }
}

/// Each key's page, every key made by this loader's statement in one
/// `LATERAL` statement; a key another statement made fails alone.
impl<Q: PageQuery> Reads<PageKey<Q::Parent>, Page<Q::Value>> for PgLoader<Q, Paged> {
    fn statement<'k>(&'k self, keys: &'k [PageKey<Q::Parent>]) -> Option<Ask<'k>> {
        let page = self.query().page_sql();
        let ours: Vec<&PageKey<Q::Parent>> = keys.iter().filter(|k| page.made(k)).collect();
        if ours.is_empty() {
            return None;
        }
        let parents: Vec<Q::Parent> = ours.iter().map(|k| k.parent().clone()).collect();
        let ours: Vec<PageKey<Q::Parent>> = ours.into_iter().cloned().collect();
        let (limits, afters) = page.bounds(&ours);
        let mut params: Params<'k> = vec![Box::new(parents), Box::new(limits)];
        params.extend(
            afters
                .into_iter()
                .map(|a| Box::new(a) as Box<dyn ToSql + Sync + Send>),
        );
        let (_, batch, _) = self.queries();
        Some((batch, params))
    }

    fn read(
        &self,
        keys: Vec<PageKey<Q::Parent>>,
        rows: Vec<Row>,
    ) -> Result<Loaded<PageKey<Q::Parent>, Page<Q::Value>>, PgError> {
        let q = self.query();
        let page = q.page_sql();
        let (ours, others): (Vec<_>, Vec<_>) = keys.into_iter().partition(|k| page.made(k));
        let at = page.value_columns();
        let mut read = Vec::with_capacity(rows.len());
        for row in &rows {
            // The key's position first: a row whose value does not map
            // still fails its own key.
            let position: i64 = row.try_get(at)?;
            // `None` if an order column is NULL: the key then fails.
            let order: Option<Vec<String>> = (0..page.order_columns())
                .map(|i| row.try_get::<_, Option<String>>(at + 1 + i))
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .collect();
            let value = q.map_row(row).map_err(PgError::Query);
            let index = usize::try_from(position - 1).unwrap_or(usize::MAX);
            read.push((index, order, value));
        }
        let mut loaded = gather_pages(ours, read);
        for key in others {
            loaded.fail(key, PageError::OtherStatement);
        }
        Ok(loaded)
    }
}
