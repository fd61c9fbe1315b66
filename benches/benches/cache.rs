//! The coalescing cache: hit-path throughput, a hit against an uncached
//! Postgres lookup, and an authenticated HTTP request with the token cache
//! on versus off, all measured in the same run against a real Postgres.
//!
//! After the criterion groups, a report prints the same comparisons as
//! ratios with each target's verdict (`-- --test` shortens it to a smoke
//! run).

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use benches::{runtime, seeded_database, server_app, time_sequential, ADMIN_TOKEN};
use criterion::{black_box, BenchmarkId, Criterion, Throughput};
use pgbatch::cache::Cache;
use pgbatch::pg::PgLoader;
use server::db::queries::kv::{kv_pk, KvQuery};
use server::settings::{AuthSettings, ReadPath, ReadSettings, Settings};
use tokio::runtime::Runtime;
use tower::ServiceExt;

const HOT_KEYS: u64 = 1_000;
const KV_ROWS: u64 = 100_000;
const TASKS: usize = 64;

/// A cache holding `HOT_KEYS` entries, all loaded.
fn warm_cache(rt: &Runtime) -> Cache<u64, u64> {
    rt.block_on(async {
        let cache = Cache::builder()
            .max_capacity(10 * HOT_KEYS)
            .build(|k: u64| async move { Ok(Some(k * 2)) })
            .expect("valid cache settings");
        // Twice: the cache stores a key's value from its second miss.
        for k in (0..HOT_KEYS).chain(0..HOT_KEYS) {
            cache.get(k).await.expect("in-memory load");
        }
        assert_eq!(cache.stats().fills, HOT_KEYS, "every hot key is stored");
        cache
    })
}

struct Fixture {
    pg: PgLoader<KvQuery>,
    auth_on: axum::Router,
    auth_off: axum::Router,
    /// The token resolvers of the two apps, for the lakeFS comparison:
    /// credentials from the cache versus from Postgres.
    resolver_on: server::domain::auth::Authenticator,
    resolver_off: server::domain::auth::Authenticator,
}

fn fixture(rt: &Runtime) -> Fixture {
    rt.block_on(async {
        let config = seeded_database(0, KV_ROWS).await;
        let pool = server::db::pool(&config, 4, Duration::from_secs(5)).expect("pool");
        // Data reads come from the cache in both apps, so the difference
        // between them is the token lookup.
        let settings = |auth_cache: bool| Settings {
            read: ReadSettings {
                path: ReadPath::Cached,
                ..ReadSettings::default()
            },
            auth: AuthSettings {
                cache: auth_cache.then(|| AuthSettings::default().cache).flatten(),
            },
            ..Settings::default()
        };
        let pool_size = server::settings::defaults::POOL_SIZE;
        let (auth_on, on_state) = server_app(&config, pool_size, &settings(true));
        let (auth_off, off_state) = server_app(&config, pool_size, &settings(false));
        // Load the rows the requests read into both apps' caches first.
        for n in 0..100 {
            call(&auth_on, n).await;
            call(&auth_off, n).await;
        }
        Fixture {
            pg: PgLoader::new(pool, KvQuery),
            auth_on,
            auth_off,
            resolver_on: on_state.auth.clone(),
            resolver_off: off_state.auth.clone(),
        }
    })
}

fn kv_request(n: u64) -> Request<Body> {
    Request::get(format!("/api/v1/kv/{}", kv_pk(1 + n % 100)))
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .body(Body::empty())
        .expect("valid request")
}

async fn call(router: &axum::Router, n: u64) {
    let res = router
        .clone()
        .oneshot(kv_request(n))
        .await
        .expect("infallible");
    assert_eq!(res.status(), StatusCode::OK);
}

/// `TASKS` tasks each doing `per_task` hits; returns when all are done.
async fn hit_round(cache: &Cache<u64, u64>, per_task: u64) {
    let tasks: Vec<_> = (0..TASKS as u64)
        .map(|t| {
            let cache = cache.clone();
            tokio::spawn(async move {
                for i in 0..per_task {
                    black_box(cache.get((t * 7 + i) % HOT_KEYS).await.ok());
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("bench task");
    }
}

fn criterion_groups(c: &mut Criterion, rt: &Runtime, cache: &Cache<u64, u64>, fx: &Fixture) {
    let mut g = c.benchmark_group("cache_hit");
    g.throughput(Throughput::Elements(1));
    g.bench_function(BenchmarkId::new("tasks", 1), |b| {
        b.iter_custom(|iters| {
            let cache = cache.clone();
            time_sequential(rt, iters, move |k| {
                let cache = cache.clone();
                async move {
                    black_box(cache.get(k % HOT_KEYS).await.ok());
                }
            })
        });
    });
    let per_task = 1_000;
    g.throughput(Throughput::Elements(TASKS as u64 * per_task));
    g.bench_function(BenchmarkId::new("tasks", TASKS), |b| {
        b.to_async(rt).iter(|| hit_round(cache, per_task));
    });
    g.finish();

    let mut g = c.benchmark_group("lookup");
    g.throughput(Throughput::Elements(1));
    g.bench_function("cache_hit", |b| {
        b.iter_custom(|iters| {
            let cache = cache.clone();
            time_sequential(rt, iters, move |k| {
                let cache = cache.clone();
                async move {
                    black_box(cache.get(k % HOT_KEYS).await.ok());
                }
            })
        });
    });
    g.bench_function("postgres_uncached", |b| {
        b.iter_custom(|iters| {
            let pg = fx.pg.clone();
            time_sequential(rt, iters, move |k| {
                let pg = pg.clone();
                async move {
                    black_box(pg.load_one(&kv_pk(1 + k % KV_ROWS)).await.ok());
                }
            })
        });
    });
    g.finish();

    let mut g = c.benchmark_group("authenticated_request");
    g.throughput(Throughput::Elements(1));
    for (name, router) in [
        ("auth_cache_on", &fx.auth_on),
        ("auth_cache_off", &fx.auth_off),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let router = router.clone();
                time_sequential(rt, iters, move |k| {
                    let router = router.clone();
                    async move { call(&router, k).await }
                })
            });
        });
    }
    g.finish();
}

