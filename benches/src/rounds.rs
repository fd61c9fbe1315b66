//! Interleaved rounds, one way for every tool: the flags that size them
//! ([`RoundArgs`], [`WarmRoundArgs`]), and their summaries, the median
//! round and the range of the rounds, as the tables print them.
//!
//! A tool flattens the flags into its own and keeps its own defaults and
//! help where they differ from these, with `mut_arg` on its `Args`:
//!
//! ```ignore
//! #[derive(clap::Parser)]
//! #[command(mut_arg("rounds", |a| a.default_value("5").help("Interleaved rounds of the contenders")))]
//! struct Args {
//!     #[command(flatten)]
//!     runs: benches::rounds::WarmRoundArgs,
//! }
//! ```

use std::error::Error;
use std::str::FromStr;

/// `--seconds` and `--rounds` of a tool that runs every setup once per
/// round, the rounds interleaved. `S` is `f64`, or `u64` where the runs
/// are wrk's, which counts whole seconds.
#[derive(Debug, Clone, clap::Args)]
pub struct RoundArgs<S = f64>
where
    S: FromStr + Clone + Send + Sync + 'static,
    S::Err: Into<Box<dyn Error + Send + Sync + 'static>>,
{
    /// Seconds per run.
    #[arg(long, default_value = "10")]
    pub seconds: S,
    /// Interleaved rounds.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
}

/// `--rounds`, `--seconds` and `--warmup` of a tool that measures every
/// run after a warm-up of the same load, in interleaved rounds.
#[derive(Debug, Clone, clap::Args)]
pub struct WarmRoundArgs {
    /// Interleaved rounds.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Seconds measured per run.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Seconds of the same load before each run is measured.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
}

impl WarmRoundArgs {
    /// The runs of a smoke run (CI's proof that a tool works): one round
    /// of 0.3 s after 0.1 s of warm-up.
    pub fn smoke(&mut self) {
        self.rounds = 1;
        self.seconds = 0.3;
        self.warmup = 0.1;
    }
}

/// The median of `v` (the upper one of an even count); NaN when empty.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The median of `f` over `v`.
pub fn median_by<T>(v: &[T], f: impl Fn(&T) -> f64) -> f64 {
    median(&v.iter().map(f).collect::<Vec<_>>())
}

/// The least and the greatest of `f` over `v`; (∞, -∞) when empty.
pub fn range_by<T>(v: &[T], f: impl Fn(&T) -> f64) -> (f64, f64) {
    v.iter()
        .map(f)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        })
}

/// `median (min-max)` of `v`, with `digits` decimals: a table cell.
pub fn spread(v: &[f64], digits: usize) -> String {
    let (lo, hi) = range_by(v, |x| *x);
    format!("{:.digits$} ({lo:.digits$}-{hi:.digits$})", median(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_ranges_and_spreads() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 3.0);
        assert!(median(&[]).is_nan());
        assert_eq!(range_by(&[2.0, 5.0, 1.0], |x| *x), (1.0, 5.0));
        assert_eq!(median_by(&[(1, 9.0), (2, 7.0), (3, 8.0)], |p| p.1), 8.0);
        assert_eq!(spread(&[1.04, 0.98, 1.2], 2), "1.04 (0.98-1.20)");
    }

    /// A tool's flags: its own defaults and help through `mut_arg`.
    #[derive(Debug, clap::Parser)]
    #[command(
        mut_arg("seconds", |a| a.default_value("5").help("Seconds per cost run")),
        mut_arg("rounds", |a| a.default_value("7"))
    )]
    struct Tool {
        #[command(flatten)]
        runs: RoundArgs,
    }

    /// A wrk tool's.
    #[derive(Debug, clap::Parser)]
    struct WrkTool {
        #[command(flatten)]
        runs: RoundArgs<u64>,
    }

    /// A tool with a warm-up.
    #[derive(Debug, clap::Parser)]
    struct WarmTool {
        #[command(flatten)]
        runs: WarmRoundArgs,
    }

    #[test]
    fn round_flags_take_each_tools_defaults_and_types() {
        use clap::{CommandFactory as _, Parser as _};
        let t = Tool::try_parse_from(["t"]).expect("defaults");
        assert_eq!((t.runs.seconds, t.runs.rounds), (5.0, 7));
        let t = Tool::try_parse_from(["t", "--seconds", "0.3", "--rounds", "1"]).expect("flags");
        assert_eq!((t.runs.seconds, t.runs.rounds), (0.3, 1));
        let help = Tool::command().render_help().to_string();
        assert!(help.contains("Seconds per cost run [default: 5]"), "{help}");
        assert!(help.contains("Interleaved rounds [default: 7]"), "{help}");

        let w = WrkTool::try_parse_from(["w"]).expect("defaults");
        assert_eq!((w.runs.seconds, w.runs.rounds), (10, 3));
        assert!(WrkTool::try_parse_from(["w", "--seconds", "1.5"]).is_err());

        let w = WarmTool::try_parse_from(["w"]).expect("defaults");
        assert_eq!(
            (w.runs.rounds, w.runs.seconds, w.runs.warmup),
            (3, 3.0, 1.0)
        );
        assert!(Tool::try_parse_from(["t", "--warmup", "1"]).is_err());
    }
}
