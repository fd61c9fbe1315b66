//! The seed benchmark's table, `random_read_test(pk text PRIMARY KEY,
//! payload text)`: its lookup as a [`BatchQuery`], its row format, and a
//! generator of its rows for COPY (the demo seed and the load generators).

use std::convert::Infallible;
use std::ops::RangeInclusive;

use pgbatch::pg::copy::{RowSource, RowValues};
use pgbatch::pg::{BatchQuery, Params};
use tokio_postgres::types::Type;
use tokio_postgres::Row;

/// The table's name.
pub const KV_TABLE: &str = "random_read_test";

/// The columns a [`KvRows`] row fills, for COPY.
pub const KV_COLUMNS: [(&str, Type); 2] = [("pk", Type::TEXT), ("payload", Type::TEXT)];

/// The seed benchmark's key of row `n`: the number left-padded with zeros
/// to 20 characters.
pub fn kv_pk(n: u64) -> String {
    format!("{n:020}")
}

/// The seed benchmark's payload of row `n`: the number and ` - `,
/// right-padded with `*` to 33 characters.
pub fn kv_payload(n: u64) -> String {
    format!("{:*<33}", format!("{n} - "))
}

/// `random_read_test` payloads by primary key.
#[derive(Debug, Clone, Copy, Default)]
pub struct KvQuery;

impl BatchQuery for KvQuery {
    type Key = String;
    type Value = String;

    fn batch_sql(&self) -> &str {
        "SELECT pk, payload FROM random_read_test WHERE pk = ANY($1)"
    }

    fn batch_params<'a>(&self, keys: &'a [String]) -> Params<'a> {
        vec![Box::new(keys)]
    }

    fn single_sql(&self) -> &str {
        "SELECT pk, payload FROM random_read_test WHERE pk = $1"
    }

    fn single_params<'a>(&self, key: &'a String) -> Params<'a> {
        vec![Box::new(key)]
    }

    fn map_row(&self, row: &Row) -> Result<(String, String), tokio_postgres::Error> {
        Ok((row.try_get(0)?, row.try_get(1)?))
    }
}

/// `random_read_test` rows in [`KV_COLUMNS`] order, numbered in key order.
#[derive(Debug, Clone)]
pub struct KvRows(RangeInclusive<u64>);

impl KvRows {
    /// The rows numbered `numbers` (from 1 in a full table).
    pub fn new(numbers: RangeInclusive<u64>) -> Self {
        Self(numbers)
    }
}

impl RowSource for KvRows {
    type Error = Infallible;

    async fn next_row(&mut self) -> Result<Option<RowValues>, Infallible> {
        Ok(self
            .0
            .next()
            .map(|n| -> RowValues { vec![Box::new(kv_pk(n)), Box::new(kv_payload(n))] }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_follow_the_seed_benchmark_format() {
        assert_eq!(kv_pk(42), "00000000000000000042");
        assert_eq!(kv_payload(42), "42 - ****************************");
        assert_eq!(kv_payload(42).len(), 33);
    }
}
