//! Text lines without colours, as tracing-subscriber's default format
//! writes them, for less.
//!
//! That format writes each field through `fmt` machinery made for colours
//! (a name and an `=` painted with no style, each a `Display` call of its
//! own), a string field through `Debug`'s escaping, and a message
//! character by character through its escaping of terminal
//! controls; together with its timestamp that was 7% of the server's CPU
//! on the no-database route, and formatting the `request` span's fields
//! when it is made 3% (BENCHMARKS.md, "Over HTTP"). [`TextFields`] writes the common
//! cases (plain strings, integers, latencies) whole and leaves the rest to
//! the same `Debug` output; [`TextLines`] writes the line around them.
//! A unit test holds both to the upstream format's output, byte for byte.
//! With colours (a terminal) the upstream format is used as it is.

use std::cell::RefCell;
use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::{RecordFields, VisitOutput as _};
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use super::clock;

/// Writes an event as `timestamp level spans: target: fields`, as
/// tracing-subscriber's default (`Full`) format does without colours.
#[derive(Debug, Clone, Copy, Default)]
pub struct TextLines;

impl<S> FormatEvent<S, TextFields> for TextLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, TextFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        clock::write_now(&mut writer)?;
        writer.write_char(' ')?;
        // Padded to five, as the upstream format pads them.
        writer.write_str(match *meta.level() {
            Level::TRACE => "TRACE ",
            Level::DEBUG => "DEBUG ",
            Level::INFO => " INFO ",
            Level::WARN => " WARN ",
            Level::ERROR => "ERROR ",
        })?;
        if let Some(scope) = ctx.event_scope() {
            let mut seen = false;
            for span in scope.from_root() {
                writer.write_str(span.metadata().name())?;
                seen = true;
                if let Some(fields) = span.extensions().get::<FormattedFields<TextFields>>() {
                    if !fields.is_empty() {
                        writer.write_char('{')?;
                        writer.write_str(fields)?;
                        writer.write_char('}')?;
                    }
                }
                writer.write_char(':')?;
            }
            if seen {
                writer.write_char(' ')?;
            }
        }
        writer.write_str(meta.target())?;
        writer.write_str(": ")?;
        ctx.format_fields(writer.by_ref(), event)?;
        writer.write_char('\n')
    }
}

/// Writes fields as `name=value`, separated by spaces, the message first
/// without its name, as tracing-subscriber's `DefaultFields` does without
/// colours; also the fields of spans, kept as text when a span is made.
#[derive(Debug, Clone, Copy, Default)]
pub struct TextFields;

impl<'writer> FormatFields<'writer> for TextFields {
    /// Writes the fields to a buffer of the thread's, then to `writer` at
    /// once: a span's fields go to a `String` of their own, which grew
    /// four or five times per request span, written field by field (1% of
    /// the server's CPU on the no-database route).
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        thread_local! {
            static FIELDS: RefCell<String> = const { RefCell::new(String::new()) };
        }
        let record = |writer: Writer<'_>| {
            let mut visitor = Visitor {
                writer,
                is_empty: true,
                result: Ok(()),
            };
            fields.record(&mut visitor);
            visitor.result
        };
        FIELDS.with(|buffer| match buffer.try_borrow_mut() {
            Ok(mut buffer) => {
                buffer.clear();
                record(Writer::new(&mut *buffer))?;
                writer.write_str(&buffer)
            }
            // Formatting fields while formatting fields, which tracing
            // does not do (it drops events logged inside a subscriber):
            // straight to `writer` rather than a panic.
            Err(_) => record(writer),
        })
    }
}

/// The field `message`, written without its name.
const MESSAGE: &str = "message";

/// Writes the fields of one event or span.
struct Visitor<'a> {
    writer: Writer<'a>,
    is_empty: bool,
    result: fmt::Result,
}

