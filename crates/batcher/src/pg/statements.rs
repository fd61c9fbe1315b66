//! How statements reach Postgres: prepared and cached per connection, or
//! unnamed in one round trip for connections that go through a
//! transaction-mode pooler; and a statement timeout set per transaction
//! where a session setting would not stick.

use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use deadpool_postgres::{ClientWrapper as Client, Transaction};
use futures_util::future::{join4, maybe_done, MaybeDone};
use tokio::sync::OnceCell;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

pub use crate::db::StatementMode;
use crate::db::CLEAN_START;

/// The statement settings of a loader, a writer or an import.
///
/// ```
/// use std::time::Duration;
/// use pgbatch::pg::{StatementMode, Statements};
///
/// // Behind PgBouncer in transaction mode.
/// let behind_pooler = Statements::default()
///     .mode(StatementMode::Unnamed)
///     .statement_timeout(Duration::from_millis(500));
/// # let _ = behind_pooler;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[must_use]
pub struct Statements {
    pub(crate) mode: StatementMode,
    pub(crate) statement_timeout: Option<Duration>,
}

impl Statements {
    /// Prepared or unnamed statements. Default [`StatementMode::Prepared`].
    pub fn mode(mut self, mode: StatementMode) -> Self {
        self.mode = mode;
        self
    }

    /// Makes the server give up on a statement after `timeout`, set in each
    /// transaction (`SET LOCAL statement_timeout`): for connections that
    /// cannot carry it as a session setting. Through a transaction-mode
    /// pooler a session `SET`, or the `options` startup parameter, either is
    /// refused or lands on whichever server connection the pooler picked
    /// and stays there for its next client. A read outside a transaction is
    /// then sent as `BEGIN; SET LOCAL ...`, the statement and `COMMIT`
    /// together, in one round trip. Default: none (the connection's own
    /// setting applies).
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = Some(timeout);
        self
    }

    /// The mode in use.
    pub fn statement_mode(&self) -> StatementMode {
        self.mode
    }

    /// The per-transaction timeout, if any.
    pub fn timeout(&self) -> Option<Duration> {
        self.statement_timeout
    }

    /// `SET LOCAL statement_timeout = ...` for this timeout, if any.
    pub(crate) fn set_local(&self) -> Option<String> {
        self.statement_timeout
            .map(|t| format!("SET LOCAL statement_timeout = {}", t.as_millis().max(1)))
    }

    /// Sets the statement timeout in `tx`, if there is one: for statements
    /// of your own, in a transaction, on connections that cannot carry the
    /// timeout as a session setting (behind a pooler), as the loader, the
    /// writer and the import do with theirs.
    ///
    /// # Errors
    ///
    /// When the `SET LOCAL` fails.
    pub async fn begin(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
    ) -> Result<(), tokio_postgres::Error> {
        match self.set_local() {
            Some(set) => tx.batch_execute(&set).await,
            None => Ok(()),
        }
    }
}

/// A statement to run with [`Statements::query`]: its text and, once
/// unnamed mode has learned them, its parameter types. Keep one per
/// statement for as long as it is used (in a `static`, say), so the types
/// are learned once.
///
/// ```
/// use std::sync::LazyLock;
/// use pgbatch::pg::Sql;
///
/// static USER_BY_ID: LazyLock<Sql> =
///     LazyLock::new(|| Sql::new("SELECT name FROM users WHERE id = $1"));
/// # let _ = &*USER_BY_ID;
/// ```
pub struct Sql {
    text: String,
    types: OnceCell<Vec<Type>>,
}

impl fmt::Debug for Sql {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sql").field("text", &self.text).finish()
    }
}

impl Sql {
    /// The statement `text`.
    pub fn new(text: &str) -> Self {
        Self {
            text: text.to_owned(),
            types: OnceCell::new(),
        }
    }

    /// The statement `text`, whose parameters are of `types`: nothing to
    /// learn from the server.
    pub(crate) fn with_types(text: &str, types: Vec<Type>) -> Self {
        Self {
            text: text.to_owned(),
            types: OnceCell::from(types),
        }
    }

    /// The parameter types, learned on `client` the first time: the
    /// statement is prepared inside a transaction, which keeps one server
    /// connection through a pooler, and closed before it ends.
    async fn types(&self, client: &mut Client) -> Result<&[Type], tokio_postgres::Error> {
        self.types
            .get_or_try_init(|| async {
                let tx = client.transaction().await?;
                let types = tx.prepare(&self.text).await?.params().to_vec();
                tx.rollback().await?;
                Ok::<_, tokio_postgres::Error>(types)
            })
            .await
            .map(Vec::as_slice)
    }

    /// The parameter types, learned inside `tx` the first time.
    async fn types_in(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
    ) -> Result<&[Type], tokio_postgres::Error> {
        self.types
            .get_or_try_init(|| async { Ok(tx.prepare(&self.text).await?.params().to_vec()) })
            .await
            .map(Vec::as_slice)
    }
}

