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

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::HashMap;

use pgbatch::pg::{BatchQuery, PgError, PgLoader, Pool, Statements};
use pgbatch::Loader;
use tokio_postgres::types::PgLsn;
use tokio_util::sync::CancellationToken;

use crate::cluster::coherence::Coherence;
use crate::db::queries::database as sql;
use crate::db::Postgres;
use crate::settings::ReplicaSettings;

/// SQLSTATE class 40, which a replica uses to cancel a query that
/// conflicts with the WAL it replays.
const TRANSACTION_ROLLBACK_CLASS: &str = "40";

/// What a read needs of the database that answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Anything within the replica lag bound.
    Any,
    /// A value that will be cached: nothing older than the invalidations
    /// already applied.
    CacheFill,
    /// Every change committed up to this WAL position (a client's
    /// read-your-writes position).
    Position(PgLsn),
    /// Both: what [`CacheFill`](Self::CacheFill) needs and this position.
    /// For credentials read at a client's position: an old (or forged)
    /// position must not let a replica answer that has not replayed a
    /// revocation this instance has applied.
    CacheFillAt(PgLsn),
}

/// Why a read went to the primary although replicas are configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Every replica is down, out of recovery, or lags past the bound.
    NoneUsable,
    /// No usable replica had replayed the position the read presented.
    PositionNotReplayed,
    /// A cache fill while an invalidation is settling or the listener is
    /// down, or no replica had replayed the last invalidation.
    CacheFill,
    /// The replica chosen failed the read; it ran again on the primary.
    ReplicaFailed,
}

