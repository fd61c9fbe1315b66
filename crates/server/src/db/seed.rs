//! Demo data, bulk-loaded with binary COPY.
//!
//! Each table is loaded in one transaction on one connection: an
//! interrupted seed leaves the table empty, not half full. Objects and
//! `random_read_test` rows load in parallel on two connections, so both
//! cores work. A table that already has rows is left alone.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use pgbatch::pg::copy::{self, RowSource, RowValues};
use tokio_postgres::types::Type;
use tokio_postgres::Transaction;

use crate::db::Postgres;

use crate::db::queries::kv::{KvRows, KV_COLUMNS, KV_TABLE};
use crate::db::queries::objects::{ObjectRow, OBJECT_COLUMNS, OBJECT_TABLE};
use crate::db::queries::repositories;
use crate::db::queries::system::take_if_empty;

/// The repository the demo objects live in.
pub const DEMO_REPOSITORY: &str = "demo";
/// Where the demo repository's data lives.
const DEMO_NAMESPACE: &str = "s3://pgbatch-demo/";

/// What one table's seeding did.
#[derive(Debug, Clone, Copy)]
pub struct TableReport {
    /// Rows written (0 when the table already had rows).
    pub rows: u64,
    /// Time taken.
    pub elapsed: Duration,
    /// Whether the table was skipped because it had rows.
    pub skipped: bool,
}

