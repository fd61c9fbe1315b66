//! A replica's lag as the age of the newest primary position it reached.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tokio_postgres::types::PgLsn;

/// The primary's WAL positions and when they were read, oldest first, for
/// as long as a lag may matter.
pub(super) struct Samples {
    keep: Duration,
    samples: VecDeque<(Instant, u64)>,
}

impl Samples {
    pub(super) fn new(keep: Duration) -> Self {
        Self {
            keep,
            samples: VecDeque::new(),
        }
    }

    pub(super) fn push(&mut self, at: Instant, lsn: PgLsn) {
        let samples = &mut self.samples;
        samples.push_back((at, u64::from(lsn)));
        while samples
            .front()
            .is_some_and(|(t, _)| at.duration_since(*t) > self.keep)
        {
            samples.pop_front();
        }
    }

    /// How old the data of a replica that replayed up to `replay` is at
    /// `now`: the age of the newest sample it has reached, or `None` if it
    /// has reached none kept (or there is none).
    pub(super) fn lag(&self, replay: u64, now: Instant) -> Option<Duration> {
        self.samples
            .iter()
            .rev()
            .find(|(_, lsn)| *lsn <= replay)
            .map(|(t, _)| now.saturating_duration_since(*t))
    }
}

pub(super) fn as_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_the_age_of_the_newest_sample_reached() {
        let t0 = Instant::now();
        let mut s = Samples::new(Duration::from_secs(10));
        s.push(t0, PgLsn::from(100));
        s.push(t0 + Duration::from_secs(1), PgLsn::from(200));
        s.push(t0 + Duration::from_secs(2), PgLsn::from(300));
        let now = t0 + Duration::from_secs(3);
        assert_eq!(s.lag(300, now), Some(Duration::from_secs(1)));
        assert_eq!(s.lag(250, now), Some(Duration::from_secs(2)));
        assert_eq!(s.lag(99, now), None);
    }

    #[test]
    fn old_samples_are_dropped() {
        let t0 = Instant::now();
        let mut s = Samples::new(Duration::from_secs(1));
        s.push(t0, PgLsn::from(100));
        s.push(t0 + Duration::from_secs(5), PgLsn::from(200));
        assert_eq!(s.lag(150, t0 + Duration::from_secs(5)), None);
    }
}
