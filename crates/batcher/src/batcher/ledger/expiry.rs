//! Deadlines: which waiters' time is up, wherever they wait, and when the
//! next one's is.

use std::hash::Hash;
use std::mem;

use tokio::time::Instant;

use super::{earliest, Expired, Ledger, Request, Waiters};
use crate::batcher::policy;
use crate::error::Waited;

impl<S, K, W> Ledger<S, K, W>
where
    S: Clone + Eq + Hash,
    K: Clone + Eq + Hash,
    W: Request,
{
    /// Takes out every waiter whose deadline passed by `now`: pending,
    /// behind a full batch, or in a running load (which goes on for the
    /// others). Tightens the expiry bounds.
    pub(crate) fn expire(&mut self, now: Instant) -> Expired<W> {
        let mut expired = Vec::new();
        if !policy::worker_enforces_deadlines(&self.config) {
            return expired;
        }
        let config = &self.config;
        let deadline = |at: Instant| config.deadline(at);
        let due = |at: Instant| deadline(at).is_some_and(|d| d <= now);
        let mut sweep = |waiters: &mut Waiters<W>, left: &mut Option<Instant>, waited: Waited| {
            // Most keys have nothing expired: leave those as they are.
            if !waiters.iter().any(|w| due(w.asked_at())) {
                for w in waiters.iter() {
                    *left = earliest(*left, deadline(w.asked_at()));
                }
                return;
            }
            for w in mem::take(waiters) {
                let d = deadline(w.asked_at());
                if d.is_some_and(|d| d <= now) {
                    expired.push((w, waited));
                } else {
                    *left = earliest(*left, d);
                    waiters.push(w);
                }
            }
        };
        if self.pending_expiry.is_some_and(|e| e <= now) {
            let mut left = None;
            self.lanes.sweep_pending(|lane| {
                lane.pending.retain(|_, waiters| {
                    sweep(waiters, &mut left, Waited::ForALoad);
                    !waiters.is_empty()
                });
                let next = lane.sweep_later(due, |waiters| {
                    sweep(waiters, &mut left, Waited::ForALoad);
                });
                left = earliest(left, next.and_then(deadline));
            });
            self.pending_expiry = left;
        }
        self.running.sweep(now, |waiters, left, ran| {
            sweep(waiters, left, Waited::InALoad(ran));
        });
        self.held -= expired.len();
        expired
    }

    /// No waiter's deadline is earlier, where the worker enforces them.
    pub(crate) fn expiry_at(&self) -> Option<Instant> {
        if !policy::worker_enforces_deadlines(&self.config) {
            return None;
        }
        earliest(self.pending_expiry, self.running.expiry())
    }

    /// The moment `waiter` times out, where the worker enforces it.
    pub(super) fn deadline_of(&self, waiter: &W) -> Option<Instant> {
        if !policy::worker_enforces_deadlines(&self.config) {
            return None;
        }
        self.config.deadline(waiter.asked_at())
    }
}
