//! Where log lines go: formatted on the thread that logs, written to
//! standard error by a thread of their own.
//!
//! Written in place, each request's `served` line cost the thread serving
//! it a `write` to standard error under its lock: with the lock contended
//! between the runtime's workers, that took 12% of the server's CPU on
//! the no-database route, which read 68k requests per second with logs on
//! against 90k with them off (BENCHMARKS.md §5); and once standard error
//! was a full pipe nobody read, every request hung. Here a request hands
//! its line to a bounded queue and goes on; the writer thread takes every
//! line waiting, writes them in blocks of up to 64 KiB, and writes again
//! as soon as the queue is empty, so no line waits for others to come.
//!
//! A line is dropped, and counted in `log_lines_dropped_total`
//! ([`dropped_lines`]), when the queue is full (standard error slower than
//! the lines coming in: a stalled pipe, a log collector that stopped
//! reading) or when standard error refuses its block (a full disk, a
//! closed pipe). Requests never wait for standard error, and a panic is
//! logged through the queue too, as the default hook would write it to
//! standard error from the panicking thread.
//!
//! Hand-written rather than `tracing-appender`'s non-blocking writer, which
//! this module used at first: that one loses the lines of a failed write
//! without counting them, and its guard prints to standard output (which
//! carries only a command's output: a token, a report) when the queue is
//! full at exit. The queue is crossbeam's.
//!
//! JSON lines have the shape of `tracing-subscriber`'s JSON format, but are
//! written by [`JsonLines`]: that format parses each span's fields back
//! from JSON text for every line, twice (the `span` and the `spans`), which
//! took 9% of the server's CPU on the no-database route.

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use tracing::{Event, Subscriber};
use tracing_serde::fields::AsMap as _;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime as _, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields, MakeWriter};
use tracing_subscriber::registry::{LookupSpan, SpanRef};
use tracing_subscriber::EnvFilter;

/// Lines waiting for the writer thread at most: about 4 MiB of typical
/// lines, and a fifth of a second of `served` lines at 80k requests per
/// second.
pub const QUEUED_LINES: usize = 16_384;

/// The writer thread writes lines in blocks of up to this many bytes.
const BLOCK_BYTES: usize = 64 * 1024;

/// How long the guard waits at exit for the lines queued before it.
const EXIT_WAIT: Duration = Duration::from_secs(1);

/// The format of log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The lines dropped so far, once [`init`] has run.
static DROPPED: OnceLock<Arc<AtomicU64>> = OnceLock::new();

/// Keeps the writer thread: dropping it writes out the lines queued so far
/// (waiting up to a second), so `main` holds it until it returns.
#[derive(Debug)]
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard {
    queue: Sender<Message>,
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        let deadline = Instant::now() + EXIT_WAIT;
        let (done, written) = crossbeam_channel::bounded(1);
        if self
            .queue
            .send_deadline(Message::Stop(done), deadline)
            .is_ok()
        {
            let _ = written.recv_deadline(deadline);
        }
    }
}

/// Logs of the process, at the verbosity `RUST_LOG` asks for (default
/// `info`), in `format`, to standard error; coloured text only on a
/// terminal, and never with `NO_COLOR` set. Panics are logged as `error`
/// lines.
///
/// # Panics
///
/// When a global subscriber was already set.
pub fn init(format: Format) -> LogGuard {
    use std::io::IsTerminal as _;
    let colour = format == Format::Text
        && io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let guard = init_to(format, colour, io::stderr());
    // A panic's report goes through the queue too: written to standard
    // error by the panicking thread, it would wait on a full pipe.
    std::panic::set_hook(Box::new(|panic| {
        // With errors filtered out (`RUST_LOG=off`), as the default hook
        // would: a panic is never silent.
        if !tracing::enabled!(tracing::Level::ERROR) {
            eprintln!("{panic}");
            return;
        }
        let thread = std::thread::current();
        let backtrace = std::backtrace::Backtrace::capture();
        match backtrace.status() {
            std::backtrace::BacktraceStatus::Captured => tracing::error!(
                thread = thread.name().unwrap_or("(unnamed)"),
                "{panic}\n{backtrace}"
            ),
            _ => tracing::error!(thread = thread.name().unwrap_or("(unnamed)"), "{panic}"),
        }
    }));
    guard
}

