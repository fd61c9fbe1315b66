//! The timestamp of a line, as tracing-subscriber's `SystemTime` writes it
//! (RFC 3339 in UTC with microseconds: `2026-11-25T09:40:00.123456Z`), with
//! the date and time of day made once per second and thread: made for
//! every line, through `fmt` and a conversion to the calendar, they took
//! 1.7% of the server's CPU on the no-database route (BENCHMARKS.md, "Over HTTP").

use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime as _;

/// `YYYY-MM-DDTHH:MM:SS.`: the part of a timestamp that holds for a second.
const SECOND_LENGTH: usize = 20;

thread_local! {
    /// The second last written on this thread, and its text.
    static SECOND: RefCell<(u64, String)> =
        const { RefCell::new((u64::MAX, String::new())) };
}

/// Writes the time now.
pub(super) fn write_now(out: &mut Writer<'_>) -> fmt::Result {
    match write_at(SystemTime::now(), out) {
        Some(written) => written,
        // A clock before 1970 or past 9999: as tracing-subscriber would.
        None => tracing_subscriber::fmt::time::SystemTime.format_time(out),
    }
}

/// Writes `at`, or `None` if it is before the epoch or past the year 9999.
fn write_at(at: SystemTime, out: &mut impl fmt::Write) -> Option<fmt::Result> {
    let since = at.duration_since(UNIX_EPOCH).ok()?;
    let secs = since.as_secs();
    SECOND.with_borrow_mut(|(second, text)| {
        if *second != secs {
            let at = time::OffsetDateTime::from_unix_timestamp(i64::try_from(secs).ok()?).ok()?;
            text.clear();
            write!(
                text,
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.",
                at.year(),
                u8::from(at.month()),
                at.day(),
                at.hour(),
                at.minute(),
                at.second()
            )
            .ok()?;
            debug_assert_eq!(text.len(), SECOND_LENGTH, "{text}");
            *second = secs;
        }
        let mut micros = [b'0'; 7];
        micros[6] = b'Z';
        let mut n = since.subsec_micros();
        for digit in micros[..6].iter_mut().rev() {
            *digit = b'0' + (n % 10) as u8;
            n /= 10;
        }
        let micros = std::str::from_utf8(&micros).expect("ASCII digits");
        Some(out.write_str(text).and_then(|()| out.write_str(micros)))
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(secs: u64, micros: u64) -> String {
        let mut text = String::new();
        write_at(
            UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros),
            &mut text,
        )
        .expect("in range")
        .unwrap();
        text
    }

    #[test]
    fn timestamps_are_rfc_3339_in_utc_with_microseconds() {
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(951_782_400, 1), "2000-02-29T00:00:00.000001Z");
        assert_eq!(at(1_795_599_599, 999_999), "2026-11-25T09:39:59.999999Z");
        // The next second on the same thread makes its text again.
        assert_eq!(at(1_795_599_600, 120_000), "2026-11-25T09:40:00.120000Z");
        assert_eq!(at(253_402_300_799, 5), "9999-12-31T23:59:59.000005Z");
        let mut text = String::new();
        assert!(write_at(UNIX_EPOCH + Duration::from_secs(253_402_300_800), &mut text).is_none());
        assert!(write_at(UNIX_EPOCH - Duration::from_secs(1), &mut text).is_none());
    }

    #[test]
    fn the_time_now_reads_as_tracing_subscribers() {
        // Compared within one second (retried across a boundary), up to
        // the microseconds, which differ between the two calls.
        for _ in 0..100 {
            let mut ours = String::new();
            let mut theirs = String::new();
            write_now(&mut Writer::new(&mut ours)).unwrap();
            tracing_subscriber::fmt::time::SystemTime
                .format_time(&mut Writer::new(&mut theirs))
                .unwrap();
            assert_eq!(ours.len(), theirs.len(), "{ours} against {theirs}");
            if ours[..SECOND_LENGTH] == theirs[..SECOND_LENGTH] {
                assert!(ours.ends_with('Z'), "{ours}");
                return;
            }
        }
        panic!("never within one second");
    }
}
