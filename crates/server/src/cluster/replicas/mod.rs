//! Read replicas: which database a read goes to.
//!
//! Writes and the invalidation listener always use the primary. A read
//! (a lookup's load, a token lookup) goes to a replica that is usable for
//! what the read [`Needs`], else to the primary:
//!
//! - A replica is usable while its last poll answered, it is still in
//!   recovery, and it lags at most `max_lag`. Lag is measured against the
//!   primary's own WAL position, sampled at each poll: a replica whose
//!   replay position has reached the sample taken at time `t` holds every
//!   change committed before `t`, so its lag is the age of the newest
//!   sample it has reached. That holds whether the primary is busy or idle
//!   (the replay timestamp alone does not), and a replica cut off from its
//!   primary shows its lag growing.
//! - [`Needs::Any`] (reads without a position): any usable replica.
//! - [`Needs::Position`] (a client presented a write's position,
//!   read-your-writes): only a replica whose polled replay position has
//!   reached it. The polled position is the last answer, not the highest
//!   ever seen: a replica that restarted after a crash may resume at an
//!   earlier one (between a restart and the next poll, 100 ms, a read may
//!   still rely on the older answer).
//! - [`Needs::CacheFill`] (a cache's miss): a cached value must not be older
//!   than an invalidation this instance has applied, or it would stay in
//!   the cache until its TTL. So after each invalidation the listener reads
//!   the primary's position ([`ReadRouter::settle`]); until it has, fills go
//!   to the primary, and after, only to a replica that has replayed that
//!   far. While the listener is down (nothing is cached then) they go to
//!   the primary too.
//!
//! A replica that fails a read (connection lost, server stopped, slower
//! than half the read deadline) is skipped until its next good poll, and
//! the read is run again on the primary within the same deadline: a
//! replica that dies fails no request.

//!
//! One file per role: `routing` (choosing a database, the retry on the
//! primary), `tickets` (invalidations that hold cache fills back until
//! settled), `poller` (the replicas' positions and usability), `lag` (the
//! arithmetic of a lag), `loader` (the batched loader over the router).

mod lag;
mod loader;
mod poller;
mod routing;
mod tickets;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pgbatch::pg::{Pool, Statements};
use tokio_postgres::types::PgLsn;

pub use self::loader::RoutedLoader;
pub use self::routing::{Fallback, Needs};
use crate::cluster::coherence::Coherence;
use crate::db::Postgres;
use crate::settings::ReplicaSettings;

/// Where reads go. Cheap to clone. Built from a [`Pool`] alone, every read
/// goes to it (one database, no replicas).
#[derive(Debug, Clone)]
pub struct ReadRouter(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    /// Index 0 is the primary, `i + 1` is `replicas[i]`.
    pools: Vec<Pool>,
    /// How reads send their statements on these pools (unnamed behind a
    /// transaction-mode pooler; see [`crate::db::Pooler`]).
    statements: Statements,
    replicas: Vec<Replica>,
    max_lag: Duration,
    /// How long a replica may take before the read is run on the primary.
    replica_budget: Duration,
    next: AtomicUsize,
    coherence: Coherence,
    /// Invalidations begun, and the last one whose position is known.
    invalidations: AtomicU64,
    settled: AtomicU64,
    /// The primary's position read after the last settled invalidation.
    fill_floor: AtomicU64,
    /// Wakes the listener to read the position for [`ReadRouter::settle`].
    position_wanted: tokio::sync::Notify,
    primary_reads: AtomicU64,
    fallbacks: [AtomicU64; 4],
}

/// One replica's pool and polled state.
#[derive(Debug)]
struct Replica {
    name: String,
    target: Postgres,
    usable: AtomicBool,
    /// Replayed WAL position, as last polled (0: never).
    replay: AtomicU64,
    /// Lag in microseconds, as last polled.
    lag_us: AtomicU64,
    reads: AtomicU64,
    failures: AtomicU64,
}

