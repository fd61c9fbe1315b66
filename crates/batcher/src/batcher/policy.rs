//! The flush policy's decisions, as pure functions of the settings and the
//! worker's counts, so each rule is stated once and tested here without a
//! runtime. The worker and the handle only gather the counts and act.

use super::config::{Config, FlushPolicy, Overflow};

/// What the worker knows about the batch it is forming.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Pending {
    /// Distinct keys waiting for the next load.
    pub(crate) keys: usize,
    /// `max_delay` passed since the batch's first key.
    pub(crate) deadline_passed: bool,
    /// Shutting down: nothing waits any more.
    pub(crate) draining: bool,
}

/// Whether the pending batch should go to the loader now, given `running`
/// loads (the worker's and direct ones) of the `limit` that may run now.
/// Taking a free slot is still the caller's job: a due batch waits while
/// every slot is busy.
pub(crate) fn is_due(config: &Config, pending: Pending, running: usize, limit: usize) -> bool {
    if pending.keys == 0 {
        return false;
    }
    let at_once = match config.policy {
        FlushPolicy::Eager => true,
        FlushPolicy::FixedDelay => false,
        // Lightly loaded: no delay. Busy: let the batch fill.
        FlushPolicy::Adaptive => running < limit.div_ceil(2),
    };
    at_once || pending.keys >= config.max_batch_size || pending.deadline_passed || pending.draining
}

/// The most keys the next load may take, with `running` loads of the
/// `limit` that may run now and `waiting` keys pending. Eager, where a
/// slot stays free after it, at most the spread size, so a burst goes out
/// as parallel loads. The load that takes the last free slot takes its
/// share of the backlog, what waits divided among every slot, but never
/// less than the spread size: so batches stay as they are until the
/// backlog outgrows a batch for every slot, and from there grow with it
/// (up to `max_batch_size`) instead of the backlog growing. The policies
/// that wait for a batch to fill promise batches of up to
/// `max_batch_size` (one statement for a GraphQL query's level), so they
/// never spread.
pub(crate) fn load_cap(config: &Config, running: usize, limit: usize, waiting: usize) -> usize {
    let spread = config.spread_batch_size.min(config.max_batch_size);
    if config.policy != FlushPolicy::Eager {
        config.max_batch_size
    } else if running.saturating_add(1) < limit {
        spread
    } else {
        waiting
            .div_ceil(limit.max(1))
            .clamp(spread, config.max_batch_size)
    }
}

/// Whether keys are waiting because of the `limit` in force: every slot
/// is taken, or (adaptive) enough loads run that the policy lets the batch
/// fill instead of sending it. The automatic limit learns only from
/// windows where this happened; elsewhere the limit decided nothing.
pub(crate) fn held_by_limit(
    config: &Config,
    pending: Pending,
    running: usize,
    limit: usize,
) -> bool {
    if pending.keys == 0 {
        return false;
    }
    match config.policy {
        FlushPolicy::Adaptive => running >= limit.div_ceil(2),
        FlushPolicy::Eager | FlushPolicy::FixedDelay => running >= limit,
    }
}

/// Whether a batch's first key starts the `max_delay` timer. The eager
/// policy never waits, so its worker never sets a timer at all.
pub(crate) fn arms_timer(config: &Config) -> bool {
    config.policy != FlushPolicy::Eager
}

/// Whether the settings let a caller that finds the batcher idle run its
/// one-key load itself. The runtime conditions (worker running, a free
/// slot, not shut down) are checked by the handle.
pub(crate) fn allows_direct_loads(config: &Config) -> bool {
    config.direct_when_idle
        // Fixed delay promises the loader full batches, never singles.
        && config.policy != FlushPolicy::FixedDelay
        // Only the worker's loads can be joined.
        && !config.join_in_flight
        // With one slot, a direct load could leave the worker holding keys
        // with no load of its own to wake it (the automatic limit keeps at
        // least two for this reason; see `min_auto_limit`).
        && config.concurrency.max() > 1
}

/// Whether the worker answers [`Error::Timeout`](crate::Error::Timeout) for
/// its waiters itself, so callers need no timer of their own: one timer for
/// the earliest deadline replaces one per request, which registering in
/// Tokio's shared timer wheel made the largest cost per key.
///
/// Only where the worker can see every waiting caller: with
/// [`Overflow::Reject`] it always receives (answering
/// [`Error::Overloaded`](crate::Error::Overloaded) past [`held_limit`]), so
/// no request sits unseen in the channel. [`Overflow::Wait`] leaves messages
/// in the channel to push back on senders, so its callers keep their timers.
pub(crate) fn worker_enforces_deadlines(config: &Config) -> bool {
    config.timeout.is_some() && config.overflow == Overflow::Reject
}

