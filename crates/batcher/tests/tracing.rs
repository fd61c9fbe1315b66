//! The batcher reports through `tracing`: a span per batch, linked to the
//! callers' spans, and events for failures.

mod support;

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use pgbatch::{Batcher, FlushPolicy};
use support::{TestLoader, FAIL_KEY, PANIC_KEY};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Instrument, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Records span creations, `follows_from` links and events as text lines.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<String>>>);

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={:?}", field.name(), value);
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, _id: &Id, _ctx: Context<'_, S>) {
        let mut f = Fields(format!("span {}", attrs.metadata().name()));
        attrs.record(&mut f);
        self.0.lock().unwrap().push(f.0);
    }

    fn on_record(&self, span: &Id, values: &tracing::span::Record<'_>, ctx: Context<'_, S>) {
        let name = ctx.span(span).map(|s| s.name()).unwrap_or("?");
        let mut f = Fields(format!("record {name}"));
        values.record(&mut f);
        self.0.lock().unwrap().push(f.0);
    }

    fn on_follows_from(&self, span: &Id, follows: &Id, ctx: Context<'_, S>) {
        let name = |id| ctx.span(id).map(|s| s.name()).unwrap_or("?");
        let line = format!("link {} -> {}", name(span), name(follows));
        self.0.lock().unwrap().push(line);
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut f = Fields(format!("event {}", event.metadata().level()));
        event.record(&mut f);
        if let Some(span) = ctx.event_span(event) {
            let _ = write!(f.0, " in={}", span.name());
        }
        self.0.lock().unwrap().push(f.0);
    }
}

#[tokio::test]
async fn batches_are_spans_linked_to_callers_and_failures_are_events() {
    let recorder = Recorder::default();
    let subscriber = tracing_subscriber::registry().with(recorder.clone());
    let _guard = tracing::subscriber::set_default(subscriber);

    let b: Batcher<u64, String> = Batcher::builder()
        .name("objects")
        .policy(FlushPolicy::FixedDelay)
        .max_batch_size(2)
        .build(TestLoader::new())
        .unwrap();

    let request = tracing::info_span!("http_request");
    let ok = b.load_many([1, 2]).instrument(request).await;
    assert!(ok.iter().all(Result::is_ok));
    b.load_many([FAIL_KEY, 3]).await;
    b.load_many([PANIC_KEY, 4]).await;

    let lines = recorder.0.lock().unwrap().clone();
    let has = |needle: &str| lines.iter().any(|l| l.contains(needle));
    assert!(
        has("span batch batcher=objects size=2"),
        "batch span with its size: {lines:#?}"
    );
    assert!(has("link batch -> http_request"), "{lines:#?}");
    assert!(
        has("event WARN message=batch load failed error=test loader failed: [3, 666] retryable=false keys=2 in=batch"),
        "{lines:#?}"
    );
    assert!(
        has("event ERROR message=batch loader panicked panic=loader panicked on purpose"),
        "{lines:#?}"
    );
}

/// A scope holding a secret, which only its label may show.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Tenant {
    name: &'static str,
    secret: &'static str,
}

/// Names each scope by its tenant's name.
struct Labelled;

impl pgbatch::ScopedLoader<Tenant, u64, String> for Labelled {
    type Error = std::convert::Infallible;

    async fn load(
        &self,
        tenant: &Tenant,
        keys: Vec<u64>,
    ) -> Result<pgbatch::Loaded<u64, String>, Self::Error> {
        Ok(keys
            .into_iter()
            .map(|k| (k, format!("{} {k}", tenant.name)))
            .collect())
    }

    fn label<'s>(&self, tenant: &'s Tenant) -> Option<std::borrow::Cow<'s, str>> {
        Some(tenant.name.into())
    }
}