/// What starts a transaction: `BEGIN`, the statement timeout where the
/// settings set one, and for a scope's, the clean start (before its
/// prologue: nothing of the connection's own session settings decides
/// what the scope reads).
fn begin(timeout: Option<String>, scoped: bool) -> String {
    let mut begin = String::from("BEGIN");
    if let Some(set) = timeout {
        begin.push_str("; ");
        begin.push_str(&set);
    }
    if scoped {
        begin.push_str("; ");
        begin.push_str(CLEAN_START);
    }
    begin
}

/// Runs `query` in a transaction begun by `begin`, after `prologue`.
/// `join4` polls in order, and each sends its request on its first poll,
/// so all four go out at once, in this order: a caller that stops waiting
/// cannot leave the connection inside the transaction, since `COMMIT` is
/// already on its way. A failed statement aborts the transaction, and its
/// `COMMIT` then rolls back.
async fn transaction(
    client: &Client,
    begin: &str,
    prologue: Option<Ready<'_>>,
    query: Ready<'_>,
) -> Result<Vec<Row>, tokio_postgres::Error> {
    let (begun, set, rows, committed) = join4(
        client.batch_execute(begin),
        async {
            match prologue {
                Some(prologue) => prologue.run(client).await.map(drop),
                None => Ok(()),
            }
        },
        query.run(client),
        client.batch_execute("COMMIT"),
    )
    .await;
    begun?;
    set?;
    let rows = rows?;
    committed?;
    Ok(rows)
}

/// Awaits every future, polling them in order each time: each sends its
/// requests on its first poll, so they reach the connection in this order,
/// one transaction after another. Written here rather than taken from
/// `futures`: its `join_all` polls through `FuturesOrdered` past 30
/// futures, whose order of first polls it does not promise, and an
/// interleaving would run one scope's statements inside another's
/// transaction.
async fn in_order<F: Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut all: Vec<Pin<Box<MaybeDone<F>>>> = futures.map(|f| Box::pin(maybe_done(f))).collect();
    poll_fn(|cx| {
        let mut pending = false;
        for f in &mut all {
            pending |= f.as_mut().poll(cx).is_pending();
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    all.iter_mut()
        .map(|f| f.as_mut().take_output().expect("every future is done"))
        .collect()
}

fn typed<'a>(
    params: &'a [&'a (dyn ToSql + Sync)],
    types: &[Type],
) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    params.iter().copied().zip(types.iter().cloned()).collect()
}

/// What makes a transaction a scope's: the loader's prologue statement
/// and its parameters (the role and the settings' values).
#[derive(Clone, Copy)]
pub(crate) struct Start<'a> {
    pub(crate) sql: &'a Sql,
    pub(crate) params: &'a [&'a (dyn ToSql + Sync)],
}

/// One scope's part of a load of several (see
/// [`Statements::query_each_as`]): its statement, after its prologue.
pub(crate) struct Part<'a> {
    pub(crate) start: Start<'a>,
    pub(crate) sql: &'a Sql,
    pub(crate) params: &'a [&'a (dyn ToSql + Sync)],
}

/// A statement ready to send: prepared, or unnamed with its types.
enum Ready<'a> {
    Prepared(tokio_postgres::Statement, &'a [&'a (dyn ToSql + Sync)]),
    Typed(&'a str, Vec<(&'a (dyn ToSql + Sync), Type)>),
}

impl Ready<'_> {
    /// Sends the statement on its first poll and reads its rows.
    async fn run(self, client: &Client) -> Result<Vec<Row>, tokio_postgres::Error> {
        match self {
            Ready::Prepared(stmt, params) => client.query(&stmt, params).await,
            Ready::Typed(text, params) => client.query_typed(text, &params).await,
        }
    }
}

impl Statements {
    /// Runs `sql` with `params` on `client`, outside a transaction, as these
    /// settings say: prepared and cached on the connection, or unnamed with
    /// its parameter types in one round trip; with a statement timeout, in
    /// a transaction that sets it, sent together with the statement.
    ///
    /// # Errors
    ///
    /// When the statement fails (or, the first time in unnamed mode,
    /// learning its parameter types does).
    ///
    /// # Cancel safety
    ///
    /// With a statement timeout, dropping the future never leaves the
    /// connection inside the transaction: its `COMMIT` is sent with the
    /// statement.
    pub async fn query(
        &self,
        client: &mut Client,
        sql: &Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        self.query_as(client, sql, params, None).await
    }

