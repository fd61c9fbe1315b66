//! What is read on each scrape: the batchers', caches' and pool's state,
//! the listener's coherence and the replicas'.

use pgbatch::pg::Pool;
use pgbatch::stats::HistogramSnapshot;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use crate::cluster::coherence::Coherence;
use crate::cluster::replicas::{ReadRouter, ReplicaStatus};
use crate::domain::auth::Authenticator;
use crate::domain::reads::Reads;
use crate::domain::writes::Writes;

/// Reads one counter or gauge out of a batcher's snapshot.
type Field = fn(&pgbatch::StatsSnapshot) -> u64;
/// Reads one figure only the automatic limit has out of a batcher's
/// snapshot.
type LoadTime = fn(&pgbatch::StatsSnapshot) -> Option<std::time::Duration>;
/// Reads one counter out of a cache's snapshot.
type CacheField = fn(&pgbatch::cache::CacheStats) -> u64;
/// Reads one histogram out of a batcher's snapshot.
type HistogramField = fn(&pgbatch::StatsSnapshot) -> &HistogramSnapshot;
/// Name, help, unit, the factor from the snapshot's unit to the metric's,
/// and the field.
type HistogramSpec = (
    &'static str,
    &'static str,
    Option<&'static Unit>,
    f64,
    HistogramField,
);

/// Reads the batchers', caches' and pool's state on each scrape.
#[derive(Debug)]
pub(super) struct ServiceCollector {
    pub(super) reads: Reads,
    pub(super) writes: Writes,
    pub(super) auth: Authenticator,
    pub(super) pool: Pool,
    pub(super) coherence: Coherence,
    pub(super) router: ReadRouter,
}

impl Collector for ServiceCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        encode_pool(&mut encoder, &self.pool)?;
        let mut batchers = self.reads.batcher_stats();
        batchers.push(("object_write", self.writes.batcher_stats()));
        encode_batcher_counters(&mut encoder, &batchers)?;
        encode_batcher_gauges(&mut encoder, &batchers)?;
        encode_batcher_histograms(&mut encoder, &batchers)?;
        let mut caches = self.reads.cache_stats();
        // The token cache's hits count the memo's in front of it.
        for (name, stats) in &mut caches {
            if *name == "auth" {
                stats.hits += self.auth.memo_hits();
            }
        }
        encode_caches(&mut encoder, &caches)?;
        encode_coherence(&mut encoder, &self.coherence)?;
        encode_replicas(&mut encoder, &self.router)
    }
}

