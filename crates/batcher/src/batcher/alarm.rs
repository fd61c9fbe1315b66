//! The worker's timers.

use std::pin::Pin;

use tokio::time::{Instant, Sleep};

/// A timer the worker polls only while it is armed, so an idle worker
/// never wakes up. Its `Sleep` is made at the first arming: a worker is
/// made outside a runtime (the builder reports that as an error, not a
/// panic).
pub(crate) struct Alarm {
    sleep: Option<Pin<Box<Sleep>>>,
    at: Option<Instant>,
}

impl Alarm {
    pub(crate) fn new() -> Self {
        Self {
            sleep: None,
            at: None,
        }
    }

    /// When it is set for, if it is.
    pub(crate) fn at(&self) -> Option<Instant> {
        self.at
    }

    /// Resolves when the alarm goes off; poll it only while it is set.
    pub(crate) async fn fired(&mut self) {
        if let Some(sleep) = &mut self.sleep {
            sleep.as_mut().await;
        }
    }

    /// Sets the alarm for `at` if that is earlier, or if it is not set;
    /// disarms it for `None`.
    pub(crate) fn set_earlier(&mut self, at: Option<Instant>) {
        if self.at.is_none_or(|set| at.is_none_or(|at| at < set)) {
            self.set(at);
        }
    }

    /// Sets the alarm for `at`, or disarms it. An unchanged one is left
    /// alone: resetting a timer costs about what a request does.
    pub(crate) fn set(&mut self, at: Option<Instant>) {
        if at == self.at {
            return;
        }
        if let Some(at) = at {
            match &mut self.sleep {
                Some(sleep) => sleep.as_mut().reset(at),
                None => self.sleep = Some(Box::pin(tokio::time::sleep_until(at))),
            }
        }
        self.at = at;
    }
}
