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
