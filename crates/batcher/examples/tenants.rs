//! One batcher shared by every tenant of a service that authorizes with
//! row-level security: each load runs as one tenant (its role and
//! `app.tenant`, set as parameters in a transaction of its own), so
//! tenants share the batcher's speed, never each other's rows.
//!
//! It creates a role `pgbatch_example_tenant` (granted to the connecting
//! user, which needs the right to create roles) and a table
//! `pgbatch_example_notes` under a policy, in the database `DATABASE_URL`
//! names; runs 10,000 concurrent reads of 16 tenants through one scoped
//! batcher with a cache in front, half of them of the reader's own notes
//! and half of other tenants'; checks every answer against what its
//! tenant may see; then reads the public notes from every tenant's
//! requests as one `public` scope, so they share its loads and cached
//! values; prints a line for each; drops the table; and exits non-zero if
//! it found nothing, missed a note the tenant may see, or was given one it
//! may not.
//!
//! ```sh
//! DATABASE_URL='host=/var/run/postgresql user=postgres dbname=scratch' \
//!     cargo run -p pgbatch --features postgres,cache --example tenants
//! # scopes 16, reads 10000, loads 412, found 5000 of 5000 expected, leaks 0
//! # public notes: 1600 reads of 10 notes from 16 tenants, 10 loads, wrong 0
//! ```
//!
//! `--unscoped` reads through a loader that ignores the scope (every load
//! as the connecting user, which owns the table and so bypasses its
//! policy): the check then reports the leak and the example fails, which
//! is what shows that the check can fail.

use std::time::Duration;

use pgbatch::cache::Cache;
use pgbatch::pg::tokio_postgres::{Error as PgDriverError, Row};
use pgbatch::pg::{self, BatchQuery, Params, PgLoader, PoolOptions, Scope, ScopeError};
use pgbatch::{scoped_loader_fn, Batcher, Loader};