impl Visitor<'_> {
    /// `name=`, after a space unless it is the first field.
    fn name(&mut self, field: &Field) -> fmt::Result {
        self.pad()?;
        let name = field.name();
        self.writer
            .write_str(name.strip_prefix("r#").unwrap_or(name))?;
        self.writer.write_char('=')
    }

    fn pad(&mut self) -> fmt::Result {
        if std::mem::take(&mut self.is_empty) {
            Ok(())
        } else {
            self.writer.write_char(' ')
        }
    }

    /// `value` as `Debug` writes it, its terminal controls escaped as
    /// tracing-subscriber escapes a message's.
    fn message(&mut self, value: &dyn fmt::Debug) -> fmt::Result {
        self.pad()?;
        write!(Sanitizing(&mut self.writer), "{value:?}")
    }

    /// A number or a bool as `name=value`, its value written by `write`
    /// as `Debug` would write it; as the message, through `Debug`.
    fn scalar<T: fmt::Debug>(
        &mut self,
        field: &Field,
        value: T,
        write: impl FnOnce(&mut Writer<'_>, T) -> fmt::Result,
    ) {
        if field.name() == MESSAGE {
            return self.record_debug(field, &value);
        }
        self.field(|v| {
            v.name(field)?;
            write(&mut v.writer, value)
        });
    }

    /// Writes one field unless an earlier one failed.
    fn field(&mut self, write: impl FnOnce(&mut Self) -> fmt::Result) {
        if self.result.is_ok() {
            self.result = write(self);
        }
    }
}

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.field(|v| {
            if field.name() == MESSAGE {
                return v.message(&format_args!("{value}"));
            }
            v.name(field)?;
            // What `Debug` writes for a string that needs no escapes.
            if value
                .bytes()
                .all(|b| matches!(b, b' '..=b'~') && b != b'"' && b != b'\\')
            {
                v.writer.write_char('"')?;
                v.writer.write_str(value)?;
                v.writer.write_char('"')
            } else {
                write!(v.writer, "{value:?}")
            }
        });
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.scalar(field, value, write_integer);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.scalar(field, value, write_integer);
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.scalar(field, value, write_f64);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.scalar(field, value, |w, b| {
            w.write_str(if b { "true" } else { "false" })
        });
    }

    /// An error with its sources: rare, and written by the upstream
    /// visitor, which lists the sources its own way.
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.field(|v| {
            let mut upstream = DefaultVisitor::new(v.writer.by_ref(), v.is_empty);
            upstream.record_error(field, value);
            v.is_empty = false;
            upstream.finish()
        });
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.field(|v| {
            if field.name() == MESSAGE {
                return v.message(value);
            }
            v.name(field)?;
            write!(v.writer, "{value:?}")
        });
    }
}

/// `value` in decimal, as `Debug` writes an integer.
fn write_integer(out: &mut Writer<'_>, value: impl itoa::Integer) -> fmt::Result {
    out.write_str(itoa::Buffer::new().format(value))
}

