//! The batcher over an in-memory "table": 1,000 concurrent single-key
//! lookups become a handful of batched loads.
//!
//! ```sh
//! cargo run -p pgbatch --example in_memory
//! ```

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use pgbatch::{loader_fn, Batcher, Error};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let table: Arc<HashMap<u64, String>> = Arc::new(
        (0..10_000u64)
            .filter(|id| id % 7 != 0) // some keys are missing
            .map(|id| (id, format!("user {id}")))
            .collect(),
    );

    // The loader gets distinct keys and returns the rows it found; a key it
    // leaves out is "not found". In a real service this is one
    // `SELECT ... WHERE id = ANY($1)`.
    let loader = loader_fn(move |ids: Vec<u64>| {
        let table = Arc::clone(&table);
        async move {
            // Stand-in for a round trip, so that keys pile up meanwhile.
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok::<_, Infallible>(
                ids.into_iter()
                    .filter_map(|id| table.get(&id).map(|row| (id, row.clone())))
                    .collect::<HashMap<_, _>>(),
            )
        }
    });
    let users: Batcher<u64, String> = Batcher::builder()
        .name("users")
        .max_batch_size(128)
        .timeout(Duration::from_secs(1))
        .build(loader)?;

    // Each task asks for one key, as a request handler would.
    let tasks: Vec<_> = (0..1_000u64)
        .map(|id| {
            let users = users.clone();
            tokio::spawn(async move { users.load(id).await })
        })
        .collect();
    let (mut found, mut missing) = (0, 0);
    for task in tasks {
        match task.await? {
            Ok(Some(_)) => found += 1,
            Ok(None) => missing += 1,
            Err(Error::Overloaded) => eprintln!("queue full: shed the request"),
            Err(e) => return Err(e.into()),
        }
    }

    let stats = users.stats();
    println!(
        "{found} found, {missing} missing: {} requests in {} loads (mean batch {:.1} keys)",
        stats.requests,
        stats.batches,
        stats.batch_size.mean().unwrap_or(0.0),
    );
    users.shutdown().await;
    Ok(())
}