/// One replica's state, for `/metrics` and logs.
#[derive(Debug, Clone)]
pub struct ReplicaStatus {
    /// `host:port` (or socket directory) of the replica.
    pub name: String,
    /// Whether reads may go to it now.
    pub usable: bool,
    /// Its lag at the last poll.
    pub lag: Duration,
    /// Its replay position at the last poll.
    pub replay: PgLsn,
    /// Reads it answered.
    pub reads: u64,
    /// Reads it failed, and polls it did not answer.
    pub failures: u64,
}

impl From<Pool> for ReadRouter {
    fn from(primary: Pool) -> Self {
        Self::new(
            primary,
            Vec::new(),
            Statements::default(),
            &ReplicaSettings::default(),
            crate::settings::defaults::REQUEST_TIMEOUT,
            Coherence::default(),
        )
    }
}

impl From<&Pool> for ReadRouter {
    fn from(primary: &Pool) -> Self {
        primary.clone().into()
    }
}

impl ReadRouter {
    /// Reads over `primary` and the `replicas` (each a target and its
    /// pool), sending statements as `statements` say, under a
    /// `read_deadline`: half of it for a replica, so a failed replica
    /// leaves the other half to the primary. Replicas are unusable until
    /// [`poll`](Self::poll) has seen them; cache fills follow `coherence`.
    pub fn new(
        primary: Pool,
        replicas: Vec<(Postgres, Pool)>,
        statements: Statements,
        settings: &ReplicaSettings,
        read_deadline: Duration,
        coherence: Coherence,
    ) -> Self {
        let mut pools = vec![primary];
        let replicas = replicas
            .into_iter()
            .map(|(target, pool)| {
                pools.push(pool);
                Replica {
                    name: describe(&target.config),
                    target,
                    usable: AtomicBool::new(false),
                    replay: AtomicU64::new(0),
                    lag_us: AtomicU64::new(0),
                    reads: AtomicU64::new(0),
                    failures: AtomicU64::new(0),
                }
            })
            .collect();
        Self(Arc::new(Inner {
            pools,
            statements,
            replicas,
            max_lag: settings.max_lag,
            replica_budget: read_deadline / 2,
            next: AtomicUsize::new(0),
            coherence,
            invalidations: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            fill_floor: AtomicU64::new(0),
            position_wanted: tokio::sync::Notify::new(),
            primary_reads: AtomicU64::new(0),
            fallbacks: Default::default(),
        }))
    }

    /// The primary's pool.
    pub fn primary(&self) -> &Pool {
        &self.0.pools[0]
    }

    /// Every pool, the primary's first (the index [`read`](Self::read)
    /// passes).
    pub fn pools(&self) -> &[Pool] {
        &self.0.pools
    }

    /// How reads send their statements on these pools.
    pub fn statements(&self) -> Statements {
        self.0.statements
    }

    /// Whether any replica is configured.
    pub fn has_replicas(&self) -> bool {
        !self.0.replicas.is_empty()
    }

    /// Reads that went to the primary.
    pub fn primary_reads(&self) -> u64 {
        self.0.primary_reads.load(Ordering::Relaxed)
    }

    /// Reads that went to the primary although replicas are configured,
    /// by reason.
    pub fn fallbacks(&self) -> [(Fallback, u64); 4] {
        Fallback::ALL.map(|f| (f, self.0.fallbacks[f as usize].load(Ordering::Relaxed)))
    }

    /// Each replica's state.
    pub fn replicas(&self) -> Vec<ReplicaStatus> {
        self.0
            .replicas
            .iter()
            .map(|r| ReplicaStatus {
                name: r.name.clone(),
                usable: r.usable.load(Ordering::Acquire),
                lag: Duration::from_micros(r.lag_us.load(Ordering::Relaxed)),
                replay: PgLsn::from(r.replay.load(Ordering::Acquire)),
                reads: r.reads.load(Ordering::Relaxed),
                failures: r.failures.load(Ordering::Relaxed),
            })
            .collect()
    }
}

/// `host:port` of a target, never its password.
fn describe(config: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}")
}