/// As [`init`], but to `out`, coloured if `colour`, and with panics
/// reported as usual: benchmarks measure the server's logging as shipped
/// without filling their own output.
///
/// # Panics
///
/// When a global subscriber was already set.
pub fn init_to(format: Format, colour: bool, out: impl Write + Send + 'static) -> LogGuard {
    let (queue, lines) = crossbeam_channel::bounded(QUEUED_LINES);
    let dropped = Arc::clone(DROPPED.get_or_init(Arc::default));
    let writer = Arc::clone(&dropped);
    std::thread::Builder::new()
        .name("pgbatch-logs".to_owned())
        .spawn(move || write_out(&lines, out, &writer))
        .expect("a thread for the log writer");
    let make_writer = Queue {
        lines: queue.clone(),
        dropped,
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(make_writer);
    match format {
        Format::Json => builder
            .fmt_fields(JsonFields::new())
            .event_format(JsonLines)
            .init(),
        Format::Text => builder.with_ansi(colour).init(),
    }
    LogGuard { queue }
}

/// Lines dropped because the queue to the writer thread was full or
/// standard error refused them, or `None` before [`init`] (tests,
/// embedders with their own subscriber).
pub fn dropped_lines() -> Option<u64> {
    DROPPED.get().map(|dropped| dropped.load(Relaxed))
}

/// What the writer thread is sent.
#[derive(Debug)]
enum Message {
    Line(Vec<u8>),
    /// Write out what came before, then say so.
    Stop(Sender<()>),
}

/// The queue's sending end, as the writer of each formatted line.
#[derive(Debug)]
struct Queue {
    lines: Sender<Message>,
    dropped: Arc<AtomicU64>,
}

impl<'a> MakeWriter<'a> for Queue {
    type Writer = &'a Queue;

    fn make_writer(&'a self) -> &'a Queue {
        self
    }
}

impl Write for &Queue {
    /// Queues `line` (the formatter writes each line whole, at once), or
    /// drops it when the queue is full.
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        if self.lines.try_send(Message::Line(line.to_vec())).is_err() {
            self.dropped.fetch_add(1, Relaxed);
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The writer thread: takes every line waiting, writes them to `out` in
/// blocks, and writes again as soon as the queue is empty, until stopped
/// or every sender is gone.
fn write_out(lines: &Receiver<Message>, mut out: impl Write, dropped: &AtomicU64) {
    let mut block = Block::default();
    loop {
        let Ok(mut message) = lines.recv() else {
            return;
        };
        loop {
            match message {
                Message::Line(line) => {
                    if block.bytes.len() + line.len() > BLOCK_BYTES {
                        block.write(&mut out, dropped);
                    }
                    block.bytes.extend_from_slice(&line);
                    block.lines += 1;
                }
                Message::Stop(done) => {
                    block.write(&mut out, dropped);
                    let _ = done.send(());
                    return;
                }
            }
            match lines.try_recv() {
                Ok(next) => message = next,
                Err(_) => break,
            }
        }
        block.write(&mut out, dropped);
    }
}

/// Lines gathered for one `write`.
#[derive(Debug, Default)]
struct Block {
    bytes: Vec<u8>,
    lines: u64,
}

impl Block {
    /// Writes the block to `out`; lines `out` refuses are counted dropped.
    fn write(&mut self, out: &mut impl Write, dropped: &AtomicU64) {
        if self.lines == 0 {
            return;
        }
        if out
            .write_all(&self.bytes)
            .and_then(|()| out.flush())
            .is_err()
        {
            dropped.fetch_add(self.lines, Relaxed);
        }
        self.bytes.clear();
        self.lines = 0;
    }
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
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    /// Lines written, shared with the subscriber that writes them.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
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

    /// A standard error that refuses every write, as a full disk does.
    struct Refusing;

    impl Write for Refusing {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::other("no space left on device"))
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// `lines`, then a stop, through the writer thread's loop into `out`:
    /// whether the stop was answered, and the lines counted dropped.
    fn write_through(lines: &[Vec<u8>], out: impl Write) -> (bool, u64) {
        let (queue, received) = crossbeam_channel::bounded(lines.len() + 1);
        for line in lines {
            queue.send(Message::Line(line.clone())).unwrap();
        }
        let (done, written) = crossbeam_channel::bounded(1);
        queue.send(Message::Stop(done)).unwrap();
        let dropped = AtomicU64::new(0);
        write_out(&received, out, &dropped);
        (written.try_recv().is_ok(), dropped.load(Relaxed))
    }

    #[test]
    fn queued_lines_are_written_in_order_before_the_stop_is_answered() {
        // Three blocks' worth, so blocks are cut and written in turn.
        let lines: Vec<Vec<u8>> = (0..3 * BLOCK_BYTES / 100)
            .map(|n| format!("{n:099}\n").into_bytes())
            .collect();
        let out = Buffer::default();
        assert_eq!(write_through(&lines, out.clone()), (true, 0));
        assert_eq!(*out.0.lock().unwrap(), lines.concat());
    }

    #[test]
    fn lines_standard_error_refuses_are_counted_dropped() {
        let lines = vec![b"one\n".to_vec(), b"two\n".to_vec(), b"three\n".to_vec()];
        assert_eq!(write_through(&lines, Refusing), (true, 3));
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
