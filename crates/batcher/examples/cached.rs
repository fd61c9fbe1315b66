//! The coalescing TTL cache in front of a batcher: hits cost no load,
//! concurrent misses for different keys share a batch, and concurrent
//! misses for one key share one load.
//!
//! ```sh
//! cargo run -p pgbatch --features cache --example cached
//! ```

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pgbatch::cache::Cache;
use pgbatch::{loader_fn, Batcher};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let loads = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&loads);
    let rows: Batcher<u64, String> = Batcher::new(loader_fn(move |ids: Vec<u64>| {
        counted.fetch_add(1, Ordering::Relaxed);
        async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok::<_, Infallible>(
                ids.into_iter()
                    .filter(|id| *id != 404)
                    .map(|id| (id, format!("row {id}")))
                    .collect::<HashMap<_, _>>(),
            )
        }
    }));
    let cache = Cache::builder()
        .name("rows")
        .max_capacity(100_000)
        .time_to_live(Duration::from_secs(20))
        .jitter(Duration::from_secs(3)) // entries loaded together expire apart
        .negative_ttl(Duration::from_secs(1)) // "not found" is remembered briefly
        .build_with_batcher(rows)?;

    // 100 concurrent callers for 10 keys: misses coalesce.
    let gets: Vec<_> = (0..100u64)
        .map(|i| {
            let cache = cache.clone();
            tokio::spawn(async move { cache.get(i % 10).await })
        })
        .collect();
    for get in gets {
        assert!(get.await??.is_some());
    }
    let first_misses = loads.load(Ordering::Relaxed);

    // The cache stores a key's value from its second miss on (its default
    // admission), so keys read once never crowd out the others: a key read
    // again is loaded once more, and stored. Read together, the 10 go out
    // in one load.
    for (i, row) in cache.get_many(0..10u64).await.into_iter().enumerate() {
        assert_eq!(row?, Some(format!("row {i}")));
    }
    let after_misses = loads.load(Ordering::Relaxed);

    // Hits: no load at all.
    for i in 0..10u64 {
        assert_eq!(cache.get(i).await?, Some(format!("row {i}")));
    }
    assert_eq!(loads.load(Ordering::Relaxed), after_misses);
    assert_eq!(cache.get(404).await?, None);

    // After a write to key 3, invalidate: the next get loads afresh (and
    // stores at once: the key was seen before), and no load that started
    // before the invalidation can put the old value back.
    cache.invalidate(&3).await;
    assert_eq!(cache.get(3).await?, Some("row 3".to_owned()));
    let reloaded = loads.load(Ordering::Relaxed);
    assert_eq!(cache.get(3).await?, Some("row 3".to_owned()));
    assert_eq!(loads.load(Ordering::Relaxed), reloaded);

    // moka counts entries lazily; bring the count up to date to show it.
    cache.run_pending_tasks().await;
    println!(
        "{first_misses} loads for 100 misses of 10 keys, {} more to store them; {:?}",
        after_misses - first_misses,
        cache.stats()
    );
    Ok(())
}
