//! Where log lines go: formatted on the thread that logs, written to
//! standard error by a thread of their own.
//!
//! Written in place, each request's `served` line cost the thread serving
//! it a `write` to standard error under its lock: with the lock contended
//! between the runtime's workers, that took 12% of the server's CPU on
//! the no-database route, which read 68k requests per second with logs on
//! against 90k with them off (BENCHMARKS.md, "Over HTTP"); and once standard error
//! was a full pipe nobody read, every request hung. Here a request hands
//! its line to a bounded queue and goes on; the writer thread takes every
//! line waiting and writes them in blocks of up to 64 KiB: at once after
//! a quiet spell, every 2 ms while lines keep coming.
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
//! took 9% of the server's CPU on the no-database route. Text lines
//! without colours are written by [`TextLines`], byte for byte as the
//! default format writes them, at about two thirds of its cost.

mod clock;
mod json;
mod text;
mod writer;

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use tracing_subscriber::fmt::format::JsonFields;
use tracing_subscriber::EnvFilter;

pub use json::JsonLines;
pub use text::{TextFields, TextLines};
use writer::{write_out, Message, Queue};

/// Lines waiting for the writer thread at most: about 4 MiB of typical
/// lines, and a fifth of a second of `served` lines at 80k requests per
/// second.
pub const QUEUED_LINES: usize = 16_384;

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
        // Colours are for a person at a terminal: the upstream format.
        Format::Text if colour => builder.with_ansi(true).init(),
        Format::Text => builder
            .with_ansi(false)
            .fmt_fields(TextFields)
            .event_format(TextLines)
            .init(),
    }
    LogGuard { queue }
}

/// Lines dropped because the queue to the writer thread was full or
/// standard error refused them, or `None` before [`init`] (tests,
/// embedders with their own subscriber).
pub fn dropped_lines() -> Option<u64> {
    DROPPED.get().map(|dropped| dropped.load(Relaxed))
}