    /// As [`query`](Self::query), run as a scope if `start` is given: in a
    /// transaction whose first statement is the scope's prologue (its
    /// role and settings as bound parameters), sent together with the
    /// statement and the `COMMIT`, so nothing of the scope outlives the
    /// transaction on the connection, whether the statement succeeds,
    /// fails or is abandoned.
    ///
    /// # Errors
    ///
    /// As [`query`](Self::query); a role or setting the database refuses
    /// fails with its own error (the statement then does not run).
    pub(crate) async fn query_as(
        &self,
        client: &mut Client,
        sql: &Sql,
        params: &[&(dyn ToSql + Sync)],
        start: Option<Start<'_>>,
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        match (self.mode, self.set_local(), start) {
            (StatementMode::Prepared, None, None) => {
                let stmt = client.prepare_cached(&sql.text).await?;
                client.query(&stmt, params).await
            }
            (StatementMode::Unnamed, None, None) => {
                let types = sql.types(client).await?;
                client.query_typed(&sql.text, &typed(params, types)).await
            }
            (_, timeout, start) => {
                let begin = begin(timeout, start.is_some());
                let prologue = match start {
                    Some(start) => Some(self.statement(client, start.sql, start.params).await?),
                    None => None,
                };
                let query = self.statement(client, sql, params).await?;
                transaction(client, &begin, prologue, query).await
            }
        }
    }

    /// Runs each part as its scope, each in a transaction of its own (as
    /// [`query_as`](Self::query_as) does one), all of them sent at once on
    /// `client`, one transaction after another: `BEGIN` and the clean
    /// start, the prologue, the statement, `COMMIT`, then the next part's.
    /// A part that fails (its role refused, its statement) aborts its own
    /// transaction only, whose `COMMIT` then rolls back, so the next part
    /// starts clean. Each part's rows, or its error, in order.
    pub(crate) async fn query_each_as(
        &self,
        client: &mut Client,
        parts: &[Part<'_>],
    ) -> Vec<Result<Vec<Row>, tokio_postgres::Error>> {
        let begin = begin(self.set_local(), true);
        // Prepared (or their types learned) before anything is sent: a
        // part whose statement cannot be prepared sends nothing.
        let mut ready = Vec::with_capacity(parts.len());
        for part in parts {
            let prologue = self
                .statement(client, part.start.sql, part.start.params)
                .await;
            let query = match prologue {
                Ok(prologue) => self
                    .statement(client, part.sql, part.params)
                    .await
                    .map(|q| (prologue, q)),
                Err(e) => Err(e),
            };
            ready.push(query);
        }
        let client: &Client = client;
        let begin = &begin;
        let transactions = ready.into_iter().map(|ready| async move {
            let (prologue, query) = ready?;
            transaction(client, begin, Some(prologue), query).await
        });
        in_order(transactions).await
    }

    /// `sql` with `params`, ready to send on `client` as this mode says:
    /// prepared (and cached on the connection) first, or with its types.
    async fn statement<'a>(
        &self,
        client: &mut Client,
        sql: &'a Sql,
        params: &'a [&'a (dyn ToSql + Sync)],
    ) -> Result<Ready<'a>, tokio_postgres::Error> {
        Ok(match self.mode {
            StatementMode::Prepared => {
                Ready::Prepared(client.prepare_cached(&sql.text).await?, params)
            }
            _ => Ready::Typed(&sql.text, typed(params, sql.types(client).await?)),
        })
    }

    /// Runs `sql` with `params` in `tx`.
    pub(crate) async fn query_in(
        &self,
        tx: &Transaction<'_>,
        sql: &Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        match self.mode {
            StatementMode::Prepared => {
                let stmt = tx.prepare_cached(&sql.text).await?;
                tx.query(&stmt, params).await
            }
            _ => {
                let types = sql.types_in(tx).await?;
                tx.query_typed(&sql.text, &typed(params, types)).await
            }
        }
    }

    /// Runs `sql`, which returns exactly one row, with `params` in `tx`.
    pub(crate) async fn query_one_in(
        &self,
        tx: &Transaction<'_>,
        sql: &Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, tokio_postgres::Error> {
        match self.mode {
            StatementMode::Prepared => {
                let stmt = tx.prepare_cached(&sql.text).await?;
                tx.query_one(&stmt, params).await
            }
            _ => {
                let types = sql.types_in(tx).await?;
                tx.query_typed_one(&sql.text, &typed(params, types)).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeout_is_set_per_transaction_in_milliseconds() {
        let s = Statements::default();
        assert_eq!(s.set_local(), None);
        assert_eq!(s.statement_mode(), StatementMode::Prepared);
        let s = s
            .mode(StatementMode::Unnamed)
            .statement_timeout(Duration::from_micros(1500));
        assert_eq!(
            s.set_local().as_deref(),
            Some("SET LOCAL statement_timeout = 1")
        );
        let s = s.statement_timeout(Duration::ZERO);
        assert_eq!(
            s.set_local().as_deref(),
            Some("SET LOCAL statement_timeout = 1"),
            "zero would mean no timeout at all"
        );
    }
}
