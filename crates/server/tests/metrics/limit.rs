//! The automatic limit is visible where operators look: a scrape of
//! the server's `/metrics` carries the limit, the least and the recent load
//! time, and the keys per load of the batcher behind the stat route (under
//! the server's names, which have no `pgbatch_` prefix).

use std::time::{Duration, Instant};

use crate::support::{self, get, read_path, send, setup, stat_uri, SEEDED};
use axum::http::StatusCode;
use server::db::seed::object_path;
use server::settings::ReadPath;

/// The value of the sample `name` (name and labels as exported), if the
/// scrape has it.
fn sample(text: &str, name: &str) -> Option<f64> {
    support::metric_text(text, name).map(|v| v.parse().expect("a number"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_automatic_limit_and_its_load_times_are_scraped() {
    let app = setup(&read_path(ReadPath::Batched)).await;
    let least = r#"batcher_load_duration_least_seconds{batcher="object_stat"}"#;
    let recent = r#"batcher_load_duration_recent_seconds{batcher="object_stat"}"#;
    // The load times appear once the limit has scored a measurement
    // window (at least 50 ms and 64 loads): concurrent reads until then,
    // for at most 30 s.
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let readers: Vec<_> = (0..16u64)
            .map(|r| {
                let router = app.router.clone();
                tokio::spawn(async move {
                    for i in 0..50u64 {
                        let path = object_path((r * 50 + i) % SEEDED + 1);
                        let (status, body) = send(&router, get(&stat_uri("demo", &path))).await;
                        assert_eq!(status, StatusCode::OK, "{body}");
                    }
                })
            })
            .collect();
        for r in readers {
            r.await.expect("reader");
        }
        let text = support::metrics_text(&app.router).await;
        if sample(&text, least).is_some() || Instant::now() > deadline {
            break text;
        }
    };
    let least = sample(&text, least).unwrap_or_else(|| panic!("no {least} in 30 s:\n{text}"));
    let recent = sample(&text, recent).unwrap_or_else(|| panic!("no {recent}:\n{text}"));
    // A load of a few keys from a local database: well under a second,
    // never zero; the least is the least of what the recent ones were.
    assert!(least > 0.0 && least < 1.0, "least load time {least} s");
    assert!(
        recent >= least && recent < 1.0,
        "recent {recent} s, least {least} s"
    );
    let limit = r#"batcher_concurrency_limit{batcher="object_stat"}"#;
    let limit = sample(&text, limit).unwrap_or_else(|| panic!("no {limit}:\n{text}"));
    assert!((1.0..=64.0).contains(&limit), "limit {limit}");
    // Keys per load: as many keys as requests were loaded, in fewer loads.
    let keys = r#"batcher_batch_size_sum{batcher="object_stat"}"#;
    let loads = r#"batcher_batch_size_count{batcher="object_stat"}"#;
    let (keys, loads) = (
        sample(&text, keys).unwrap_or_else(|| panic!("no {keys}:\n{text}")),
        sample(&text, loads).unwrap_or_else(|| panic!("no {loads}:\n{text}")),
    );
    assert!(
        loads >= 64.0 && keys >= loads,
        "{keys} keys in {loads} loads"
    );
}