/// The lowest limit the automatic concurrency may choose. Two where callers
/// may load directly: a direct load takes a slot without telling the
/// worker, and only with a second slot can the worker always run a load of
/// its own, whose completion wakes it (at most one direct load runs at a
/// time, since a caller takes that path only by taking the first slot,
/// when no load runs at all).
pub(crate) fn min_auto_limit(config: &Config) -> usize {
    if allows_direct_loads(config) {
        2
    } else {
        1
    }
}

/// The most waiters the worker holds in its pending batches, behind them,
/// and in running loads. Duplicates and joins add waiters without adding
/// keys, so this bounds memory where the key count alone would not: a full
/// batch for every slot, one forming, and a channel's worth.
pub(crate) fn held_limit(config: &Config) -> usize {
    config
        .max_batch_size
        .saturating_mul(config.concurrency.max().saturating_add(1))
        .saturating_add(config.channel_capacity)
}

/// Whether the worker may take another message: the batch is not full and
/// the waiters it holds are under [`held_limit`]. When it may not, messages
/// stay in the bounded channel, which then pushes back on callers, unless
/// the worker [enforces deadlines](worker_enforces_deadlines), which needs
/// to see every request: then it always receives, and keys past a full
/// batch wait behind it in the worker (see [`super::lanes`]).
pub(crate) fn may_accept(config: &Config, pending_keys: usize, held: usize) -> bool {
    pending_keys < config.max_batch_size && held < held_limit(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Concurrency;

    fn config(policy: FlushPolicy) -> Config {
        Config {
            policy,
            max_batch_size: 4,
            concurrency: Concurrency::Fixed(4),
            ..Config::default()
        }
    }

    fn pending(keys: usize) -> Pending {
        Pending {
            keys,
            ..Pending::default()
        }
    }

    #[test]
    fn nothing_pending_is_never_due() {
        for policy in [
            FlushPolicy::Eager,
            FlushPolicy::FixedDelay,
            FlushPolicy::Adaptive,
        ] {
            let all = Pending {
                keys: 0,
                deadline_passed: true,
                draining: true,
            };
            assert!(!is_due(&config(policy), all, 0, 4), "{policy:?}");
        }
    }

    #[test]
    fn eager_is_due_with_any_key() {
        let c = config(FlushPolicy::Eager);
        assert!(is_due(&c, pending(1), 0, 4));
        assert!(
            is_due(&c, pending(1), 3, 4),
            "busy slots do not delay eager"
        );
        assert!(!arms_timer(&c));
    }

    #[test]
    fn fixed_delay_waits_for_a_full_batch_the_deadline_or_shutdown() {
        let c = config(FlushPolicy::FixedDelay);
        assert!(arms_timer(&c));
        assert!(!is_due(&c, pending(3), 0, 4), "idle does not matter");
        assert!(is_due(&c, pending(4), 0, 4), "full");
        let late = Pending {
            deadline_passed: true,
            ..pending(1)
        };
        assert!(is_due(&c, late, 0, 4));
        let draining = Pending {
            draining: true,
            ..pending(1)
        };
        assert!(is_due(&c, draining, 3, 4));
    }

    #[test]
    fn adaptive_is_eager_below_half_the_slots_and_waits_above() {
        let c = config(FlushPolicy::Adaptive);
        assert!(arms_timer(&c));
        assert!(is_due(&c, pending(1), 0, 4));
        assert!(is_due(&c, pending(1), 1, 4), "1 of 4 running is light");
        assert!(!is_due(&c, pending(1), 2, 4), "half running is busy");
        assert!(is_due(&c, pending(4), 3, 4), "a full batch always goes");
        // Odd limits round the threshold up: 3 slots, eager below 2.
        let odd = Config {
            concurrency: Concurrency::Fixed(3),
            ..c
        };
        assert!(is_due(&odd, pending(1), 1, 3));
        assert!(!is_due(&odd, pending(1), 2, 3));
    }

    #[test]
    fn adaptive_follows_the_limit_in_force() {
        let c = Config {
            concurrency: Concurrency::Auto { max: 16 },
            ..config(FlushPolicy::Adaptive)
        };
        assert!(is_due(&c, pending(1), 1, 4), "1 of 4");
        assert!(!is_due(&c, pending(1), 2, 4), "2 of 4");
        assert!(is_due(&c, pending(1), 5, 16), "5 of 16 is light");
    }

    #[test]
    fn keys_are_held_by_the_limit_when_slots_or_the_adaptive_threshold_are_reached() {
        let eager = config(FlushPolicy::Eager);
        assert!(!held_by_limit(&eager, pending(0), 4, 4), "nothing waits");
        assert!(!held_by_limit(&eager, pending(3), 3, 4));
        assert!(held_by_limit(&eager, pending(3), 4, 4));
        let adaptive = config(FlushPolicy::Adaptive);
        assert!(!held_by_limit(&adaptive, pending(3), 1, 4));
        assert!(
            held_by_limit(&adaptive, pending(3), 2, 4),
            "busy: lets the batch fill"
        );
    }

    #[test]
    fn the_automatic_limit_keeps_two_slots_where_callers_load_directly() {
        let auto = Config {
            concurrency: Concurrency::Auto { max: 8 },
            ..config(FlushPolicy::Eager)
        };
        assert_eq!(min_auto_limit(&auto), 2);
        let no_direct = Config {
            direct_when_idle: false,
            ..auto
        };
        assert_eq!(min_auto_limit(&no_direct), 1);
    }

    #[test]
    fn direct_loads_need_the_option_two_slots_and_no_joining() {
        let eager = config(FlushPolicy::Eager);
        assert!(allows_direct_loads(&eager));
        assert!(allows_direct_loads(&config(FlushPolicy::Adaptive)));
        assert!(!allows_direct_loads(&config(FlushPolicy::FixedDelay)));
        let off = Config {
            direct_when_idle: false,
            ..eager.clone()
        };
        let joining = Config {
            join_in_flight: true,
            ..eager.clone()
        };
        let one_slot = Config {
            concurrency: Concurrency::Fixed(1),
            ..eager
        };
        for c in [off, joining, one_slot] {
            assert!(!allows_direct_loads(&c), "{c:?}");
        }
    }

    #[test]
    fn the_worker_holds_a_bounded_number_of_waiters() {
        let c = Config {
            channel_capacity: 10,
            ..config(FlushPolicy::Eager)
        };
        assert_eq!(held_limit(&c), 4 * 5 + 10);
        assert!(may_accept(&c, 3, 29));
        assert!(!may_accept(&c, 4, 0), "batch full");
        assert!(!may_accept(&c, 0, 30), "held limit reached");
        let huge = Config {
            max_batch_size: usize::MAX,
            concurrency: Concurrency::Fixed(usize::MAX),
            ..c
        };
        assert_eq!(held_limit(&huge), usize::MAX, "saturates, never wraps");
    }

    #[test]
    fn a_load_spreads_while_a_slot_stays_free_and_grows_at_the_last() {
        let c = Config {
            max_batch_size: 100,
            spread_batch_size: 8,
            ..config(FlushPolicy::Eager)
        };
        assert_eq!(load_cap(&c, 0, 4, 200), 8, "three slots free after it");
        assert_eq!(load_cap(&c, 2, 4, 200), 8, "one slot free after it");
        assert_eq!(load_cap(&c, 3, 4, 20), 8, "a backlog within a batch a slot");
        assert_eq!(
            load_cap(&c, 3, 4, 33),
            9,
            "its share of a backlog past that"
        );
        assert_eq!(load_cap(&c, 3, 4, 1_000), 100, "never past max_batch_size");
        assert_eq!(load_cap(&c, 0, 1, 50), 50, "one slot: the whole backlog");
        let small = Config {
            max_batch_size: 4,
            ..c.clone()
        };
        assert_eq!(
            load_cap(&small, 0, 4, 200),
            4,
            "spread within max_batch_size"
        );
        assert_eq!(load_cap(&small, 3, 4, 200), 4);
        for waits in [FlushPolicy::FixedDelay, FlushPolicy::Adaptive] {
            let c = Config {
                policy: waits,
                ..c.clone()
            };
            assert_eq!(
                load_cap(&c, 0, 4, 200),
                100,
                "{waits:?} fills batches whole"
            );
        }
    }
}