impl Fallback {
    /// Every reason, in declaration order (`reason as usize` indexes it).
    pub const ALL: [Self; 4] = [
        Self::NoneUsable,
        Self::PositionNotReplayed,
        Self::CacheFill,
        Self::ReplicaFailed,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::NoneUsable => "none_usable",
            Self::PositionNotReplayed => "position_not_replayed",
            Self::CacheFill => "cache_fill",
            Self::ReplicaFailed => "replica_failed",
        }
    }
}

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

    /// Runs `attempt` on the pool chosen for `needs` (its index in
    /// [`pools`](Self::pools)); if a replica was chosen and fails or takes
    /// longer than its budget, runs it again on the primary.
    ///
    /// # Errors
    ///
    /// The primary's error (a replica's is logged and retried).
    pub async fn read<T, F, Fut>(&self, needs: Needs, attempt: F) -> Result<T, PgError>
    where
        F: Fn(usize) -> Fut,
        Fut: Future<Output = Result<T, PgError>>,
    {
        let Some(i) = self.choose(needs) else {
            self.0.primary_reads.fetch_add(1, Ordering::Relaxed);
            return attempt(0).await;
        };
        let replica = &self.0.replicas[i];
        match tokio::time::timeout(self.0.replica_budget, attempt(i + 1)).await {
            Ok(Ok(value)) => {
                replica.reads.fetch_add(1, Ordering::Relaxed);
                return Ok(value);
            }
            Ok(Err(e)) => {
                // A query cancelled by a conflict with recovery says
                // nothing about the replica's health; anything else does.
                let conflict = e
                    .as_db_error()
                    .is_some_and(|db| db.code().code().starts_with(TRANSACTION_ROLLBACK_CLASS));
                if !conflict {
                    self.replica_failed(replica, &e.to_string());
                }
            }
            Err(_) => self.replica_failed(replica, "slower than its read budget"),
        }
        self.count_fallback(Fallback::ReplicaFailed);
        self.0.primary_reads.fetch_add(1, Ordering::Relaxed);
        attempt(0).await
    }

    fn replica_failed(&self, replica: &Replica, why: &str) {
        replica.failures.fetch_add(1, Ordering::Relaxed);
        if replica.usable.swap(false, Ordering::AcqRel) {
            tracing::warn!(replica = %replica.name, error = why,
                "a replica failed a read; reads go elsewhere until it answers a poll");
        }
    }

    /// The replica (index into the replicas) for a read that `needs`,
    /// or `None` for the primary (counted, with why, when replicas exist).
    fn choose(&self, needs: Needs) -> Option<usize> {
        let inner = &*self.0;
        let n = inner.replicas.len();
        if n == 0 {
            return None;
        }
        let floor = match needs {
            Needs::Any => 0,
            Needs::Position(lsn) => u64::from(lsn),
            Needs::CacheFill | Needs::CacheFillAt(_) => {
                let settled = inner.settled.load(Ordering::Acquire);
                if !inner.coherence.caches_usable()
                    || settled < inner.invalidations.load(Ordering::Acquire)
                {
                    self.count_fallback(Fallback::CacheFill);
                    return None;
                }
                let floor = inner.fill_floor.load(Ordering::Acquire);
                match needs {
                    Needs::CacheFillAt(lsn) => floor.max(u64::from(lsn)),
                    _ => floor,
                }
            }
        };
        // Round robin from a moving start, over the usable replicas that
        // have replayed far enough.
        let start = inner.next.fetch_add(1, Ordering::Relaxed);
        let mut any_usable = false;
        for step in 0..n {
            let i = (start + step) % n;
            let replica = &inner.replicas[i];
            if !replica.usable.load(Ordering::Acquire) {
                continue;
            }
            any_usable = true;
            if replica.replay.load(Ordering::Acquire) >= floor {
                return Some(i);
            }
        }
        self.count_fallback(match (any_usable, needs) {
            (false, _) => Fallback::NoneUsable,
            (true, Needs::CacheFill | Needs::CacheFillAt(_)) => Fallback::CacheFill,
            (true, _) => Fallback::PositionNotReplayed,
        });
        None
    }

    /// Counts why a read goes to the primary (which [`read`](Self::read)
    /// counts as a primary read).
    fn count_fallback(&self, why: Fallback) {
        self.0.fallbacks[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A cache entry is about to be dropped (a local write, or a
    /// notification): until the invalidation listener has read the
    /// primary's position after it ([`settle`](Self::settle)), cache fills
    /// go to the primary, and after, only to replicas past that position.
    pub fn begin_invalidation(&self) {
        if self.has_replicas() {
            self.0.invalidations.fetch_add(1, Ordering::AcqRel);
            self.0.position_wanted.notify_one();
        }
    }

    /// The last invalidation begun, for [`settle`](Self::settle).
    pub fn ticket(&self) -> u64 {
        self.0.invalidations.load(Ordering::Acquire)
    }

    /// Waits until an invalidation wants settling; returns its ticket for
    /// [`settle`](Self::settle). Never returns without replicas.
    pub async fn position_wanted(&self) -> u64 {
        if !self.has_replicas() {
            std::future::pending::<()>().await;
        }
        self.0.position_wanted.notified().await;
        self.0.invalidations.load(Ordering::Acquire)
    }

    /// The invalidations up to `ticket` are applied, and `position` is the
    /// primary's WAL position read after they were received: cache fills
    /// may use replicas that replayed that far.
    pub fn settle(&self, ticket: u64, position: PgLsn) {
        self.0
            .fill_floor
            .fetch_max(u64::from(position), Ordering::AcqRel);
        self.0.settled.fetch_max(ticket, Ordering::AcqRel);
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

    /// Polls the primary's position and every replica's every
    /// `settings.poll_every` until `stop`, keeping each replica's
    /// usability and lag current. Returns at once without replicas.
    pub async fn poll(self, settings: ReplicaSettings, stop: CancellationToken) {
        if !self.has_replicas() {
            return;
        }
        let mut samples = Samples::new(settings.max_lag + settings.poll_every * 4);
        let mut clients: Vec<Option<tokio_postgres::Client>> =
            self.0.replicas.iter().map(|_| None).collect();
        let mut tick = tokio::time::interval(settings.poll_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            // Sampled before the replicas are asked, so a replica that has
            // caught up shows a lag of about one round trip.
            let sampled_at = Instant::now();
            match tokio::time::timeout(settings.poll_timeout, self.primary_position()).await {
                Ok(Ok(lsn)) => samples.push(sampled_at, lsn),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "could not read the primary's WAL position");
                }
                Err(_) => tracing::debug!("reading the primary's WAL position timed out"),
            }
            let polls = self
                .0
                .replicas
                .iter()
                .zip(clients.iter_mut())
                .map(|(replica, client)| poll_replica(replica, client, &settings));
            let results = futures_util::future::join_all(polls).await;
            for (replica, result) in self.0.replicas.iter().zip(results) {
                self.apply_poll(replica, result, &samples, sampled_at);
            }
        }
    }

    fn apply_poll(
        &self,
        replica: &Replica,
        result: Result<(bool, Option<PgLsn>), String>,
        samples: &Samples,
        now: Instant,
    ) {
        let verdict = match result {
            Ok((true, Some(replay))) => {
                let replay = u64::from(replay);
                // Stored, not maxed: a replica restarted after a crash
                // may come back readable at an earlier position, or the
                // address may now lead to another server; a position
                // read from it must not be trusted beyond what it says.
                let before = replica.replay.swap(replay, Ordering::AcqRel);
                if replay < before {
                    tracing::warn!(replica = %replica.name, was = %PgLsn::from(before),
                        now = %PgLsn::from(replay), "a replica's replay position went back");
                }
                let lag = samples.lag(replay, now);
                replica
                    .lag_us
                    .store(lag.map_or(u64::MAX, as_micros), Ordering::Relaxed);
                match lag {
                    Some(lag) if lag <= self.0.max_lag => Ok(()),
                    Some(lag) => Err(format!(
                        "lags {lag:?}, more than the allowed {:?}",
                        self.0.max_lag
                    )),
                    None => Err(
                        "lags more than the allowed bound (or the primary's position is unknown)"
                            .to_owned(),
                    ),
                }
            }
            Ok((true, None)) => Err("has not replayed anything yet".to_owned()),
            Ok((false, _)) => Err("is not in recovery (promoted?)".to_owned()),
            Err(e) => {
                replica.failures.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        };
        let usable = verdict.is_ok();
        let was = replica.usable.swap(usable, Ordering::AcqRel);
        match verdict {
            Ok(()) if !was => tracing::info!(replica = %replica.name, "replica usable"),
            Err(why) if was => {
                tracing::warn!(replica = %replica.name, why, "replica skipped");
            }
            _ => {}
        }
    }

    async fn primary_position(&self) -> Result<PgLsn, PgError> {
        let client = self.primary().get().await?;
        Ok(sql::wal_position(&**client).await?)
    }
}

/// A [`BatchQuery`] run on the database [`ReadRouter`] chooses: one
/// [`PgLoader`] per pool, sharing the query. A [`Loader`] for the reads
/// that need what it was built or [`needing`](Self::needing) for.
pub struct RoutedLoader<Q> {
    router: ReadRouter,
    loaders: Arc<[PgLoader<Q>]>,
    needs: Needs,
}

impl<Q> std::fmt::Debug for RoutedLoader<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoutedLoader")
            .field("needs", &self.needs)
            .field("pools", &self.loaders.len())
            .finish_non_exhaustive()
    }
}

