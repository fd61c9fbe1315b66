//! The batchers' and caches' figures through the `metrics`
//! facade (feature `metrics`), so whichever exporter the application
//! installed (Prometheus, StatsD, OpenTelemetry) reports them.
//!
//! Nothing is called here: with the feature on, every batcher and cache
//! registers its figures when it is built, labelled with its name
//! (`batcher="..."`, the builder's `name`; `cache="..."`, likewise). Install
//! the recorder before building them: the facade hands out the recorder's
//! handles at registration, and a batcher built before any recorder keeps
//! no-op ones. Counting costs one handle call per event on top of the
//! crate's own atomics; [`Batcher::stats`](crate::Batcher::stats) and
//! `Cache::stats` are unchanged.
//!
//! Give each batcher and cache its own name: unnamed ones all carry the
//! default label (`batcher="batcher"`, `cache="cache"`), so their counts
//! add up and their gauges overwrite each other.
//!
//! Names follow OpenMetrics: `snake_case`, a `_total` suffix on counters,
//! the unit last (`_seconds`).
//!
//! | name | kind | what |
//! |---|---|---|
//! | `pgbatch_batcher_requests_total` | counter | keys asked for (duplicates included) |
//! | `pgbatch_batcher_loads_total` | counter | loads started |
//! | `pgbatch_batcher_load_keys` | histogram | distinct keys per load |
//! | `pgbatch_batcher_load_duration_seconds` | histogram | a load's time |
//! | `pgbatch_batcher_queue_wait_seconds` | histogram | a request's wait from enqueue to its load's start |
//! | `pgbatch_batcher_loads_in_flight` | gauge | loads running |
//! | `pgbatch_batcher_concurrency_limit` | gauge | loads allowed at once (the automatic limit where it stands) |
//! | `pgbatch_batcher_load_duration_least_seconds` | gauge | the automatic limit's least window mean load time |
//! | `pgbatch_batcher_load_duration_recent_seconds` | gauge | the automatic limit's last window mean load time |
//! | `pgbatch_batcher_pending_keys` | gauge | keys gathered for the next load |
//! | `pgbatch_batcher_queued_requests` | gauge | requests not yet taken by the worker |
//! | `pgbatch_batcher_scopes` | gauge | scopes with keys waiting or loads running |
//! | `pgbatch_batcher_shed_total` | counter | requests refused because the queue was full |
//! | `pgbatch_batcher_timeouts_total` | counter | requests whose deadline passed |
//! | `pgbatch_batcher_abandoned_total` | counter | requests whose caller left before their load |
//! | `pgbatch_batcher_deduplicated_total` | counter | requests merged into a key already in the load |
//! | `pgbatch_batcher_joined_in_flight_total` | counter | requests joined to a running load of their key |
//! | `pgbatch_batcher_keys_found_total` | counter | keys a load returned |
//! | `pgbatch_batcher_keys_not_found_total` | counter | keys a load did not return |
//! | `pgbatch_batcher_failed_loads_total` | counter | loads that returned an error |
//! | `pgbatch_batcher_panicked_loads_total` | counter | loads whose loader panicked |
//! | `pgbatch_batcher_timed_out_loads_total` | counter | loads abandoned at `load_timeout` |
//! | `pgbatch_batcher_failed_keys_total` | counter | distinct keys of failed, panicked and timed-out loads, and keys that failed alone |
//! | `pgbatch_batcher_scope_loads_total` | counter | loads per scope, with a `scope` label (only with `BatcherBuilder::scope_stats`) |
//! | `pgbatch_batcher_scope_keys_total` | counter | distinct keys of those loads, with a `scope` label (likewise) |
//! | `pgbatch_cache_hits_total` | counter | lookups answered from the cache |
//! | `pgbatch_cache_misses_total` | counter | lookups that started a load |
//! | `pgbatch_cache_coalesced_total` | counter | lookups that joined another's load |
//! | `pgbatch_cache_fills_total` | counter | loaded values stored |
//! | `pgbatch_cache_not_admitted_total` | counter | loaded values turned away by second-miss admission |
//! | `pgbatch_cache_load_errors_total` | counter | loads that failed |
//! | `pgbatch_cache_evictions_total` | counter | entries evicted for capacity |
//! | `pgbatch_cache_expirations_total` | counter | entries expired |
//! | `pgbatch_cache_invalidations_total` | counter | `invalidate` and `invalidate_all` calls |
//!
//! The gauges are set by the batcher's worker each time it wakes, so an
//! idle batcher's gauges show its last busy moment until it wakes again.
//!
//! The two per-scope counters are the exception to registering at build:
//! a scope's name is known only at its first load, so they are reported to
//! whichever recorder is installed then (the global one, in a service).
//! The `scope` label is the scope's name, never a setting's value, and
//! takes at most `scope_stats`'s cap of values plus `other`.
//!
//! # Histograms in Prometheus
//!
//! `metrics-exporter-prometheus` renders a histogram as a summary by
//! default: quantiles the process computes over a sliding window, beside
//! a `_sum` and `_count` over its whole life, so the quantiles and the
//! mean from `_sum / _count` disagree, and summaries cannot be added up
//! across instances. Give it buckets instead, and it renders true
//! Prometheus histograms (`_bucket{le="..."}`), which `histogram_quantile`
//! reads and aggregates. The durations are in seconds, the keys per load
//! a count:
//!
//! ```
//! use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let seconds = [0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];
//! let keys = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];
//! let recorder = PrometheusBuilder::new()
//!     .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &seconds)?
//!     .set_buckets_for_metric(Matcher::Full("pgbatch_batcher_load_keys".into()), &keys)?
//!     .build_recorder();
//! let handle = recorder.handle();
//! metrics::set_global_recorder(recorder)?;
//! // Build the batchers and caches now; serve `handle.render()` at /metrics.
//! # let _ = handle.render();
//! # Ok(())
//! # }
//! ```

