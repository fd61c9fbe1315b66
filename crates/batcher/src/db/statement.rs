//! How a loader, a writer or an import sends its statements, whatever the
//! driver.

/// How a loader, a writer or an import sends its statements: prepared and
/// cached per connection, or unnamed, which is what a transaction-mode
/// pooler needs.
///
/// Both drivers take it: `pgbatch::pg` inside its `Statements` (which also
/// carries a statement timeout), `pgbatch::sqlx` as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StatementMode {
    /// Named statements, prepared once per connection and cached there (the
    /// driver's statement cache): the cheapest way to run the same
    /// statement many times, on a direct connection, through a
    /// session-mode pooler, or through PgBouncer 1.21 and later with
    /// `max_prepared_statements` set. The default.
    #[default]
    Prepared,
    /// Unnamed statements: nothing is left on the server connection, so
    /// they work through a transaction-mode pooler (PgBouncer before 1.21,
    /// Supavisor, Neon's pooled endpoint, RDS Proxy), which hands each
    /// transaction a possibly different server connection, where a named
    /// statement prepared on another one does not exist.
    ///
    /// - **tokio-postgres** sends each statement with its parameter types
    ///   in one round trip (`query_typed`); the types are learned once per
    ///   statement, by preparing it inside a transaction that is then
    ///   rolled back.
    /// - **sqlx** parses and executes an unnamed statement
    ///   (`persistent(false)`) in two round trips, which a pooler may send
    ///   to different server connections, so each read runs in a
    ///   transaction of its own that keeps one: `BEGIN`, parse, execute,
    ///   `COMMIT`. A writer's batch is a transaction already. A statement
    ///   binding a type sqlx does not know by its OID (an enum, a
    ///   composite, a domain, `citext`, `hstore`) still makes sqlx look the
    ///   type up once per connection with a prepared statement of its own:
    ///   cast such parameters to built-in types (`$1::text[]`) behind a
    ///   pooler.
    Unnamed,
}