impl<Q> Clone for RoutedLoader<Q> {
    fn clone(&self) -> Self {
        Self {
            router: self.router.clone(),
            loaders: Arc::clone(&self.loaders),
            needs: self.needs,
        }
    }
}

impl<Q: BatchQuery> RoutedLoader<Q> {
    /// `query` on every pool of `router`, for reads that need `needs`.
    pub fn new(router: ReadRouter, query: Q, needs: Needs) -> Self {
        let primary =
            PgLoader::with_statements(router.primary().clone(), query, router.statements());
        let loaders = router
            .pools()
            .iter()
            .enumerate()
            .map(|(i, pool)| {
                if i == 0 {
                    primary.clone()
                } else {
                    primary.with_pool(pool.clone())
                }
            })
            .collect();
        Self {
            router,
            loaders,
            needs,
        }
    }

    /// Where this loader's reads go.
    pub fn router(&self) -> &ReadRouter {
        &self.router
    }

    /// The same loader for reads that need `needs`.
    #[must_use]
    pub fn needing(&self, needs: Needs) -> Self {
        Self {
            needs,
            ..self.clone()
        }
    }

    /// One key with the single-key statement (the naive path).
    ///
    /// # Errors
    ///
    /// As [`PgLoader::load_one`] on the primary.
    pub async fn load_one(&self, key: &Q::Key) -> Result<Option<Q::Value>, PgError> {
        self.router
            .read(self.needs, |i| self.loaders[i].load_one(key))
            .await
    }
}

