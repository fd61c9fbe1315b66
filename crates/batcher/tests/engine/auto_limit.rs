//! The automatic concurrency limit (`Concurrency::Auto`) against a modelled
//! database whose latency each test controls, on virtual time: it grows
//! under load, shrinks when latency rises with concurrency, never exceeds
//! its bound, and recovers after a stall.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pgbatch::{Batcher, Concurrency, Loaded, Loader};
use tokio::time::Instant;

/// How the modelled database answers, changeable mid-test.
#[derive(Debug, Clone, Copy)]
struct World {
    /// Time every load takes regardless of work (a network round trip).
    round_trip: Duration,
    /// Work per load and per key. Beyond `cores` loads at once they share
    /// the cores and get in each other's way (locks, switches): a load
    /// takes `(running / cores)²` times as long.
    per_load: Duration,
    per_key: Duration,
    cores: usize,
    /// Every load hangs until this is cleared.
    stalled: bool,
}

#[derive(Debug, Clone)]
struct Model {
    world: Arc<Mutex<World>>,
    /// Each load takes 80% to 120% of its modelled time, so callers do not
    /// move in lockstep (a real database never answers that evenly).
    jitter: Arc<AtomicU64>,
    running: Arc<AtomicUsize>,
    max_running: Arc<AtomicUsize>,
    stall_released: Arc<tokio::sync::Notify>,
}

impl Model {
    fn new(world: World) -> Self {
        Self {
            world: Arc::new(Mutex::new(world)),
            jitter: Arc::new(AtomicU64::new(0x2545_f491_4f6c_dd1d)),
            running: Arc::default(),
            max_running: Arc::default(),
            stall_released: Arc::default(),
        }
    }

    fn set(&self, change: impl FnOnce(&mut World)) {
        change(&mut self.world.lock().unwrap());
        self.stall_released.notify_waiters();
    }
}

impl Loader<u64, u64> for Model {
    type Error = Infallible;

    async fn load(&self, keys: Vec<u64>) -> Result<Loaded<u64, u64>, Infallible> {
        let running = self.running.fetch_add(1, SeqCst) + 1;
        self.max_running.fetch_max(running, SeqCst);
        loop {
            let released = self.stall_released.notified();
            if !self.world.lock().unwrap().stalled {
                break;
            }
            released.await;
        }
        let w = *self.world.lock().unwrap();
        let work = w.per_load + w.per_key * keys.len() as u32;
        let share = (running as f64 / w.cores as f64).max(1.0).powi(2);
        let mut x = self.jitter.load(SeqCst);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.jitter.store(x, SeqCst);
        let jitter = 0.8 + 0.4 * (x >> 11) as f64 / (1u64 << 53) as f64;
        tokio::time::sleep((w.round_trip + work.mul_f64(share)).mul_f64(jitter)).await;
        self.running.fetch_sub(1, SeqCst);
        Ok(keys.into_iter().map(|k| (k, k)).collect())
    }
}

/// `callers` tasks reading until `stop`, counting answers. Between an
/// answer and its next request each caller works for up to 200 µs, as a
/// real client does, so a load's callers come back spread out rather than
/// all at once.
fn closed_loop(
    batcher: &Batcher<u64, u64>,
    callers: u64,
    stop: &Arc<AtomicBool>,
) -> Arc<AtomicU64> {
    let served = Arc::new(AtomicU64::new(0));
    for c in 0..callers {
        let (batcher, stop, served) = (batcher.clone(), Arc::clone(stop), Arc::clone(&served));
        tokio::spawn(async move {
            let mut k = c;
            while !stop.load(SeqCst) {
                k = k
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                if batcher.load(k % 1_000_000).await.is_ok() {
                    served.fetch_add(1, SeqCst);
                }
                tokio::time::sleep(Duration::from_micros(k % 200)).await;
            }
        });
    }
    served
}

/// Answers per second over the next `over`, and the limit at its end.
async fn measure(batcher: &Batcher<u64, u64>, served: &AtomicU64, over: Duration) -> (f64, u64) {
    let before = served.load(SeqCst);
    let start = Instant::now();
    tokio::time::sleep(over).await;
    let rate = (served.load(SeqCst) - before) as f64 / start.elapsed().as_secs_f64();
    (rate, batcher.stats().concurrency_limit)
}