fn encode_replicas(
    encoder: &mut DescriptorEncoder<'_>,
    router: &ReadRouter,
) -> Result<(), std::fmt::Error> {
    let primary = ConstCounter::new(router.primary_reads());
    primary.encode(encoder.encode_descriptor(
        "primary_reads",
        "Reads (batches, single lookups, token lookups) sent to the primary",
        None,
        primary.metric_type(),
    )?)?;
    let mut family = encoder.encode_descriptor(
        "replica_fallbacks",
        "Reads sent to the primary although replicas are configured, by reason",
        None,
        MetricType::Counter,
    )?;
    for (why, count) in router.fallbacks() {
        let labels = [("reason", why.label())];
        ConstCounter::new(count).encode(family.encode_family(&labels)?)?;
    }
    let replicas = router.replicas();
    let counters: [(&str, &str, ReplicaField); 2] = [
        ("replica_reads", "Reads a replica answered", |r| r.reads),
        (
            "replica_failures",
            "Reads a replica failed (run again on the primary) and polls it missed",
            |r| r.failures,
        ),
    ];
    for (name, help, value) in counters {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for replica in &replicas {
            let labels = [("replica", replica.name.as_str())];
            ConstCounter::new(value(replica)).encode(family.encode_family(&labels)?)?;
        }
    }
    let mut family = encoder.encode_descriptor(
        "replica_usable",
        "1 while reads may go to the replica: it answers, replays and keeps within the lag bound",
        None,
        MetricType::Gauge,
    )?;
    for replica in &replicas {
        let labels = [("replica", replica.name.as_str())];
        ConstGauge::new(i64::from(replica.usable)).encode(family.encode_family(&labels)?)?;
    }
    let mut family = encoder.encode_descriptor(
        "replica_lag",
        "How old the replica's data was at its last poll",
        Some(&Unit::Seconds),
        MetricType::Gauge,
    )?;
    for replica in &replicas {
        let labels = [("replica", replica.name.as_str())];
        ConstGauge::new(replica.lag.as_secs_f64()).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn encode_coherence(
    encoder: &mut DescriptorEncoder<'_>,
    coherence: &Coherence,
) -> Result<(), std::fmt::Error> {
    let up = ConstGauge::new(i64::from(coherence.caches_usable()));
    up.encode(encoder.encode_descriptor(
        "cache_coherent",
        "1 while the caches may be used: the invalidation listener is up (or none runs)",
        None,
        up.metric_type(),
    )?)?;
    for (name, help, value) in [
        (
            "cache_invalidations_received",
            "Invalidation notifications applied",
            coherence.received(),
        ),
        (
            "cache_invalidation_listens",
            "Times the invalidation listener connected and LISTENed (each after a flush)",
            coherence.connects(),
        ),
        (
            "cache_invalidations_unreadable",
            "Invalidation notifications that could not be read (each flushed every cache)",
            coherence.unreadable(),
        ),
        (
            "cache_invalidation_listener_failures",
            "Times the invalidation listener failed; the caches are bypassed until it is back",
            coherence.failures(),
        ),
    ] {
        let counter = ConstCounter::new(value);
        counter.encode(encoder.encode_descriptor(name, help, None, counter.metric_type())?)?;
    }
    Ok(())
}

/// One counter of a replica's status.
type ReplicaField = fn(&ReplicaStatus) -> u64;

/// Statistics by batcher name.
type Batchers = [(&'static str, pgbatch::StatsSnapshot)];
/// Statistics by cache name.
type NamedCacheStats = [(&'static str, pgbatch::cache::CacheStats)];

fn encode_pool(encoder: &mut DescriptorEncoder<'_>, pool: &Pool) -> Result<(), std::fmt::Error> {
    let status = pool.status();
    for (name, help, value) in [
        (
            "db_pool_max_size",
            "Most connections the pool may hold",
            status.max_size,
        ),
        (
            "db_pool_size",
            "Connections the pool holds now",
            status.size,
        ),
        (
            "db_pool_available",
            "Idle connections in the pool",
            status.available,
        ),
        (
            "db_pool_waiting",
            "Callers waiting for a connection",
            status.waiting,
        ),
    ] {
        let gauge = ConstGauge::new(value as i64);
        gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
    }
    Ok(())
}

fn encode_batcher_counters(
    encoder: &mut DescriptorEncoder<'_>,
    batchers: &Batchers,
) -> Result<(), std::fmt::Error> {
    let counters: [(&str, &str, Field); 8] = [
        ("batcher_requests", "Lookups received", |s| s.requests),
        ("batcher_batches", "Batched statements run", |s| s.batches),
        (
            "batcher_deduplicated",
            "Lookups merged into a key already in the batch",
            |s| s.deduplicated,
        ),
        (
            "batcher_abandoned",
            "Lookups dropped by their caller before dispatch",
            |s| s.abandoned,
        ),
        (
            "batcher_overloaded",
            "Lookups rejected because the queue was full",
            |s| s.overloaded,
        ),
        ("batcher_timed_out", "Lookups whose deadline passed", |s| {
            s.timed_out
        }),
        (
            "batcher_failed_batches",
            "Batched statements that failed",
            |s| s.failed_batches + s.panicked_batches + s.timed_out_batches,
        ),
        ("batcher_not_found", "Keys looked up and not found", |s| {
            s.not_found
        }),
    ];
    for (name, help, value) in counters {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (batcher, stats) in batchers {
            let labels = [("batcher", *batcher)];
            ConstCounter::new(value(stats)).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

fn encode_batcher_gauges(
    encoder: &mut DescriptorEncoder<'_>,
    batchers: &Batchers,
) -> Result<(), std::fmt::Error> {
    let gauges: [(&str, &str, Field); 4] = [
        ("batcher_queued", "Lookups waiting in the queue", |s| {
            s.queued
        }),
        (
            "batcher_pending_keys",
            "Keys waiting for the next batch",
            |s| s.pending_keys,
        ),
        (
            "batcher_in_flight_batches",
            "Batched statements running",
            |s| s.in_flight_batches,
        ),
        (
            "batcher_concurrency_limit",
            "Batched statements allowed at once: the automatic limit's current value, or the fixed one",
            |s| s.concurrency_limit,
        ),
    ];
    for (name, help, value) in gauges {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (batcher, stats) in batchers {
            let labels = [("batcher", *batcher)];
            ConstGauge::new(value(stats) as i64).encode(family.encode_family(&labels)?)?;
        }
    }
    // What the automatic limit sees: a recent load time well above the
    // least one, with no more keys per second, is loads queueing in the
    // database. Only batchers under the automatic limit have them.
    let load_times: [(&str, &str, LoadTime); 2] = [
        (
            "batcher_load_duration_least",
            "The automatic limit's least mean load time of a measurement window since the world last changed",
            |s| s.load_time_least,
        ),
        (
            "batcher_load_duration_recent",
            "The automatic limit's last measurement window's mean load time",
            |s| s.load_time_recent,
        ),
    ];
    for (name, help, value) in load_times {
        let mut family =
            encoder.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Gauge)?;
        for (batcher, stats) in batchers {
            if let Some(d) = value(stats) {
                let labels = [("batcher", *batcher)];
                ConstGauge::new(d.as_secs_f64()).encode(family.encode_family(&labels)?)?;
            }
        }
    }
    Ok(())
}

fn encode_batcher_histograms(
    encoder: &mut DescriptorEncoder<'_>,
    batchers: &Batchers,
) -> Result<(), std::fmt::Error> {
    let histograms: [HistogramSpec; 3] = [
        (
            "batcher_batch_size",
            "Distinct keys per batched statement",
            None,
            1.0,
            |s| &s.batch_size,
        ),
        (
            "batcher_queue_wait",
            "Time from lookup to dispatch",
            Some(&Unit::Seconds),
            1e-9,
            |s| &s.queue_wait,
        ),
        (
            "batcher_load_duration",
            "Time a batched statement took",
            Some(&Unit::Seconds),
            1e-9,
            |s| &s.load_duration,
        ),
    ];
    for (name, help, unit, scale, hist) in histograms {
        let mut family = encoder.encode_descriptor(name, help, unit, MetricType::Histogram)?;
        for (batcher, stats) in batchers {
            let h = hist(stats);
            let buckets: Vec<(f64, u64)> = h
                .buckets
                .iter()
                .map(|&(bound, n)| {
                    let bound = if bound == u64::MAX {
                        f64::INFINITY
                    } else {
                        bound as f64 * scale
                    };
                    (bound, n)
                })
                .collect();
            let labels = [("batcher", *batcher)];
            family
                .encode_family(&labels)?
                .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                    h.sum as f64 * scale,
                    h.count,
                    &buckets,
                    None,
                )?;
        }
    }
    Ok(())
}

fn encode_caches(
    encoder: &mut DescriptorEncoder<'_>,
    caches: &NamedCacheStats,
) -> Result<(), std::fmt::Error> {
    let counters: [(&str, &str, CacheField); 8] = [
        ("cache_hits", "Lookups answered from the cache", |s| s.hits),
        ("cache_misses", "Lookups that started a load", |s| s.misses),
        (
            "cache_coalesced",
            "Lookups that waited for another lookup's load",
            |s| s.coalesced,
        ),
        ("cache_load_errors", "Loads that failed (not cached)", |s| {
            s.load_errors
        }),
        (
            "cache_not_admitted",
            "Loaded values not stored: their key's first miss (--cache-admission second-miss)",
            |s| s.not_admitted,
        ),
        (
            "cache_evictions",
            "Entries evicted to stay within capacity",
            |s| s.evictions,
        ),
        ("cache_expirations", "Entries that expired", |s| {
            s.expirations
        }),
        (
            "cache_invalidations",
            "Entries removed by invalidation",
            |s| s.invalidations,
        ),
    ];
    for (name, help, value) in counters {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (cache, stats) in caches {
            let labels = [("cache", *cache)];
            ConstCounter::new(value(stats)).encode(family.encode_family(&labels)?)?;
        }
    }
    let mut family =
        encoder.encode_descriptor("cache_entries", "Entries held", None, MetricType::Gauge)?;
    for (cache, stats) in caches {
        let labels = [("cache", *cache)];
        ConstGauge::new(stats.entries as i64).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}