#[tokio::test]
async fn a_scope_appears_in_spans_by_its_label_alone() {
    let recorder = Recorder::default();
    let subscriber = tracing_subscriber::registry().with(recorder.clone());
    let _guard = tracing::subscriber::set_default(subscriber);

    let b: Batcher<u64, String, Tenant> = Batcher::builder()
        .name("notes")
        .policy(FlushPolicy::FixedDelay)
        .max_batch_size(2)
        .build_scoped(Labelled)
        .unwrap();
    let tenant = Tenant {
        name: "tenant-7",
        secret: "s3cr3t-claims",
    };
    let got = b.load_many_as(&tenant, [1, 2]).await;
    assert!(got.iter().all(Result::is_ok));

    let lines = recorder.0.lock().unwrap().clone();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("record batch scope=\"tenant-7\"")),
        "{lines:#?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains(tenant.secret)),
        "{lines:#?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_batch_spans_links_to_its_callers_reach_opentelemetry() {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};

    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("pgbatch-test"));
    let subscriber = tracing_subscriber::registry().with(layer);
    let _guard = tracing::subscriber::set_default(subscriber);

    let b: Batcher<u64, String> = Batcher::builder()
        .policy(FlushPolicy::FixedDelay)
        .max_batch_size(3)
        .build(TestLoader::new())
        .unwrap();
    let requests = (0..3u64).map(|k| {
        b.load(k)
            .instrument(tracing::info_span!("request", key = k))
    });
    let answers = futures_util::future::join_all(requests).await;
    assert!(answers.iter().all(Result::is_ok));
    b.shutdown().await;
    provider.force_flush().unwrap();

    let spans = exporter.get_finished_spans().unwrap();
    let batches: Vec<_> = spans.iter().filter(|s| s.name == "batch").collect();
    assert_eq!(batches.len(), 1, "one load for the three requests");
    let callers: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "request")
        .map(|s| s.span_context.clone())
        .collect();
    assert_eq!(callers.len(), 3);
    let links: Vec<_> = batches[0]
        .links
        .iter()
        .map(|l| l.span_context.clone())
        .collect();
    for caller in &callers {
        assert!(
            links.contains(caller),
            "the batch span links to each caller's span: {links:?} {callers:?}"
        );
    }
}

/// A scope's values (a tenant id, a user's claims) are secrets: they reach
/// no log line (the crate's, tokio-postgres's or sqlx's, at every level),
/// no span, no metric, no error's `Display` or `Debug`, no other session's
/// `pg_stat_activity`, and no statement the server logs, on either driver,
/// even when a policy fails on a value and the database's message quotes
/// it.
#[cfg(all(feature = "postgres", feature = "sqlx", feature = "metrics"))]
mod scope_values {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::OnceLock;
    use std::time::Duration;

    use metrics_util::debugging::DebuggingRecorder;
    use pgbatch::db::Scope;
    use pgbatch::{Batcher, ScopedLoader};
    use tokio_postgres::NoTls;

    use super::*;

    /// The secrets: a tenant value a policy fails on (its cast quotes it),
    /// one it accepts, and claims.
    const FAILING: &str = "tenant-secret-4f1c";
    const ACCEPTED_CLAIMS: &str = "claims-secret-9b2e";
    /// Claims of a scope whose role the database refuses: the prologue
    /// itself fails, with these among its parameters.
    const REFUSED_CLAIMS: &str = "claims-secret-7d3a";
    const SECRETS: [&str; 3] = [FAILING, ACCEPTED_CLAIMS, REFUSED_CLAIMS];
    const SETTINGS: [&str; 2] = ["app.tenant", "request.jwt.claims"];

    /// Every `log` record, as text: what tokio-postgres (and sqlx, where
    /// it uses `log`) write.
    struct LogCapture(Mutex<Vec<String>>);

