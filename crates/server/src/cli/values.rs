//! The flags' value types (each converting to its setting) and parsers.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use clap::ValueEnum;

use crate::settings::{defaults, Pooler, ReadPath, SslMode};

pub(super) fn parse_sslmode(name: &str) -> Result<SslMode, String> {
    SslMode::parse(name).map_err(|e| e.to_string())
}

/// A token's lifetime: a positive whole number with `s`, `m`, `h` or `d`
/// (`90d`, `12h`), up to 100 years.
///
/// # Errors
///
/// A message naming the accepted form.
pub fn parse_expiry(text: &str) -> Result<Duration, String> {
    const UNITS: [(&str, u64); 4] = [
        ("s", 1_000),
        ("m", 60_000),
        ("h", 3_600_000),
        ("d", 86_400_000),
    ];
    let range = 1_000..=100 * 365 * 86_400_000;
    parse_duration(text, &UNITS, "30m, 12h or 90d (s, m, h or d)", range)
        .map_err(|e| e.unwrap_or_else(|| format!("`{text}`: a token lifetime is 1 s to 100 years")))
}

/// A replica lag bound: a whole number with `ms`, `s` or `m` (`500ms`,
/// `5s`), from 1 ms to 1 hour.
///
/// # Errors
///
/// A message naming the accepted form.
pub fn parse_lag(text: &str) -> Result<Duration, String> {
    const UNITS: [(&str, u64); 3] = [("ms", 1), ("s", 1_000), ("m", 60_000)];
    parse_duration(text, &UNITS, "500ms, 5s or 2m (ms, s or m)", 1..=3_600_000).map_err(|e| {
        e.unwrap_or_else(|| format!("`{text}`: a replica lag bound is 1 ms to 1 hour"))
    })
}

/// A whole number followed by one of `units` (each with its length in
/// milliseconds), within `range` milliseconds. Hand-written: the flags
/// take a few units in one form, and a parser crate (humantime) would
/// accept far more forms than docs/configuration.md documents.
///
/// # Errors
///
/// `Some(message)` naming the accepted `forms` when the text is not of
/// that shape; `None` when it is but lies outside `range`.
fn parse_duration(
    text: &str,
    units: &[(&str, u64)],
    forms: &str,
    range: std::ops::RangeInclusive<u64>,
) -> Result<Duration, Option<String>> {
    let bad = || Some(format!("`{text}` is not a duration such as {forms}"));
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let (_, unit_ms) = units.iter().find(|(u, _)| *u == unit).ok_or_else(bad)?;
    let ms = n
        .checked_mul(*unit_ms)
        .filter(|ms| range.contains(ms))
        .ok_or(None)?;
    Ok(Duration::from_millis(ms))
}

/// `--pooler`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PoolerArg {
    /// Found out at start.
    Auto,
    /// A direct connection.
    None,
    /// A session-mode pooler.
    Session,
    /// A transaction-mode pooler.
    Transaction,
}

impl From<PoolerArg> for Pooler {
    fn from(arg: PoolerArg) -> Self {
        match arg {
            PoolerArg::Auto => Self::Auto,
            PoolerArg::None => Self::None,
            PoolerArg::Session => Self::Session,
            PoolerArg::Transaction => Self::Transaction,
        }
    }
}

/// How lookups reach Postgres, as a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReadPathArg {
    /// One statement per lookup, through the pool.
    Naive,
    /// Concurrent lookups coalesced by the batcher into one statement.
    Batched,
    /// A coalescing TTL cache in front of the batched path.
    Cached,
}

impl From<ReadPathArg> for ReadPath {
    fn from(arg: ReadPathArg) -> Self {
        match arg {
            ReadPathArg::Naive => Self::Naive,
            ReadPathArg::Batched => Self::Batched,
            ReadPathArg::Cached => Self::Cached,
        }
    }
}

impl From<ReadPath> for ReadPathArg {
    fn from(path: ReadPath) -> Self {
        match path {
            ReadPath::Naive => Self::Naive,
            ReadPath::Batched => Self::Batched,
            ReadPath::Cached => Self::Cached,
        }
    }
}

/// Which loaded values a cache stores, as a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AdmissionArg {
    /// Every loaded value.
    Always,
    /// A key's value from its second miss within a window on.
    SecondMiss,
}

impl From<AdmissionArg> for pgbatch::cache::Admission {
    fn from(arg: AdmissionArg) -> Self {
        match arg {
            AdmissionArg::Always => Self::Always,
            AdmissionArg::SecondMiss => Self::SecondMiss,
        }
    }
}

/// Whether a cache is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    /// Used.
    On,
    /// Not used.
    Off,
}

impl From<bool> for OnOff {
    fn from(on: bool) -> Self {
        if on {
            Self::On
        } else {
            Self::Off
        }
    }
}

/// The batcher's flush policy, as a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// Dispatch whenever a load slot is free.
    Eager,
    /// Dispatch when full or `--batch-delay-us` after the first key.
    FixedDelay,
    /// Eager while fewer than half the batch slots are busy, fixed-delay
    /// beyond.
    Adaptive,
}

impl From<PolicyArg> for pgbatch::FlushPolicy {
    fn from(arg: PolicyArg) -> Self {
        match arg {
            PolicyArg::Eager => Self::Eager,
            PolicyArg::FixedDelay => Self::FixedDelay,
            PolicyArg::Adaptive => Self::Adaptive,
        }
    }
}

impl PolicyArg {
    /// The flag value for `policy`, if it has one.
    pub fn of(policy: pgbatch::FlushPolicy) -> Option<Self> {
        Self::value_variants()
            .iter()
            .copied()
            .find(|arg| pgbatch::FlushPolicy::from(*arg) == policy)
    }
}

/// `--batch-concurrency`: `auto`, or a fixed number of statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConcurrencyArg(pub pgbatch::Concurrency);

impl FromStr for ConcurrencyArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(Self(defaults::READ_CONCURRENCY));
        }
        match s.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Self(pgbatch::Concurrency::Fixed(n))),
            _ => Err(format!(
                "`{s}` is neither `auto` nor a number of statements (1 or more)"
            )),
        }
    }
}

impl fmt::Display for ConcurrencyArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            pgbatch::Concurrency::Fixed(n) => write!(f, "{n}"),
            _ => f.write_str("auto"),
        }
    }
}