const TENANTS: i64 = 16;
/// Notes per tenant: note `t + TENANTS * j` (`j` in `1..=PER_TENANT`)
/// belongs to tenant `t`.
const PER_TENANT: i64 = 250;
const READS: i64 = 10_000;
/// Public notes (no tenant: every scope may read them) are
/// `PUBLIC_FROM..PUBLIC_FROM + PUBLIC`.
const PUBLIC_FROM: i64 = 100_001;
const PUBLIC: i64 = 10;

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
    fn row_key(&self, row: &Row) -> Option<i64> {
        row.try_get(0).ok()
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

/// The scope every public read runs as, whichever tenant's request asks:
/// the same role with no tenant, which the policy lets see public notes
/// alone.
fn public_scope() -> Result<Scope, ScopeError> {
    Scope::builder()
        .label("public")
        .role("pgbatch_example_tenant")
        .build()
}

/// Whose note `id` is.
fn owner_of(id: i64) -> i64 {
    id % TENANTS
}

/// What `tenant` may see of note `id`: its own notes only.
fn visible(tenant: i64, id: i64) -> Option<String> {
    (owner_of(id) == tenant).then(|| format!("note {id} of tenant {tenant}"))
}

/// Public note `id`, as everyone sees it.
fn public_note(id: i64) -> String {
    format!("public note {id}")
}

/// The `i`th read: its tenant, and a note of its own (even `i`) or of
/// another tenant (odd `i`).
fn read(i: i64) -> (i64, i64) {
    let tenant = i % TENANTS;
    let owner = if i % 2 == 0 {
        tenant
    } else {
        (tenant + 1 + (i / 2) % (TENANTS - 1)) % TENANTS
    };
    let j = 1 + (i * 7_919) % PER_TENANT;
    (tenant, owner + TENANTS * j)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .ok_or("set DATABASE_URL to a scratch database (see the example's docs)")?;
    let unscoped = std::env::args().any(|a| a == "--unscoped");
    let pool = pg::pool(url.parse()?, &PoolOptions::with_max_size(8))?;
    let notes = TENANTS * (PER_TENANT + 1);
    pool.get()
        .await?
        .batch_execute(&format!(
            "DO $$ BEGIN CREATE ROLE pgbatch_example_tenant NOLOGIN;
                 EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
             GRANT pgbatch_example_tenant TO CURRENT_USER;
             DROP TABLE IF EXISTS pgbatch_example_notes;
             CREATE TABLE pgbatch_example_notes (
                 id bigint PRIMARY KEY, tenant bigint, body text NOT NULL);
             INSERT INTO pgbatch_example_notes
                 SELECT n, n % {TENANTS}, 'note ' || n || ' of tenant ' || n % {TENANTS}
                 FROM generate_series(1, {notes}) AS n;
             INSERT INTO pgbatch_example_notes
                 SELECT n, NULL, 'public note ' || n
                 FROM generate_series({PUBLIC_FROM}, {PUBLIC_FROM} + {PUBLIC} - 1) AS n;
             ALTER TABLE pgbatch_example_notes ENABLE ROW LEVEL SECURITY;
             GRANT SELECT ON pgbatch_example_notes TO pgbatch_example_tenant;
             CREATE POLICY own_or_public_notes ON pgbatch_example_notes FOR SELECT
                 TO pgbatch_example_tenant
                 USING (tenant IS NULL
                        OR tenant = nullif(current_setting('app.tenant', true), '')::bigint);"
        ))
        .await?;

    // One batcher for every tenant: a tenant's keys wait with its other
    // keys, and each load runs as its tenant.
    let builder = Batcher::builder()
        .name("notes")
        .timeout(Duration::from_secs(5))
        // The whole burst is queued at once.
        .channel_capacity(16_384);
    let notes: Batcher<i64, String, Scope> = if unscoped {
        // The mistake the check is there to catch: a loader that ignores
        // who asks.
        let plain = PgLoader::new(pool.clone(), NotesById);
        builder.build_scoped(scoped_loader_fn(move |_: Scope, keys: Vec<i64>| {
            let plain = plain.clone();
            async move { plain.load(keys).await }
        }))?
    } else {
        // Every setting the policy reads, reset in every load.
        let loader = PgLoader::new(pool.clone(), NotesById).scoped(["app.tenant"])?;
        builder.build_scoped(loader)?
    };
    // A tenant's cached note is that tenant's alone.
    let cache = Cache::builder()
        .name("notes")
        .max_capacity(50_000)
        .build_with_batcher(notes.clone())?;

    let scopes: Vec<Scope> = (0..TENANTS).map(scope_of).collect::<Result<_, _>>()?;
    let reads: Vec<_> = (0..READS)
        .map(|i| {
            let (tenant, id) = read(i);
            let (cache, scope) = (cache.clone(), scopes[tenant as usize].clone());
            tokio::spawn(async move { (tenant, id, cache.get_as(&scope, id).await) })
        })
        .collect();
    let (mut found, mut expected, mut leaks, mut missed) = (0, 0, 0, 0);
    for read in reads {
        let (tenant, id, got) = read.await?;
        let (got, want) = (got?, visible(tenant, id));
        found += u64::from(got.is_some());
        expected += u64::from(want.is_some());
        match (&got, &want) {
            (Some(_), None) => leaks += 1,
            (None, Some(_)) => missed += 1,
            (Some(g), Some(w)) if g != w => leaks += 1,
            _ => {}
        }
    }
    let loads = notes.stats().batches;
    println!(
        "scopes {TENANTS}, reads {READS}, loads {loads}, found {found} of {expected} expected, \
         leaks {leaks}"
    );

    // Public notes, asked for by every tenant's requests: as one scope,
    // so they share its loads and its one cached value per note.
    let public = public_scope()?;
    let public_reads: Vec<_> = (0..TENANTS * PUBLIC * 10)
        .map(|i| {
            let id = PUBLIC_FROM + i % PUBLIC;
            let (cache, public) = (cache.clone(), public.clone());
            tokio::spawn(async move { (id, cache.get_as(&public, id).await) })
        })
        .collect();
    let mut wrong = 0;
    for read in public_reads {
        let (id, got) = read.await?;
        wrong += u64::from(got? != Some(public_note(id)));
    }
    println!(
        "public notes: {} reads of {PUBLIC} notes from {TENANTS} tenants, {} loads, wrong {wrong}",
        TENANTS * PUBLIC * 10,
        notes.stats().batches - loads,
    );

    notes.shutdown().await;
    pool.get()
        .await?
        .batch_execute("DROP TABLE pgbatch_example_notes")
        .await?;
    if leaks > 0 {
        return Err(format!("{leaks} answers were another tenant's").into());
    }
    if wrong > 0 {
        return Err(format!("{wrong} public notes were wrong").into());
    }
    if found == 0 || missed > 0 {
        return Err(format!("found {found} of the {expected} notes the tenants may see").into());
    }
    Ok(())
}
