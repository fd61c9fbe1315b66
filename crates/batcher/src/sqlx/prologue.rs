//! How a scoped load's transaction starts on sqlx: the role check (once
//! per role) and the prologue. Below both the loader, which runs it inside
//! its transaction, and the scoped loader, which makes it.

use ::sqlx::postgres::{PgConnection, Postgres};
use ::sqlx::Executor;

use crate::db::{
    judge_role, CheckedRoles, Prologue, Scope, ScopeError, StatementMode, ROLE_CHECK_SQL,
};

/// What every load of one scoped loader shares: its prologue and the roles
/// checked.
pub(super) struct Scoping {
    prologue: Prologue,
    checked: CheckedRoles,
}

/// How one load's transaction starts: the scope's role, checked if this
/// loader has not yet, and the prologue's values.
pub(super) struct Start<'s> {
    scoping: &'s Scoping,
    role: Option<&'s str>,
    values: Vec<&'s str>,
}

impl Start<'_> {
    /// Runs on `conn`, inside the load's transaction: the role check the
    /// first time, then the prologue.
    pub(super) async fn run(
        &self,
        conn: &mut PgConnection,
        mode: StatementMode,
    ) -> Result<(), ::sqlx::Error> {
        let prepared = mode == StatementMode::Prepared;
        let checked = &self.scoping.checked;
        if !checked.is_accepted(self.role) {
            let row =
                ::sqlx::query_as::<Postgres, (String, bool, bool, Option<String>)>(ROLE_CHECK_SQL)
                    .bind(self.role)
                    .persistent(prepared)
                    .fetch_optional(&mut *conn)
                    .await?;
            judge_role(self.role, row).map_err(refused)?;
            checked.accept(self.role);
        }
        let prologue = self
            .values
            .iter()
            .fold(
                ::sqlx::query::<Postgres>(self.scoping.prologue.sql()),
                |q, v| q.bind(*v),
            )
            .persistent(prepared);
        Executor::execute(conn, prologue).await?;
        Ok(())
    }
}

/// A refused scope as sqlx's error.
fn refused(e: ScopeError) -> ::sqlx::Error {
    ::sqlx::Error::Configuration(Box::new(e))
}

impl Scoping {
    /// The scoping of a loader whose scopes may set `settings`.
    pub(super) fn new<I, N>(settings: I) -> Result<Self, ScopeError>
    where
        I: IntoIterator<Item = N>,
        N: Into<String>,
    {
        Ok(Self {
            prologue: Prologue::new(settings)?,
            checked: CheckedRoles::default(),
        })
    }

    /// The same prologue, with no role checked yet (for another pool).
    pub(super) fn anew(&self) -> Self {
        Self {
            prologue: self.prologue.clone(),
            checked: CheckedRoles::default(),
        }
    }

    /// The declared settings.
    pub(super) fn names(&self) -> impl Iterator<Item = &str> {
        self.prologue.names()
    }

    /// How a load of `scope` starts.
    ///
    /// # Errors
    ///
    /// A setting the loader did not declare, as sqlx's error.
    pub(super) fn start<'s>(&'s self, scope: &'s Scope) -> Result<Start<'s>, ::sqlx::Error> {
        Ok(Start {
            scoping: self,
            role: scope.role(),
            values: self.prologue.values(scope).map_err(refused)?,
        })
    }
}
