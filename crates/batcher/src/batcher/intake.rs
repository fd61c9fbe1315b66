//! A request's way into the worker: handed to the ledger, and whatever the
//! ledger hands back answered at once (from a cache's store, or refused),
//! counted either way.

use std::hash::Hash;

use super::ledger::{Ledger, Placed};
use super::message::{Message, Waiter};
use super::observer::ObserverFn;
use crate::stats::Stats;
use crate::Error;

/// Takes `msg` into `ledger`. `observer` watches the loads (a cache built
/// over the batcher), if any.
pub(crate) fn accept<S, K, V>(
    ledger: &mut Ledger<S, K, Waiter<V>>,
    observer: Option<&ObserverFn<S, K, V>>,
    stats: &Stats,
    msg: Message<S, K, V>,
) where
    S: Clone + Eq + Hash,
    K: Clone + Eq + Hash,
{
    Stats::incr(&stats.requests, 1);
    let observer = observer.filter(|_| msg.stamp.is_some());
    let asked_at = msg.enqueued_at;
    let waiter = Waiter {
        tx: msg.tx,
        enqueued_at: msg.enqueued_at,
        span: msg.span,
        stamp: msg.stamp,
    };
    let placed = match ledger.request(msg.scope, msg.key, waiter) {
        Placed::Unheld(scope, key, waiter) => {
            // Stored while the request waited in the queue (a burst of a
            // GraphQL query's N+1 misses, while earlier loads of the same
            // keys ran): answered now, not loaded again.
            let answer = observer
                .zip(waiter.stamp)
                .and_then(|(o, stamp)| o.answer_now(&scope, &key, stamp, asked_at));
            if let Some(answer) = answer {
                Stats::record_duration(&stats.queue_wait, asked_at.elapsed());
                observer.inspect(|o| o.joined());
                let _ = waiter.tx.send(Ok(answer)); // caller gone; nothing to do
                return;
            }
            ledger.queue(scope, key, waiter)
        }
        placed => placed,
    };
    match placed {
        Placed::Running => {
            Stats::record_duration(&stats.queue_wait, asked_at.elapsed());
            Stats::incr(&stats.joined_in_flight, 1);
            observer.inspect(|o| o.joined());
        }
        Placed::Joined { tagged } => {
            Stats::incr(&stats.deduplicated, 1);
            // A key pending for plain loads only is this request's own
            // load, as far as the observer counts.
            observer.filter(|_| tagged).inspect(|o| o.joined());
        }
        Placed::Gone => Stats::incr(&stats.abandoned, 1),
        Placed::Refused(waiter) => {
            Stats::incr(&stats.overloaded, 1);
            let _ = waiter.tx.send(Err(Error::Overloaded)); // caller gone; nothing to do
        }
        Placed::New | Placed::Unheld(..) => {}
    }
}