use ::metrics::Gauge;

/// Nanoseconds to seconds, the unit durations are reported in.
pub(crate) const SECONDS_PER_NANO: f64 = 1e-9;

/// A batcher's gauges, set by its worker.
#[derive(Debug)]
pub(crate) struct Gauges {
    pub(crate) in_flight: Gauge,
    pub(crate) limit: Gauge,
    pub(crate) load_least: Gauge,
    pub(crate) load_recent: Gauge,
    pub(crate) pending: Gauge,
    pub(crate) queued: Gauge,
    pub(crate) scopes: Gauge,
}

/// Describes each counter and hands its handle to its count, so that a
/// name is written once, beside its help text (rustfmt would spread a
/// table of such triples over five lines each).
macro_rules! export_counters {
    ($label:expr; $($count:expr => $name:literal, $what:literal;)+) => {$(
        ::metrics::describe_counter!($name, ::metrics::Unit::Count, $what);
        $count.export(::metrics::counter!($name, $label));
    )+};
}
pub(crate) use export_counters;

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::convert::Infallible;

    use ::metrics::Unit;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use metrics_util::{CompositeKey, MetricKind};

    use crate::{loader_fn, Batcher, Concurrency};

    type Reported = Vec<(
        CompositeKey,
        Option<Unit>,
        Option<::metrics::SharedString>,
        DebugValue,
    )>;

    /// The value reported for `name` with label `label`.
    fn value<'a>(
        reported: &'a Reported,
        kind: MetricKind,
        name: &str,
        label: (&str, &str),
    ) -> &'a DebugValue {
        reported
            .iter()
            .find(|(key, ..)| {
                key.kind() == kind
                    && key.key().name() == name
                    && key
                        .key()
                        .labels()
                        .any(|l| l.key() == label.0 && l.value() == label.1)
            })
            .map(|(.., value)| value)
            .unwrap_or_else(|| panic!("{name} {label:?} was not reported"))
    }

    #[tokio::test(flavor = "current_thread")]
    async fn loads_per_scope_are_reported_with_a_bounded_scope_label() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        // Set for this thread while loads run: the scope counters are
        // reported at each load, from the worker on this thread.
        let _local = ::metrics::set_default_local_recorder(&recorder);
        let batcher: Batcher<u64, u64, u32> = Batcher::builder()
            .name("notes")
            .scope_stats(1)
            .build_scoped(crate::scoped_loader_fn(
                |_: u32, keys: Vec<u64>| async move {
                    Ok::<_, Infallible>(keys.into_iter().map(|k| (k, k)).collect::<HashMap<_, _>>())
                },
            ))
            .unwrap();
        for scope in [1, 2] {
            for answer in batcher.load_many_as(&scope, [1, 2]).await {
                answer.unwrap();
            }
        }
        let reported = snapshotter.snapshot().into_vec();
        let scopes: Vec<String> = reported
            .iter()
            .filter(|(key, ..)| key.key().name() == "pgbatch_batcher_scope_keys_total")
            .flat_map(|(key, ..)| {
                key.key()
                    .labels()
                    .filter(|l| l.key() == "scope")
                    .map(|l| l.value().to_owned())
                    .collect::<Vec<_>>()
            })
            .collect();
        // Unlabelled scopes (a closure loader names none) count as `other`.
        assert_eq!(scopes, ["other"], "{reported:?}");
    }

    #[tokio::test]
    async fn a_batchers_loads_keys_and_limit_are_reported_under_its_name() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let batcher: Batcher<u64, u64> = ::metrics::with_local_recorder(&recorder, || {
            Batcher::builder()
                .name("users")
                .concurrency(Concurrency::Fixed(3))
                .build(loader_fn(|keys: Vec<u64>| async move {
                    Ok::<_, Infallible>(
                        keys.into_iter()
                            .filter(|k| k % 2 == 0)
                            .map(|k| (k, k))
                            .collect::<HashMap<_, _>>(),
                    )
                }))
                .unwrap()
        });
        let answers = batcher.load_many(0..10).await;
        assert!(answers.iter().all(Result::is_ok));
        let stats = batcher.stats();
        let reported = snapshotter.snapshot().into_vec();
        let label = ("batcher", "users");
        for (name, want) in [
            ("pgbatch_batcher_requests_total", 10),
            ("pgbatch_batcher_loads_total", stats.batches),
            ("pgbatch_batcher_keys_found_total", 5),
            ("pgbatch_batcher_keys_not_found_total", 5),
        ] {
            assert_eq!(
                value(&reported, MetricKind::Counter, name, label),
                &DebugValue::Counter(want),
                "{name}"
            );
        }
        let DebugValue::Histogram(keys) = value(
            &reported,
            MetricKind::Histogram,
            "pgbatch_batcher_load_keys",
            label,
        ) else {
            panic!("keys per load is a histogram")
        };
        assert_eq!(keys.len() as u64, stats.batches);
        assert_eq!(keys.iter().map(|k| k.into_inner()).sum::<f64>(), 10.0);
        let DebugValue::Histogram(waits) = value(
            &reported,
            MetricKind::Histogram,
            "pgbatch_batcher_queue_wait_seconds",
            label,
        ) else {
            panic!("queue wait is a histogram")
        };
        assert!(
            waits.iter().all(|w| w.into_inner() < 5.0),
            "in seconds: {waits:?}"
        );
        assert_eq!(
            value(
                &reported,
                MetricKind::Gauge,
                "pgbatch_batcher_concurrency_limit",
                label
            ),
            &DebugValue::Gauge(3.0.into())
        );
        let described = reported
            .iter()
            .find(|(key, ..)| key.key().name() == "pgbatch_batcher_load_duration_seconds")
            .expect("load durations reported");
        assert_eq!(described.1, Some(Unit::Seconds));
        let described = reported
            .iter()
            .find(|(key, ..)| key.key().name() == "pgbatch_batcher_requests_total")
            .expect("requests reported");
        assert_eq!(described.1, Some(Unit::Count));
        assert_eq!(
            described.2.as_deref(),
            Some("Keys asked for, duplicates included.")
        );
    }

    /// The module docs' advice: with buckets set, the Prometheus exporter
    /// renders the waits as a histogram whose buckets add up to its count.
    #[tokio::test]
    async fn with_buckets_the_prometheus_exporter_renders_histograms() {
        use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &[0.001, 0.01, 1.0])
            .unwrap()
            .build_recorder();
        let handle = recorder.handle();
        let batcher: Batcher<u64, u64> = ::metrics::with_local_recorder(&recorder, || {
            Batcher::builder()
                .name("users")
                .build(loader_fn(|keys: Vec<u64>| async move {
                    Ok::<_, Infallible>(keys.into_iter().map(|k| (k, k)).collect::<HashMap<_, _>>())
                }))
                .unwrap()
        });
        assert!(batcher.load_many(0..10).await.iter().all(Result::is_ok));
        let text = handle.render();
        let sample = |prefix: &str| -> f64 {
            let line = text
                .lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} in\n{text}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        let name = "pgbatch_batcher_queue_wait_seconds";
        let count = sample(&format!("{name}_count{{"));
        assert!(count >= 1.0, "{text}");
        assert_eq!(
            sample(&format!("{name}_bucket{{batcher=\"users\",le=\"+Inf\"}}")),
            count
        );
        assert!(
            !text.contains(&format!("{name}{{batcher=\"users\",quantile=")),
            "{text}"
        );
    }

    #[cfg(feature = "cache")]
    #[tokio::test]
    async fn a_caches_hits_misses_and_fills_are_reported_under_its_name() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let cache = ::metrics::with_local_recorder(&recorder, || {
            crate::cache::Cache::builder()
                .admission(crate::cache::Admission::Always)
                .name("objects")
                .build(|k: u64| async move { Ok(Some(k)) })
                .unwrap()
        });
        for k in [1, 2, 1, 1] {
            cache.get(k).await.unwrap();
        }
        cache.invalidate(&1).await;
        let reported = snapshotter.snapshot().into_vec();
        let label = ("cache", "objects");
        for (name, want) in [
            ("pgbatch_cache_hits_total", 2),
            ("pgbatch_cache_misses_total", 2),
            ("pgbatch_cache_fills_total", 2),
            ("pgbatch_cache_invalidations_total", 1),
        ] {
            assert_eq!(
                value(&reported, MetricKind::Counter, name, label),
                &DebugValue::Counter(want),
                "{name}"
            );
        }
    }
}