/// Mean time per call of `f`, over `n` sequential calls on a runtime worker.
fn mean_of<F, Fut>(rt: &Runtime, n: u64, f: F) -> Duration
where
    F: Fn(u64) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    time_sequential(rt, n, f) / u32::try_from(n).expect("small count")
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

fn report(rt: &Runtime, cache: &Cache<u64, u64>, fx: &Fixture, smoke: bool) {
    let scale = if smoke { 1 } else { 20 };
    let hit = {
        let cache = cache.clone();
        mean_of(rt, 50_000 * scale, move |k| {
            let cache = cache.clone();
            async move {
                black_box(cache.get(k % HOT_KEYS).await.ok());
            }
        })
    };
    let many = {
        let start = Instant::now();
        let per_task = 500 * scale;
        rt.block_on(hit_round(cache, per_task));
        (TASKS as u64 * per_task) as f64 / start.elapsed().as_secs_f64()
    };
    let pg = {
        let pg = fx.pg.clone();
        mean_of(rt, 500 * scale, move |k| {
            let pg = pg.clone();
            async move {
                black_box(pg.load_one(&kv_pk(1 + (k * 7919) % KV_ROWS)).await.ok());
            }
        })
    };
    let request = |router: &axum::Router| {
        let router = router.clone();
        mean_of(rt, 500 * scale, move |k| {
            let router = router.clone();
            async move { call(&router, k).await }
        })
    };
    let (on, off) = (request(&fx.auth_on), request(&fx.auth_off));
    let resolve = |auth: &server::domain::auth::Authenticator| {
        let auth = auth.clone();
        mean_of(rt, 500 * scale, move |_| {
            let auth = auth.clone();
            async move {
                black_box(auth.principal(ADMIN_TOKEN).await.expect("lookup"));
            }
        })
    };
    let (cred_hit, cred_db) = (resolve(&fx.resolver_on), resolve(&fx.resolver_off));
    let cred_ratio = cred_db.as_secs_f64() / cred_hit.as_secs_f64();

    let ns = |d: Duration| d.as_nanos();
    let hit_ratio = pg.as_secs_f64() / hit.as_secs_f64();
    println!("\n| measurement | per operation | operations/s | ratio |");
    println!("|---|---:|---:|---:|");
    println!(
        "| cache hit, 1 task | {} ns | {:.0} | 1.0 |",
        ns(hit),
        1.0 / hit.as_secs_f64()
    );
    println!("| cache hit, {TASKS} tasks | - | {many:.0} | - |");
    println!(
        "| Postgres lookup, uncached | {} ns | {:.0} | {hit_ratio:.0}x the hit |",
        ns(pg),
        1.0 / pg.as_secs_f64()
    );
    println!(
        "| credentials (token, user, policies), cached | {} ns | {:.0} | 1.0 |",
        ns(cred_hit),
        1.0 / cred_hit.as_secs_f64()
    );
    println!(
        "| credentials, from Postgres | {} ns | {:.0} | {cred_ratio:.0}x the cached |",
        ns(cred_db),
        1.0 / cred_db.as_secs_f64()
    );
    println!(
        "| authenticated GET, auth cache on | {} ns | {:.0} | 1.0 |",
        ns(on),
        1.0 / on.as_secs_f64()
    );
    println!(
        "| authenticated GET, auth cache off | {} ns | {:.0} | {:.2}x slower |",
        ns(off),
        1.0 / off.as_secs_f64(),
        off.as_secs_f64() / on.as_secs_f64()
    );
    println!(
        "\ntarget: a cache hit at least 1,000x faster than an uncached Postgres lookup: {} \
         ({hit_ratio:.0}x for a row, {cred_ratio:.0}x for credentials)",
        verdict(hit_ratio >= 1000.0 && cred_ratio >= 1000.0)
    );
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--test");
    let rt = runtime();
    let cache = warm_cache(&rt);
    let fx = fixture(&rt);
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    criterion_groups(&mut c, &rt, &cache, &fx);
    c.final_summary();
    report(&rt, &cache, &fx, smoke);
}
