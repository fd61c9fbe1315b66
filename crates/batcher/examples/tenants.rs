//! One batcher shared by every tenant of a service that authorizes with
//! row-level security: each load runs as one tenant (`SET LOCAL ROLE` and
//! `set_config('app.tenant', ..., true)` in a transaction of its own), so
//! tenants share the batcher's speed, never each other's rows.
//!
//! It creates a role `pgbatch_example_tenant` (granted to the connecting
//! user, which needs the right to create roles) and a table
//! `pgbatch_example_notes` under a policy, in the database `DATABASE_URL`
//! names; runs 10,000 concurrent reads of 16 tenants through one scoped
//! batcher with a cache in front; checks every answer against what its
//! tenant may see; prints one line; drops the table, and exits non-zero if
//! any answer was another tenant's.
//!
//! ```sh
//! DATABASE_URL='host=/var/run/postgresql user=postgres dbname=scratch' \
//!     cargo run -p pgbatch --features postgres,cache --example tenants
//! # scopes 16, reads 10000, loads 412, leaks 0
//! ```

use std::time::Duration;

use pgbatch::cache::Cache;
use pgbatch::pg::tokio_postgres::{Error as PgDriverError, Row};
use pgbatch::pg::{self, BatchQuery, Params, PgLoader, PoolOptions, Scope, ScopeError};
use pgbatch::Batcher;

const TENANTS: i64 = 16;
const NOTES: i64 = 4_000;
const READS: i64 = 10_000;

/// Notes by id, as whoever runs the load may see them.
struct NotesById;

impl BatchQuery for NotesById {
    type Key = i64;
    type Value = String;

    fn batch_sql(&self) -> &str {
        // No tenant in the statement: the policy filters the rows.
        "SELECT id, body FROM pgbatch_example_notes WHERE id = ANY($1)"
    }
    fn batch_params<'a>(&self, keys: &'a [i64]) -> Params<'a> {
        vec![Box::new(keys)]
    }
    fn map_row(&self, row: &Row) -> Result<(i64, String), PgDriverError> {
        Ok((row.try_get(0)?, row.try_get(1)?))
    }
}

/// The scope of a request of `tenant`: in a service, built from its
/// verified token (the claims as a setting, as PostgREST does).
fn scope_of(tenant: i64) -> Result<Scope, ScopeError> {
    Scope::builder()
        .label(format!("tenant {tenant}"))
        .role("pgbatch_example_tenant")
        .setting("app.tenant", tenant.to_string())
        .build()
}

/// What `tenant` may see of note `id`: its own notes only.
fn visible(tenant: i64, id: i64) -> Option<String> {
    (id % TENANTS == tenant && (1..=NOTES).contains(&id))
        .then(|| format!("note {id} of tenant {tenant}"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .ok_or("set DATABASE_URL to a scratch database (see the example's docs)")?;
    let pool = pg::pool(url.parse()?, &PoolOptions::with_max_size(8))?;
    pool.get()
        .await?
        .batch_execute(&format!(
            "DO $$ BEGIN CREATE ROLE pgbatch_example_tenant NOLOGIN;
                 EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
             GRANT pgbatch_example_tenant TO CURRENT_USER;
             DROP TABLE IF EXISTS pgbatch_example_notes;
             CREATE TABLE pgbatch_example_notes (
                 id bigint PRIMARY KEY, tenant bigint NOT NULL, body text NOT NULL);
             INSERT INTO pgbatch_example_notes
                 SELECT n, n % {TENANTS}, 'note ' || n || ' of tenant ' || n % {TENANTS}
                 FROM generate_series(1, {NOTES}) AS n;
             ALTER TABLE pgbatch_example_notes ENABLE ROW LEVEL SECURITY;
             GRANT SELECT ON pgbatch_example_notes TO pgbatch_example_tenant;
             CREATE POLICY own_notes ON pgbatch_example_notes FOR SELECT
                 TO pgbatch_example_tenant
                 USING (tenant = nullif(current_setting('app.tenant', true), '')::bigint);"
        ))
        .await?;

    // One batcher for every tenant: a tenant's keys wait with its other
    // keys, and each load runs as its tenant.
    let notes: Batcher<i64, String, Scope> = Batcher::builder()
        .name("notes")
        .timeout(Duration::from_secs(5))
        // The whole burst is queued at once.
        .channel_capacity(16_384)
        .build_scoped(PgLoader::new(pool.clone(), NotesById))?;
    // A tenant's cached note is that tenant's alone.
    let cache = Cache::builder()
        .name("notes")
        .max_capacity(50_000)
        .build_with_batcher(notes.clone())?;

    let scopes: Vec<Scope> = (0..TENANTS).map(scope_of).collect::<Result<_, _>>()?;
    let reads: Vec<_> = (0..READS)
        .map(|i| {
            // Each tenant asks for notes of every tenant, its own and not.
            let (tenant, id) = (i % TENANTS, 1 + (i * 7_919) % (NOTES / 2));
            let (cache, scope) = (cache.clone(), scopes[tenant as usize].clone());
            tokio::spawn(async move { (tenant, id, cache.get_as(&scope, id).await) })
        })
        .collect();
    let mut leaks = 0;
    for read in reads {
        let (tenant, id, got) = read.await?;
        if got? != visible(tenant, id) {
            leaks += 1;
        }
    }
    let loads = notes.stats().batches;
    println!("scopes {TENANTS}, reads {READS}, loads {loads}, leaks {leaks}");

    notes.shutdown().await;
    pool.get()
        .await?
        .batch_execute("DROP TABLE pgbatch_example_notes")
        .await?;
    if leaks > 0 {
        return Err(format!("{leaks} answers were not their tenant's").into());
    }
    Ok(())
}
