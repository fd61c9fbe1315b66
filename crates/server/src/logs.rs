//! Where log lines go: formatted on the thread that logs, written to
//! standard error by a thread of their own.
//!
//! Written in place, each request's `served` line cost the thread serving
//! it a `write` to standard error under its lock: with the lock contended
//! between the runtime's workers, that took 12% of the server's CPU on
//! the no-database route, and the route read 66k requests per second with
//! logs on against 86k with them off (BENCHMARKS.md §5). Here a request
//! hands its line to a bounded queue, and the writer thread drains it
//! through a buffer, one `write` per many lines, flushing whenever the
//! queue is empty, so a line is late by at most one write.
//!
//! A full queue (standard error slower than the lines coming in: a
//! stalled pipe, a log collector that stopped reading) drops the line
//! rather than holding up a request, and counts it in
//! `log_lines_dropped_total` ([`dropped_lines`]). The writer is
//! `tracing-appender`'s, the ecosystem's non-blocking writer.
//!
//! JSON lines have the shape of `tracing-subscriber`'s JSON format, but are
//! written by [`JsonLines`]: that format parses each span's fields back
//! from JSON text for every line, twice (the `span` and the `spans`), which
//! took 9% of the server's CPU on the no-database route.

use std::fmt;
use std::io::Write;
use std::sync::OnceLock;

use clap::ValueEnum;
use tracing::{Event, Subscriber};
use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_serde::fields::AsMap as _;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime as _, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::{LookupSpan, SpanRef};
use tracing_subscriber::EnvFilter;

/// Lines waiting for the writer thread at most: about 4 MiB of typical
/// lines, and a fifth of a second of `served` lines at 80k requests per
/// second.
pub const QUEUED_LINES: usize = 16_384;

/// The writer thread's buffer: many lines per `write`.
const BUFFER_BYTES: usize = 64 * 1024;

/// The format of log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The lines dropped so far because the queue was full, once [`init`] has
/// run.
static DROPPED: OnceLock<ErrorCounter> = OnceLock::new();

/// Keeps the writer thread: dropping it writes out the lines still queued
/// (for up to a second), so `main` holds it until it returns.
#[derive(Debug)]
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard {
    _writer: WorkerGuard,
}

/// Logs of the process, at the verbosity `RUST_LOG` asks for (default
/// `info`), in `format`, to standard error; coloured text only on a
/// terminal, and never with `NO_COLOR` set.
///
/// # Panics
///
/// When a global subscriber was already set.
pub fn init(format: LogFormat) -> LogGuard {
    use std::io::IsTerminal as _;
    let colour = format == LogFormat::Text
        && std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    init_to(format, colour, std::io::stderr())
}

/// As [`init`], but to `out`, coloured if `colour`: benchmarks measure the
/// server's logging as shipped without filling their own output.
///
/// # Panics
///
/// When a global subscriber was already set.
pub fn init_to(format: LogFormat, colour: bool, out: impl Write + Send + 'static) -> LogGuard {
    let (writer, guard) = NonBlockingBuilder::default()
        .buffered_lines_limit(QUEUED_LINES)
        .lossy(true)
        .thread_name("pgbatch-logs")
        .finish(std::io::BufWriter::with_capacity(BUFFER_BYTES, out));
    // A second `init` fails below, on the global subscriber, before any
    // line could be counted in the wrong counter.
    let _ = DROPPED.set(writer.error_counter());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Json => builder
            .fmt_fields(JsonFields::new())
            .event_format(JsonLines)
            .init(),
        LogFormat::Text => builder.with_ansi(colour).init(),
    }
    LogGuard { _writer: guard }
}

/// Lines dropped because the queue to the writer thread was full, or
/// `None` before [`init`] (tests, embedders with their own subscriber).
pub fn dropped_lines() -> Option<u64> {
    DROPPED
        .get()
        .map(|counter| u64::try_from(counter.dropped_lines()).unwrap_or(u64::MAX))
}

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
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
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
        }
        if let (Some(_), Some(leaf)) = (&current, ctx.lookup_current()) {
            line.extend_from_slice(b",\"spans\":[");
            for (n, span) in leaf.scope().from_root().enumerate() {
                if n > 0 {
                    line.push(b',');
                }
                write_span(&mut line, &span)?;
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
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    /// Lines written, shared with the subscriber that writes them.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl MakeWriter<'_> for Buffer {
        type Writer = Self;

        fn make_writer(&self) -> Self {
            self.clone()
        }
    }

    /// Events outside any span, in one with fields to escape, in a nested
    /// one without fields, with an explicit parent, and in a span whose
    /// field was recorded after it was made.
    fn emit() {
        tracing::info!(status = 200, latency_ms = 0.25, "served");
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
        assert_eq!(ours.len(), 5, "{ours:#?}");
        assert_eq!(ours, lines(false));
        assert_eq!(
            ours[1]["span"]["request_id"], "an \"id\"\nwith\\escapes",
            "{:#?}",
            ours[1]
        );
        assert_eq!(ours[2]["spans"].as_array().unwrap().len(), 2);
    }
}
