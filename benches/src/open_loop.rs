//! Requests at a fixed arrival rate (an open loop), each request's latency
//! measured from when it was meant to start: a request held up by a slow
//! one before it, or by the generator, counts that wait, so coordinated
//! omission is corrected (as wrk2 does).
//!
//! The generator is a thread of its own that wakes every 200 µs (`TICK`)
//! and hands the requests due by then to the runtime. tokio's timer wakes at
//! millisecond granularity, which would release every millisecond's
//! requests in one burst and add up to a millisecond to each measurement;
//! waking for each request instead (every 12 µs at 80,000 a second) cost
//! the client so much CPU, on cores it shares with Postgres, that the
//! contenders fell behind at three quarters of their closed-loop capacity.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::KeyStream;

/// Requests in flight at most: past it the contender is past its capacity
/// (at 90% of it, a few hundred are in flight), and the run stops issuing
/// rather than queue without bound.
const MAX_IN_FLIGHT: u64 = 50_000;
/// How often the generator wakes: a request starts up to this late (and
/// counts the delay).
const TICK: Duration = Duration::from_micros(200);
/// A request not answered within this counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What an open-loop run measured over its measured window.
#[derive(Debug)]
pub struct OpenLoopReport {
    /// Requests meant to start in the window.
    pub offered: u64,
    /// Of those, answered.
    pub completed: u64,
    /// Of those, failed or timed out.
    pub failed: u64,
    /// The window's length.
    pub window: Duration,
    /// Latency of the answered requests from their intended start, in
    /// nanoseconds.
    pub latency: Histogram<u64>,
    /// In flight reached 50,000 requests: the rate was past what the
    /// contender serves, and the run stopped early.
    pub fell_behind: bool,
}

impl OpenLoopReport {
    /// Answered requests per second of the window.
    pub fn per_sec(&self) -> f64 {
        self.completed as f64 / self.window.as_secs_f64()
    }

    /// The `q`-quantile (`0.0..=1.0`) of latency, in milliseconds.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        self.latency.value_at_quantile(q) as f64 / 1e6
    }
}

#[derive(Debug)]
struct Shared {
    latency: Mutex<Histogram<u64>>,
    in_flight: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
}

/// Calls `request(key)` `rate` times a second, keys uniformly random in
/// `0..key_range`, for `warmup` (not recorded) and then `window`, on the
/// current tokio runtime; `request` resolves to whether the read
/// succeeded. Returns once every request of the window was answered or
/// timed out.
///
/// # Panics
///
/// Outside a tokio runtime, or when `rate` is not positive.
pub async fn open_loop<F, Fut>(
    rate: f64,
    warmup: Duration,
    window: Duration,
    key_range: u64,
    request: F,
) -> OpenLoopReport
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send + 'static,
{
    assert!(rate > 0.0, "an open loop needs a positive rate");
    let shared = Arc::new(Shared {
        latency: Mutex::new(
            Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds"),
        ),
        in_flight: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        failed: AtomicU64::new(0),
    });
    let fell_behind = Arc::new(AtomicBool::new(false));
    let handle = tokio::runtime::Handle::current();
    let request = Arc::new(request);
    let generator = {
        let (shared, fell_behind) = (Arc::clone(&shared), Arc::clone(&fell_behind));
        std::thread::spawn(move || {
            let start = Instant::now();
            let (measure_from, stop) = (start + warmup, start + warmup + window);
            let every = Duration::from_secs_f64(1.0 / rate);
            let mut keys = KeyStream::new(rate.to_bits());
            let mut offered = 0u64;
            for i in 0u32.. {
                let intended = start + every * i;
                if intended >= stop {
                    break;
                }
                let now = Instant::now();
                if intended > now {
                    std::thread::sleep((intended - now).max(TICK));
                }
                if shared.in_flight.load(Relaxed) >= MAX_IN_FLIGHT {
                    fell_behind.store(true, Relaxed);
                    break;
                }
                let measured = intended >= measure_from;
                offered += u64::from(measured);
                shared.in_flight.fetch_add(1, Relaxed);
                let (shared, request) = (Arc::clone(&shared), Arc::clone(&request));
                let key = keys.next_below(key_range);
                handle.spawn(async move {
                    let ok = tokio::time::timeout(REQUEST_TIMEOUT, request(key))
                        .await
                        .unwrap_or(false);
                    if measured {
                        if ok {
                            let ns =
                                u64::try_from(intended.elapsed().as_nanos()).unwrap_or(u64::MAX);
                            shared
                                .latency
                                .lock()
                                .expect("no recorder panics")
                                .saturating_record(ns);
                            shared.completed.fetch_add(1, Relaxed);
                        } else {
                            shared.failed.fetch_add(1, Relaxed);
                        }
                    }
                    shared.in_flight.fetch_sub(1, Relaxed);
                });
            }
            offered
        })
    };
    let offered = tokio::task::spawn_blocking(move || generator.join())
        .await
        .expect("the generator's waiter")
        .expect("the generator thread");
    // Every request is bounded by REQUEST_TIMEOUT.
    while shared.in_flight.load(Relaxed) > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let latency = std::mem::replace(
        &mut *shared.latency.lock().expect("no recorder panics"),
        Histogram::new(3).expect("valid histogram"),
    );
    OpenLoopReport {
        offered,
        completed: shared.completed.load(Relaxed),
        failed: shared.failed.load(Relaxed),
        window,
        latency,
        fell_behind: fell_behind.load(Relaxed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_request_counts_from_its_intended_start() {
        // 1,000 requests a second for 300 ms; each waits for a lock that
        // the first holds for 100 ms. A closed loop would record one slow
        // request; here every request queued behind it counts its wait.
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        let first = Arc::new(AtomicBool::new(true));
        let report = open_loop(
            1_000.0,
            Duration::ZERO,
            Duration::from_millis(300),
            100,
            move |_| {
                let (gate, first) = (Arc::clone(&gate), Arc::clone(&first));
                async move {
                    let _held = gate.lock().await;
                    if first.swap(false, Relaxed) {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    true
                }
            },
        )
        .await;
        assert_eq!(report.failed, 0);
        assert!(!report.fell_behind);
        assert!(
            (290..=300).contains(&report.offered) && report.completed == report.offered,
            "{report:?}"
        );
        // A third of the requests were meant to start during the stall
        // and waited out the rest of it, 0 to 100 ms: the p90 is about
        // 70 ms. The rest were answered at once.
        assert!(
            report.quantile_ms(0.9) > 50.0,
            "p90 {}",
            report.quantile_ms(0.9)
        );
        assert!(
            report.quantile_ms(0.5) < 20.0,
            "p50 {}",
            report.quantile_ms(0.5)
        );
    }
}
