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