/// `value` as `Debug` writes it: a latency in milliseconds (nanoseconds
/// over a million) without `fmt`'s float formatting, which took 1.2% of the
/// server's CPU per `served` line, anything else through it.
fn write_f64(out: &mut Writer<'_>, value: f64) -> fmt::Result {
    // In this range `Debug` writes decimals, not exponents. A value that is
    // a whole number of millionths is the double nearest that decimal, and
    // below 1e9 doubles are closer together than millionths, so the
    // shortest decimal `Debug` looks for is that one, without its trailing
    // zeros (and at least one digit after the point).
    let millionths = (value * 1e6).round();
    if !(1e-4..1e9).contains(&value) || millionths / 1e6 != value {
        return write!(out, "{value:?}");
    }
    let millionths = millionths as u64;
    write_integer(out, millionths / 1_000_000)?;
    let fraction = millionths % 1_000_000;
    if fraction == 0 {
        return out.write_str(".0");
    }
    let mut text = *b".000000";
    let mut rest = fraction;
    for digit in text[1..].iter_mut().rev() {
        *digit = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    // Without trailing zeros: the fraction has a digit that is not 0.
    let end = text
        .iter()
        .rposition(|&d| d != b'0')
        .map_or(text.len(), |at| at + 1);
    out.write_str(std::str::from_utf8(&text[..end]).expect("ASCII digits"))
}

/// Escapes terminal controls as tracing-subscriber escapes a message's (its
/// escaping is private): ESC, BEL, BS, FF and DEL as `\x..`, the C1
/// controls (U+0080 to U+009F) as `\u{..}`; text without them is written
/// whole rather than a character at a time.
struct Sanitizing<'a, 'w>(&'a mut Writer<'w>);

impl fmt::Write for Sanitizing<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // C1 controls are `0xC2 0x80..=0x9F` in UTF-8.
        if !s
            .bytes()
            .any(|b| matches!(b, 0x1b | 0x07 | 0x08 | 0x0c | 0x7f | 0xc2))
        {
            return self.0.write_str(s);
        }
        for c in s.chars() {
            match c {
                '\x1b' => self.0.write_str("\\x1b")?,
                '\x07' => self.0.write_str("\\x07")?,
                '\x08' => self.0.write_str("\\x08")?,
                '\x0c' => self.0.write_str("\\x0c")?,
                '\x7f' => self.0.write_str("\\x7f")?,
                '\u{80}'..='\u{9f}' => write!(self.0, "\\u{{{:x}}}", c as u32)?,
                c => self.0.write_char(c)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::fmt::format::DefaultFields;

    use crate::logs::writer::tests::Buffer;

    use super::*;

    /// Events with every kind of field, outside any span, in spans with
    /// fields to escape, nested, with an explicit parent, and in a span
    /// whose field was recorded after it was made.
    fn emit() {
        tracing::info!(status = 200u64, latency_ms = 0.003757, "served");
        tracing::info!(
            latency_ms = 12.0,
            n = -3i64,
            yes = true,
            ratio = 1.5e-7,
            big = 1e20
        );
        tracing::info!(
            latency_ms = 1_234.000_5,
            tiny = 0.0001,
            zero = 0.0,
            neg = -2.5
        );
        tracing::info!(r#type = "raw name", message = 5u64);
        // Written as any field: upstream skips `log.` fields only with its
        // `tracing-log` feature, which would fail this test if turned on.
        tracing::info!(log.line = 3u64, "a log. field");
        // A field whose `Debug` logs while fields are formatted: tracing
        // drops that event (a subscriber is not re-entered), the line is whole.
        tracing::info!(logs = ?Logging, after = 1u64, "outer");
        let alone = tracing::info_span!("alone", n = 1u64);
        tracing::info!(parent: &alone, "explicit parent, no span entered");
        let request = tracing::info_span!(
            "request",
            method = %"GET",
            route = "/api/v1/repositories/{repo}/objects/stat",
            request_id = "an \"id\"\nwith\\escapes",
        );
        let _entered = request.enter();
        tracing::warn!(answer = true, text = "tab\tand ünïcode", "inside one");
        tracing::warn!("a message with \x1b[31mcontrols\x07\x08\x0c\x7f and \u{9b}C1 \u{a0}");
        for control in [
            '\x1b', '\x07', '\x08', '\x0c', '\x7f', '\u{80}', '\u{9f}', '\u{a0}',
        ] {
            tracing::warn!("only {control} here");
        }
        tracing::warn!(quote = "say \"hi\" \\ back", "{} interpolated", 3);
        tracing::warn!(
            only_quote = "a \"b\"",
            only_backslash = r"a\b",
            tilde = "~ \x7f"
        );
        tracing::info_span!("load").in_scope(|| tracing::error!(n = -3i64, "nested"));
        let detached = tracing::info_span!(parent: None, "detached", key = 7u64);
        tracing::info!(parent: &detached, "explicit parent");
        let later = tracing::info_span!("later", value = tracing::field::Empty);
        later.record("value", "set after");
        later.record("value", 2u64);
        later.in_scope(|| tracing::debug!(ratio = 1.5f64, "recorded"));
        let error = Outer(std::io::Error::other("the cause"));
        tracing::error!(
            error = &error as &(dyn std::error::Error + 'static),
            "failed"
        );
        tracing::trace!(debug = ?Some("x\u{1b}"), display = %"shown\u{1b}", "levels");
    }

    /// Logs when formatted.
    struct Logging;

    impl fmt::Debug for Logging {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            tracing::info!(inner = "yes", "logged while formatting");
            f.write_str("Logging")
        }
    }

    /// An error with a source.
    #[derive(Debug)]
    struct Outer(std::io::Error);

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("the outcome")
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// The lines [`emit`] gives, written by [`TextLines`] or by
    /// tracing-subscriber's default format without colours, each without
    /// its timestamp (which tests of `clock` check).
    fn lines(ours: bool) -> Vec<String> {
        let buffer = Buffer::default();
        let builder = tracing_subscriber::fmt()
            .with_max_level(Level::TRACE)
            .with_ansi(false)
            .with_writer(buffer.clone());
        if ours {
            let subscriber = builder
                .fmt_fields(TextFields)
                .event_format(TextLines)
                .finish();
            tracing::subscriber::with_default(subscriber, emit);
        } else {
            let subscriber = builder.fmt_fields(DefaultFields::new()).finish();
            tracing::subscriber::with_default(subscriber, emit);
        }
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        text.split_inclusive('\n')
            .map(|line| {
                let (timestamp, rest) = line.split_once(' ').unwrap();
                assert_eq!(timestamp.len(), 27, "{line}");
                rest.to_owned()
            })
            .collect()
    }

    #[test]
    fn text_lines_say_what_the_default_format_says() {
        let ours = lines(true);
        assert_eq!(ours.len(), 24, "{ours:#?}");
        assert_eq!(ours, lines(false));
        // What the fast paths took.
        assert!(
            ours[0].ends_with("served status=200 latency_ms=0.003757\n"),
            "{}",
            ours[0]
        );
        assert!(
            ours[5].ends_with("outer logs=Logging after=1\n"),
            "{}",
            ours[5]
        );
        assert!(ours[7].contains(r#"route="/api/v1/repositories/{repo}/objects/stat""#));
        assert!(
            ours[22].contains("error=the outcome error.sources=[the cause]"),
            "{}",
            ours[22]
        );
        assert!(
            ours[8].contains(r"\x1b[31mcontrols\x07\x08\x0c\x7f and \u{9b}C1"),
            "{}",
            ours[8]
        );
    }

    #[test]
    fn latencies_read_as_debug_writes_them() {
        let mut values: Vec<f64> = (0..2_000_000u64)
            .step_by(7)
            .map(|n| n as f64 / 1e6)
            .collect();
        values.extend(
            (0..200_000u64).map(|n| (n * 4_999_999_937 % 999_999_999_999_999) as f64 / 1e6),
        );
        values.extend([
            1.0,
            12.0,
            999.0,
            1e-4,
            9.9e-5,
            1e9,
            999_999_999.999_999,
            0.1 + 0.2,
            1.0 / 3.0,
            f64::NAN,
            -0.0,
        ]);
        let mut ours = String::new();
        for value in values {
            ours.clear();
            write_f64(&mut Writer::new(&mut ours), value).unwrap();
            assert_eq!(ours, format!("{value:?}"));
        }
    }
}
