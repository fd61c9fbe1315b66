//! JSON lines, without parsing span fields back.

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_serde::fields::AsMap as _;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::{LookupSpan, SpanRef};

use super::clock;

/// Writes an event as one JSON object per line, in the shape of
/// `tracing-subscriber`'s JSON format (`timestamp`, `level`, `fields`,
/// `target`, the current `span` with its `name`, and `spans` from the root),
/// splicing each span's fields, which [`JsonFields`] keeps as JSON object
/// text, instead of parsing them back.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonLines;

impl<S> FormatEvent<S, JsonFields> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut timestamp = String::with_capacity(32);
        clock::write_now(&mut Writer::new(&mut timestamp))?;
        let mut line = Vec::with_capacity(256);
        line.extend_from_slice(b"{\"timestamp\":");
        json_str(&mut line, &timestamp)?;
        line.extend_from_slice(b",\"level\":");
        json_str(&mut line, meta.level().as_str())?;
        line.extend_from_slice(b",\"fields\":");
        serde_json::to_writer(&mut line, &event.field_map()).map_err(|_| fmt::Error)?;
        line.extend_from_slice(b",\"target\":");
        json_str(&mut line, meta.target())?;
        let current = event
            .parent()
            .and_then(|id| ctx.span(id))
            .or_else(|| ctx.lookup_current());
        if let Some(span) = &current {
            line.extend_from_slice(b",\"span\":");
            write_span(&mut line, span)?;
            // From the root to the span entered last, which is not the
            // `span` above when the event names its parent.
            line.extend_from_slice(b",\"spans\":[");
            if let Some(leaf) = ctx.lookup_current() {
                for (n, span) in leaf.scope().from_root().enumerate() {
                    if n > 0 {
                        line.push(b',');
                    }
                    write_span(&mut line, &span)?;
                }
            }
            line.push(b']');
        }
        line.extend_from_slice(b"}\n");
        writer.write_str(std::str::from_utf8(&line).map_err(|_| fmt::Error)?)
    }
}

/// `span`'s fields and its `name` as one JSON object.
fn write_span<S>(line: &mut Vec<u8>, span: &SpanRef<'_, S>) -> fmt::Result
where
    S: for<'a> LookupSpan<'a>,
{
    let extensions = span.extensions();
    let fields = extensions
        .get::<FormattedFields<JsonFields>>()
        .map_or("", |f| f.fields.as_str())
        .trim();
    // `{"a":1}` becomes `{"a":1,` and `{}` (or nothing) `{`, then the name.
    match fields.strip_suffix('}') {
        Some(open) if open.trim_end() != "{" => {
            line.extend_from_slice(open.as_bytes());
            line.push(b',');
        }
        _ => line.push(b'{'),
    }
    line.extend_from_slice(b"\"name\":");
    json_str(line, span.metadata().name())?;
    line.push(b'}');
    Ok(())
}

/// `s` as a JSON string, escaped by serde_json.
fn json_str(line: &mut Vec<u8>, s: &str) -> fmt::Result {
    serde_json::to_writer(line, s).map_err(|_| fmt::Error)
}

#[cfg(test)]
mod tests {
    use crate::logs::writer::tests::Buffer;

    use super::*;

    /// Events outside any span, in one with fields to escape, in a nested
    /// one without fields, with an explicit parent, and in a span whose
    /// field was recorded after it was made.
    fn emit() {
        tracing::info!(status = 200, latency_ms = 0.25, "served");
        let alone = tracing::info_span!("alone", n = 1u64);
        tracing::info!(parent: &alone, "explicit parent, no span entered");
        let request = tracing::info_span!(
            "request",
            method = "GET",
            route = "/api/v1/repositories/{repo}/objects/stat",
            request_id = "an \"id\"\nwith\\escapes",
        );
        let _entered = request.enter();
        tracing::warn!(answer = true, text = "tab\tand ünïcode", "inside one");
        tracing::info_span!("load").in_scope(|| tracing::error!(n = -3i64, "nested"));
        let detached = tracing::info_span!(parent: None, "detached", key = 7u64);
        tracing::info!(parent: &detached, "explicit parent");
        let later = tracing::info_span!("later", value = tracing::field::Empty);
        later.record("value", "set after");
        later.in_scope(|| tracing::debug!(ratio = 1.5f64, "recorded"));
    }

    /// The lines [`emit`] gives, written by [`JsonLines`] or by
    /// tracing-subscriber's JSON format, parsed, without their timestamps.
    fn lines(ours: bool) -> Vec<serde_json::Value> {
        let buffer = Buffer::default();
        let builder = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(buffer.clone());
        if ours {
            let subscriber = builder
                .fmt_fields(JsonFields::new())
                .event_format(JsonLines)
                .finish();
            tracing::subscriber::with_default(subscriber, emit);
        } else {
            tracing::subscriber::with_default(builder.json().finish(), emit);
        }
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|line| {
                let mut value: serde_json::Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                let timestamp = value.as_object_mut().unwrap().remove("timestamp");
                assert!(
                    timestamp.as_ref().and_then(|t| t.as_str()).is_some(),
                    "{line}"
                );
                value
            })
            .collect()
    }

    #[test]
    fn json_lines_say_what_the_json_format_says() {
        let ours = lines(true);
        assert_eq!(ours.len(), 6, "{ours:#?}");
        assert_eq!(ours, lines(false));
        assert_eq!(ours[1]["spans"], serde_json::json!([]), "{:#?}", ours[1]);
        assert_eq!(
            ours[2]["span"]["request_id"], "an \"id\"\nwith\\escapes",
            "{:#?}",
            ours[2]
        );
        assert_eq!(ours[3]["spans"].as_array().unwrap().len(), 2);
    }
}