    impl log::Log for LogCapture {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }
        fn log(&self, record: &log::Record<'_>) {
            let line = format!("{} {} {}", record.level(), record.target(), record.args());
            self.0.lock().unwrap().push(line);
        }
        fn flush(&self) {}
    }

    fn log_capture() -> &'static LogCapture {
        static CAPTURE: OnceLock<&'static LogCapture> = OnceLock::new();
        CAPTURE.get_or_init(|| {
            let capture: &'static LogCapture = Box::leak(Box::new(LogCapture(Mutex::default())));
            log::set_logger(capture).expect("the only `log` logger of this binary");
            log::set_max_level(log::LevelFilter::Trace);
            capture
        })
    }

    fn scope(tenant: &str, claims: &str) -> Scope {
        scope_as("vals_tenant", tenant, claims)
    }

    fn scope_as(role: &str, tenant: &str, claims: &str) -> Scope {
        Scope::builder()
            .label(format!("{role} of {}", tenant.len()))
            .role(role)
            .setting("app.tenant", tenant)
            .setting("request.jwt.claims", format!(r#"{{"sub":"{claims}"}}"#))
            .build()
            .unwrap()
    }

    /// Loads through `batcher` as a scope the policy accepts and one it
    /// fails on; every error's `Display` and `Debug`.
    async fn read<L>(batcher: &Batcher<i64, String, Scope>, loader: &L) -> Vec<String>
    where
        L: ScopedLoader<Scope, i64, String>,
        L::Error: std::fmt::Debug,
    {
        let good = scope("3", ACCEPTED_CLAIMS);
        let bad = scope(FAILING, "x");
        let mut errors = Vec::new();
        for round in 0..20i64 {
            let ids = [3 + 10 * round, 13 + 10 * round];
            for answer in batcher.load_many_as(&good, ids).await {
                assert!(
                    answer.unwrap().is_some(),
                    "the accepted scope reads its rows"
                );
            }
            for answer in batcher.load_many_as(&bad, ids).await {
                let e = answer.expect_err("the policy fails on the value");
                errors.push(format!("{e} {e:?}"));
            }
        }
        let direct = loader.load(&bad, vec![3]).await.expect_err("fails");
        errors.push(format!("{direct:?}"));
        let stranger = scope_as("vals_stranger", "3", REFUSED_CLAIMS);
        for answer in batcher.load_many_as(&stranger, [3, 13]).await {
            let e = answer.expect_err("the role is refused");
            errors.push(format!("{e} {e:?}"));
        }
        errors
    }

    mod pg_driver {
        use pgbatch::pg::tokio_postgres::{Error, Row};
        use pgbatch::pg::{BatchQuery, Params};

        pub(super) struct Notes;

        impl BatchQuery for Notes {
            type Key = i64;
            type Value = String;
            fn batch_sql(&self) -> &str {
                "SELECT id, body FROM notes WHERE id = ANY($1)"
            }
            fn batch_params<'a>(&self, keys: &'a [i64]) -> Params<'a> {
                vec![Box::new(keys)]
            }
            fn map_row(&self, row: &Row) -> Result<(i64, String), Error> {
                Ok((row.try_get(0)?, row.try_get(1)?))
            }
        }
    }

    mod sqlx_driver {
        use pgbatch::sqlx::{BatchQuery, PgQuery};

        pub(super) struct Notes;

        impl BatchQuery for Notes {
            type Key = i64;
            type Row = (i64, String);
            type Value = String;
            fn batch_sql(&self) -> &str {
                "SELECT id, body FROM notes WHERE id = ANY($1)"
            }
            fn bind_batch<'q>(&self, query: PgQuery<'q>, keys: &'q [i64]) -> PgQuery<'q> {
                query.bind(keys)
            }
            fn map_row(&self, row: (i64, String)) -> (i64, String) {
                row
            }
        }
    }

    #[test]
    fn no_value_of_a_scope_reaches_a_log_span_metric_error_or_other_session() {
        let logs = log_capture();
        let recorder = Recorder::default();
        let subscriber = tracing_subscriber::registry().with(recorder.clone());
        let _tracing = tracing::subscriber::set_default(subscriber);
        let metrics = DebuggingRecorder::new();
        let snapshotter = metrics.snapshotter();
        let _metrics = ::metrics::set_default_local_recorder(&metrics);
        // One thread: every task (the batchers' workers, the connections)
        // runs where the subscriber and the recorder are set.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (errors, activity, server_log) = rt.block_on(async {
            let cluster = embedded_pg::testing::private_cluster()
                .await
                .expect("a private cluster");
            let admin = cluster.config("postgres");
            let (client, conn) = admin.connect(NoTls).await.unwrap();
            tokio::spawn(conn);
            client
                .batch_execute(
                    "CREATE ROLE vals_auth LOGIN PASSWORD 'pw';
                     CREATE ROLE vals_tenant NOLOGIN;
                     CREATE ROLE vals_stranger NOLOGIN;
                     GRANT vals_tenant TO vals_auth;
                     CREATE TABLE notes (id bigint PRIMARY KEY, tenant int NOT NULL, body text);
                     INSERT INTO notes SELECT n, n % 10, 'note ' || n FROM generate_series(1, 500) n;
                     ALTER TABLE notes ENABLE ROW LEVEL SECURITY;
                     GRANT SELECT ON notes TO vals_tenant;
                     CREATE POLICY by_tenant ON notes FOR SELECT TO vals_tenant
                       USING (tenant = current_setting('app.tenant')::int
                              AND current_setting('request.jwt.claims') <> '');",
                )
                .await
                .unwrap();
            let mut auth = admin.clone();
            auth.user("vals_auth").password("pw");

            // Another session of the login role watches what the loads'
            // sessions show.
            let (watcher, conn) = auth.connect(NoTls).await.unwrap();
            tokio::spawn(conn);
            let done = Arc::new(AtomicBool::new(false));
            let watch = tokio::spawn({
                let done = Arc::clone(&done);
                async move {
                    let mut seen = Vec::new();
                    while !done.load(Relaxed) {
                        let rows = watcher
                            .query("SELECT coalesce(query, '') FROM pg_stat_activity", &[])
                            .await
                            .unwrap();
                        seen.extend(rows.iter().map(|r| r.get::<_, String>(0)));
                        tokio::time::sleep(Duration::from_micros(200)).await;
                    }
                    seen
                }
            });

            let mut errors = Vec::new();
            // What another client of the login role may leave on a pooled
            // connection: parameters logged in full with a failed
            // statement.
            let poison = "SET log_parameter_max_length_on_error = -1";
            for prepared in [true, false] {
                let mode = if prepared {
                    pgbatch::pg::StatementMode::Prepared
                } else {
                    pgbatch::pg::StatementMode::Unnamed
                };
                let pool = pgbatch::pg::pool(auth.clone(), &pgbatch::pg::PoolOptions::with_max_size(2))
                    .unwrap();
                let loader = pgbatch::pg::PgLoader::with_statements(
                    pool,
                    pg_driver::Notes,
                    pgbatch::pg::Statements::default().mode(mode),
                )
                .scoped(SETTINGS)
                .unwrap();
                // Both of the pool's connections, held at once.
                let (a, b) = (loader.pool().get().await.unwrap(), loader.pool().get().await.unwrap());
                a.batch_execute(poison).await.unwrap();
                b.batch_execute(poison).await.unwrap();
                drop((a, b));
                let batcher = Batcher::builder()
                    .name("notes")
                    .scope_stats(8)
                    .build_scoped(loader.clone())
                    .unwrap();
                errors.extend(read(&batcher, &loader).await);

                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(2)
                    .connect_with(
                        sqlx::postgres::PgConnectOptions::new()
                            .socket(cluster.socket_dir())
                            .port(cluster.port())
                            .username("vals_auth")
                            .password("pw")
                            .database("postgres"),
                    )
                    .await
                    .unwrap();
                let mode = if prepared {
                    pgbatch::sqlx::StatementMode::Prepared
                } else {
                    pgbatch::sqlx::StatementMode::Unnamed
                };
                let (mut a, mut b) = (pool.acquire().await.unwrap(), pool.acquire().await.unwrap());
                sqlx::raw_sql(poison).execute(&mut *a).await.unwrap();
                sqlx::raw_sql(poison).execute(&mut *b).await.unwrap();
                drop((a, b));
                let loader =
                    pgbatch::sqlx::SqlxLoader::with_statement_mode(pool, sqlx_driver::Notes, mode)
                        .scoped(SETTINGS)
                        .unwrap();
                let batcher = Batcher::builder()
                    .name("notes-sqlx")
                    .scope_stats(8)
                    .build_scoped(loader.clone())
                    .unwrap();
                errors.extend(read(&batcher, &loader).await);
            }
            done.store(true, Relaxed);
            let activity = watch.await.unwrap();
            let server_log = std::fs::read_to_string(cluster.log_path()).unwrap();
            cluster.stop().await;
            (errors, activity, server_log)
        });

        let tracing_lines = recorder.0.lock().unwrap().clone();
        let log_lines = logs.0.lock().unwrap().clone();
        let metric_keys: Vec<String> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, ..)| format!("{:?}", key.key()))
            .collect();
        // What each place would show if it held a secret: the places are
        // really watched (each saw the loads), so an empty search proves
        // something.
        assert!(errors.iter().any(|e| e.contains("22P02")), "{errors:#?}");
        assert!(
            tracing_lines
                .iter()
                .any(|l| l.contains("batch load failed")),
            "{tracing_lines:#?}"
        );
        assert!(
            log_lines.iter().any(|l| l.contains("executing statement")),
            "tokio-postgres's debug lines: {log_lines:#?}"
        );
        assert!(
            activity
                .iter()
                .any(|q| q.contains("set_config('role', $1, true)")),
            "{activity:?}"
        );
        assert!(
            metric_keys
                .iter()
                .any(|k| k.contains("pgbatch_batcher_scope_loads_total")),
            "{metric_keys:#?}"
        );
        assert!(server_log.contains("STATEMENT:"), "{server_log}");
        // Postgres writes its own error message (which quotes the value the
        // policy failed on) into its log; what the service sent, the
        // statements and their parameters, it must never find there.
        let statements: Vec<&str> = server_log
            .lines()
            .filter(|l| l.contains("STATEMENT:") || l.contains("parameters:"))
            .collect();
        for (place, lines) in [
            (
                "error",
                errors.iter().map(String::as_str).collect::<Vec<_>>(),
            ),
            (
                "tracing",
                tracing_lines.iter().map(String::as_str).collect(),
            ),
            ("log", log_lines.iter().map(String::as_str).collect()),
            (
                "pg_stat_activity",
                activity.iter().map(String::as_str).collect(),
            ),
            ("metrics", metric_keys.iter().map(String::as_str).collect()),
            ("the server log's statements and parameters", statements),
        ] {
            for secret in SECRETS {
                let found: Vec<&&str> = lines.iter().filter(|l| l.contains(secret)).collect();
                assert!(found.is_empty(), "{secret} in {place}: {found:#?}");
            }
        }
    }
}
