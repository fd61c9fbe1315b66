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

use std::io::Write;
use std::sync::OnceLock;

use clap::ValueEnum;
use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
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
        LogFormat::Json => builder.json().init(),
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