impl TableReport {
    /// Rows per second.
    pub fn rows_per_sec(&self) -> f64 {
        self.rows as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// What a seed run did.
#[derive(Debug, Clone, Copy)]
pub struct SeedReport {
    /// The demo objects.
    pub objects: TableReport,
    /// The `random_read_test` rows.
    pub kv: TableReport,
    /// Wall time of the whole run.
    pub elapsed: Duration,
}

impl SeedReport {
    /// Rows per second over both tables.
    pub fn rows_per_sec(&self) -> f64 {
        (self.objects.rows + self.kv.rows) as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// The path of demo object `n`.
pub fn object_path(n: u64) -> String {
    format!("datasets/{:03}/part-{n:08}.parquet", n % 997)
}

/// The numbers `1..=rows` ordered by their [`object_path`], so COPY appends
/// to the end of the primary-key index instead of inserting all over it.
fn object_numbers_in_path_order(rows: u64) -> impl Iterator<Item = u64> {
    // Paths sort by directory (n % 997), then by n.
    (0..997).flat_map(move |dir| {
        let first = if dir == 0 { 997 } else { dir };
        (first..=rows).step_by(997)
    })
}

/// splitmix64, for deterministic fake addresses, checksums and sizes.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Loads `objects` demo objects (numbered from 1, in repository `demo`)
/// and `kv_rows` `random_read_test` rows into the tables that are empty.
///
/// # Errors
///
/// When the database fails; the table being loaded is then left empty.
pub async fn seed(
    target: impl Into<Postgres>,
    objects: u64,
    kv_rows: u64,
) -> anyhow::Result<SeedReport> {
    let target = target.into();
    let config = &target;
    let bars = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
    let start = Instant::now();
    let (objects, kv) = tokio::try_join!(
        seed_objects(config, &bars, objects),
        seed_kv(config, &bars, kv_rows),
    )?;
    Ok(SeedReport {
        objects,
        kv,
        elapsed: start.elapsed(),
    })
}

/// The demo objects, in repository `demo` (created if missing).
async fn seed_objects(
    config: &Postgres,
    bars: &MultiProgress,
    rows: u64,
) -> anyhow::Result<TableReport> {
    load_if_empty(config, bars, OBJECT_TABLE.table, rows, async |tx, bar| {
        repositories::insert(tx, DEMO_REPOSITORY, DEMO_NAMESPACE).await?;
        let source = ObjectRows {
            numbers: object_numbers_in_path_order(rows),
            metadata: (0..16)
                .map(|shard| serde_json::json!({ "source": "seed", "shard": shard.to_string() }))
                .collect(),
        };
        copy_frozen(tx, OBJECT_TABLE.table, &OBJECT_COLUMNS, source, bar).await
    })
    .await
}

/// The seed benchmark's rows `1..=rows`.
async fn seed_kv(
    config: &Postgres,
    bars: &MultiProgress,
    rows: u64,
) -> anyhow::Result<TableReport> {
    load_if_empty(config, bars, KV_TABLE, rows, async |tx, bar| {
        copy_frozen(tx, KV_TABLE, &KV_COLUMNS, KvRows::new(1..=rows), bar).await
    })
    .await
}

/// Runs `load` in one transaction on a connection of its own, holding an
/// exclusive lock on `table`, if `rows > 0` and the table is empty. An
/// error rolls the transaction back, leaving the table empty.
async fn load_if_empty(
    config: &Postgres,
    bars: &MultiProgress,
    table: &'static str,
    rows: u64,
    load: impl AsyncFnOnce(&Transaction<'_>, &ProgressBar) -> anyhow::Result<()>,
) -> anyhow::Result<TableReport> {
    let start = Instant::now();
    let skipped = |skipped| TableReport {
        rows: 0,
        elapsed: start.elapsed(),
        skipped,
    };
    if rows == 0 {
        return Ok(skipped(false));
    }
    let mut client = config.connect().await.context("seed: connect")?;
    let tx = client.transaction().await?;
    if !take_if_empty(&tx, table).await? {
        tracing::info!(table, "table already has rows; not seeding it");
        return Ok(skipped(true));
    }
    let bar = bars.add(ProgressBar::new(rows));
    bar.set_style(
        ProgressStyle::with_template("{prefix:>16} [{bar:40}] {pos}/{len} rows, {rate}, eta {eta}")
            .expect("valid template")
            // indicatif's own {per_sec} prints four decimals of rows per second.
            .with_key(
                "rate",
                |state: &ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = write!(w, "{:.0} rows/s", state.per_sec()); // a full line is only cosmetic
                },
            )
            .progress_chars("=> "),
    );
    bar.set_prefix(table);
    load(&tx, &bar).await?;
    tx.commit().await.context("seed: commit")?;
    bar.finish();
    Ok(TableReport {
        rows,
        elapsed: start.elapsed(),
        skipped: false,
    })
}

/// Streams generated rows into `table` with the same binary COPY code
/// the import uses, with FREEZE (the table was truncated in this
/// transaction).
async fn copy_frozen<S: RowSource<Error = Infallible>>(
    tx: &Transaction<'_>,
    table: &str,
    columns: &[(&str, Type)],
    rows: S,
    bar: &ProgressBar,
) -> anyhow::Result<()> {
    copy::copy_rows(tx, table, columns, rows, true, |n| bar.set_position(n))
        .await
        .with_context(|| format!("seed: COPY into {table}"))?;
    Ok(())
}

/// Demo objects `1..=rows`, in path order.
struct ObjectRows<I> {
    numbers: I,
    /// A few shared metadata documents rather than one per row.
    metadata: Vec<serde_json::Value>,
}

impl<I: Iterator<Item = u64> + Send> RowSource for ObjectRows<I> {
    type Error = Infallible;

    async fn next_row(&mut self) -> Result<Option<RowValues>, Infallible> {
        let Some(n) = self.numbers.next() else {
            return Ok(None);
        };
        let h = mix(n);
        let row = ObjectRow {
            repository: DEMO_REPOSITORY.to_owned(),
            path: object_path(n),
            physical_address: format!("s3://pgbatch-demo/data/{h:016x}"),
            size_bytes: (h % (64 << 20)) as i64,
            checksum: format!("{h:016x}{:016x}", mix(h)),
            content_type: "application/vnd.apache.parquet".to_owned(),
            metadata: self.metadata[(n % 16) as usize].clone(),
            mtime: None,
        };
        Ok(Some(row.into_values()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_generated_in_path_order_and_all_present() {
        for rows in [0, 1, 996, 997, 998, 5_000] {
            let numbers: Vec<u64> = object_numbers_in_path_order(rows).collect();
            let mut sorted = numbers.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (1..=rows).collect::<Vec<_>>(), "rows={rows}");
            let paths: Vec<String> = numbers.iter().map(|&n| object_path(n)).collect();
            assert!(paths.windows(2).all(|w| w[0] < w[1]), "rows={rows}");
        }
    }

    #[test]
    fn objects_have_the_documented_paths() {
        assert_eq!(object_path(1), "datasets/001/part-00000001.parquet");
    }
}