fn batcher(model: &Model, max: usize, max_batch_size: usize) -> Batcher<u64, u64> {
    Batcher::builder()
        .concurrency(Concurrency::Auto { max })
        .max_batch_size(max_batch_size)
        .timeout(Duration::from_secs(2))
        .build(model.clone())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn grows_under_load_when_the_round_trip_dominates() {
    // 5 ms away, plenty of cores, 64 callers and at most 8 keys a load:
    // below 8 loads, callers wait for a slot.
    let model = Model::new(World {
        round_trip: Duration::from_millis(5),
        per_load: Duration::from_micros(50),
        per_key: Duration::from_micros(1),
        cores: 64,
        stalled: false,
    });
    let b = batcher(&model, 16, 8);
    assert_eq!(b.stats().concurrency_limit, 4, "it starts at 4");
    let stop = Arc::new(AtomicBool::new(false));
    let served = closed_loop(&b, 64, &stop);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (rate, limit) = measure(&b, &served, Duration::from_secs(2)).await;
    stop.store(true, SeqCst);
    assert!(limit >= 8, "limit {limit}");
    // 64 callers, loads of about 5 ms: at most about 12,800 answers/s;
    // 4 loads of 8 would serve at most 6,400.
    assert!(rate > 0.7 * 12_800.0, "{rate}/s at limit {limit}");
    assert!(
        model.max_running.load(SeqCst) <= 16,
        "never beyond its bound"
    );
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn shrinks_when_more_loads_only_get_in_each_others_way() {
    // First far away, 1,024 callers: the limit climbs to the bound.
    let model = Model::new(World {
        round_trip: Duration::from_millis(5),
        per_load: Duration::from_micros(200),
        per_key: Duration::from_micros(1),
        cores: 64,
        stalled: false,
    });
    let b = batcher(&model, 16, 64);
    let stop = Arc::new(AtomicBool::new(false));
    let served = closed_loop(&b, 1_024, &stop);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (_, high) = measure(&b, &served, Duration::from_millis(500)).await;
    assert!(high >= 12, "limit {high} far away");
    let far = b.stats();
    let (least, recent) = (far.load_time_least.unwrap(), far.load_time_recent.unwrap());
    // The round trip: no load is quicker, and none queues.
    assert!(least >= Duration::from_millis(5), "{least:?}");
    assert!(recent < least * 2, "{recent:?} against {least:?}");
    // Then next to a 2-core database: loads beyond two slow each other
    // down, so fewer loads serve more.
    model.set(|w| {
        w.round_trip = Duration::ZERO;
        w.cores = 2;
    });
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (rate, low) = measure(&b, &served, Duration::from_secs(1)).await;
    stop.store(true, SeqCst);
    assert!(low <= 6, "limit {low} next to 2 cores (was {high})");
    // 2 loads of 64 keys serve 128 / 264 µs ≈ 485,000/s; 16 loads, each
    // 64 times slower, 1,024 / 16.9 ms ≈ 60,000/s.
    assert!(rate > 3.0 * 60_000.0, "{rate}/s at limit {low}");
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn never_exceeds_its_bound() {
    // Far away, 1,000 callers: more loads would always help.
    let model = Model::new(World {
        round_trip: Duration::from_millis(5),
        per_load: Duration::from_micros(10),
        per_key: Duration::from_micros(1),
        cores: 1_000,
        stalled: false,
    });
    let b = batcher(&model, 6, 64);
    let stop = Arc::new(AtomicBool::new(false));
    let _served = closed_loop(&b, 1_000, &stop);
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(b.stats().concurrency_limit <= 6);
    }
    stop.store(true, SeqCst);
    assert_eq!(b.stats().concurrency_limit, 6, "it climbed to the bound");
    assert_eq!(model.max_running.load(SeqCst), 6, "and no further");
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn recovers_after_a_stall() {
    let model = Model::new(World {
        round_trip: Duration::from_millis(1),
        per_load: Duration::from_micros(100),
        per_key: Duration::from_micros(2),
        cores: 4,
        stalled: false,
    });
    let b = batcher(&model, 16, 64);
    let stop = Arc::new(AtomicBool::new(false));
    let served = closed_loop(&b, 200, &stop);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (before, limit_before) = measure(&b, &served, Duration::from_secs(1)).await;
    // The database freezes for 3 s: every request in flight times out.
    model.set(|w| w.stalled = true);
    tokio::time::sleep(Duration::from_secs(3)).await;
    model.set(|w| w.stalled = false);
    // Within 2 s it serves as before.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (after, limit_after) = measure(&b, &served, Duration::from_secs(1)).await;
    stop.store(true, SeqCst);
    assert!(
        after > 0.9 * before,
        "{after}/s after the stall (limit {limit_after}) vs {before}/s before (limit {limit_before})"
    );
    let timed_out = b.stats().timed_out;
    assert!(timed_out > 0, "the stall timed requests out");
    b.shutdown().await;
}