impl<Q: BatchQuery> Loader<Q::Key, Q::Value> for RoutedLoader<Q> {
    type Error = PgError;

    async fn load(&self, keys: Vec<Q::Key>) -> Result<HashMap<Q::Key, Q::Value>, PgError> {
        // Kept for a retry on the primary only when a replica may be
        // chosen; a lone database takes the keys as they are.
        if !self.router.has_replicas() {
            return self.loaders[0].load(keys).await;
        }
        self.router
            .read(self.needs, |i| self.loaders[i].load(keys.clone()))
            .await
    }

    fn is_absent(&self, value: &Q::Value) -> bool {
        self.loaders[0].is_absent(value)
    }
}

/// Asks one replica whether it is in recovery and how far it replayed, on
/// a connection of its own (a pool's could be busy with reads exactly when
/// the replica is slow), opened again after any failure.
async fn poll_replica(
    replica: &Replica,
    client: &mut Option<tokio_postgres::Client>,
    settings: &ReplicaSettings,
) -> Result<(bool, Option<PgLsn>), String> {
    let attempt = async {
        if client
            .as_ref()
            .is_none_or(tokio_postgres::Client::is_closed)
        {
            let mut config = replica.target.config.clone();
            config.connect_timeout(settings.poll_timeout);
            let (c, connection) = config
                .connect(replica.target.tls.clone())
                .await
                .map_err(|e| format!("could not connect: {e}"))?;
            tokio::spawn(async move {
                let _ = connection.await; // ends with the client; errors show in the next poll
            });
            *client = Some(c);
        }
        let c = client.as_ref().ok_or("no connection")?;
        sql::replay_state(c)
            .await
            .map_err(|e| format!("poll failed: {e}"))
    };
    match tokio::time::timeout(settings.poll_timeout, attempt).await {
        Ok(Ok(state)) => Ok(state),
        Ok(Err(e)) => {
            *client = None;
            Err(e)
        }
        Err(_) => {
            *client = None;
            Err(format!(
                "did not answer a poll within {:?}",
                settings.poll_timeout
            ))
        }
    }
}

/// The primary's WAL positions and when they were read, oldest first, for
/// as long as a lag may matter.
struct Samples {
    keep: Duration,
    samples: VecDeque<(Instant, u64)>,
}

impl Samples {
    fn new(keep: Duration) -> Self {
        Self {
            keep,
            samples: VecDeque::new(),
        }
    }

    fn push(&mut self, at: Instant, lsn: PgLsn) {
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
    fn lag(&self, replay: u64, now: Instant) -> Option<Duration> {
        self.samples
            .iter()
            .rev()
            .find(|(_, lsn)| *lsn <= replay)
            .map(|(t, _)| now.saturating_duration_since(*t))
    }
}

fn as_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
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

/// Reads `position` from a header value such as `16/B374D848`.
///
/// # Errors
///
/// When the text is not a WAL position.
pub fn parse_position(text: &str) -> Result<PgLsn, String> {
    // Exactly what the OpenAPI document states (`POSITION_PATTERN`):
    // PgLsn's own parser also takes signs and leading zeros past 8 digits.
    let half = |h: &str| (1..=8).contains(&h.len()) && h.bytes().all(|b| b.is_ascii_hexdigit());
    text.split_once('/')
        .filter(|(hi, lo)| half(hi) && half(lo))
        .and_then(|_| text.parse::<PgLsn>().ok())
        .ok_or_else(|| format!("`{text}` is not a WAL position such as `16/B374D848`"))
}

/// What [`parse_position`] accepts, as a regular expression (for the
/// OpenAPI document).
pub const POSITION_PATTERN: &str = "^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$";

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

    #[test]
    fn positions_parse_as_postgres_prints_them() {
        assert_eq!(
            u64::from(parse_position("16/B374D848").unwrap()),
            0x16_B374_D848
        );
        assert!(parse_position("16-B374").is_err());
        assert!(parse_position("").is_err());
    }
}
