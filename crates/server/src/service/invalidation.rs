//! Cache coherence across instances, on Postgres's own LISTEN/NOTIFY.
//!
//! Triggers (migration `V20261122000100__invalidation`) send, from the
//! transaction of every committed change a cache may hold, the changed
//! keys on [`CHANNEL`] in payloads under NOTIFY's 8,000-byte limit ("drop all"
//! past 10,000 rows, nothing for a statement that touched no row);
//! Postgres delivers them at commit, and only if the transaction commits.
//! Each instance keeps one dedicated connection (never from a pool, never
//! through a pooler, which would not keep a session's LISTEN) and applies
//! what arrives to its caches: objects' changes through `Reads::changed`
//! (to every lookup over the tables they touch), tokens' to the token
//! cache. `random_read_test` (the kv lookup) has no triggers: the service
//! never writes it, and only a flush empties its cache.
//!
//! Notifications sent while the listener is disconnected are lost. So
//! while it is down the caches are bypassed ([`Coherence`]): reads go to
//! the database, and nothing is cached. After it reconnects and LISTENs
//! again, every cache is flushed before they are used again.
//!
//! The listener's health is proved end to end: every second a notification
//! with a fresh random payload is sent on [`PING_CHANNEL`] from another
//! connection (one of its own, never waiting behind reads; behind a pooler,
//! one of the read pool's), and must arrive
//! on the listener within two. A connection that died silently (a frozen or partitioned database
//! sends no error) fails it, and so does a path that swallows notifications
//! while answering queries (a transaction-mode pooler accepts `LISTEN` and
//! then delivers nothing, or delivers to another client): the caches are
//! marked incoherent, bypassed, and the listener reconnects. The caches
//! are first used only after such a ping has come through, so a listener
//! that never hears anything never lets them be used. Until a silent
//! failure is found, for at most the ping timeout (2 s), a cache may serve
//! what a lost notification would have dropped. The caches' TTL stays as a
//! last bound.
//!
//! A ping is sent while notifications go on being applied, never in their
//! way: under load the pool's connections may all be busy. Whenever no
//! ping has come through for the ping timeout (2 s), the caches are
//! bypassed until one does, whatever the reason: a listener whose node
//! hangs (a failed-over primary) is never trusted for longer. A ping that
//! cannot be sent (no connection in time, or the send failed) is tried
//! again at once or at the next interval, whichever is later, and does
//! not take the listener down as long as the last ping arrived (or, for
//! the first, the session began) within three intervals and the timeout
//! (about 5 s by default); then it connects again, to whichever host is
//! the primary now. A ping's connection is waited for within the pool's
//! own bounds, which give every host its turn: after a failover that left
//! the old primary hung, the hung host is tried first once, for its
//! deadline, and then last.

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use anyhow::{bail, Context as _};
use futures_util::future::poll_fn;
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

use crate::cluster::coherence::Coherence;
use crate::cluster::replicas::ReadRouter;
use crate::db::queries::system;
use crate::db::tls::Tls;
use crate::db::Postgres;
use crate::domain::auth::Authenticator;
pub use crate::domain::invalidation::CHANNEL;
use crate::domain::invalidation::{Change, Invalidation};
use crate::domain::reads::Reads;
use crate::settings::InvalidationSettings;
use pgbatch::pg::{Connector, Pool};

/// The caches notifications are applied to.
#[derive(Debug, Clone)]
pub struct Caches {
    /// Every registered lookup (token lookups included).
    pub reads: Reads,
    /// The token memo in front of the token lookup.
    pub auth: Authenticator,
    /// Told the primary's position after each invalidation, so cache
    /// fills from replicas are no older.
    pub router: ReadRouter,
}

impl Caches {
    /// Drops from the caches what `invalidation` names.
    pub async fn apply(&self, invalidation: Invalidation) {
        match invalidation {
            Invalidation::Objects(keys) => {
                for key in &keys {
                    self.reads.changed(Change::Object(key)).await;
                }
            }
            Invalidation::AllObjects => self.reads.changed(Change::Objects).await,
            Invalidation::Tokens(digests) => self.auth.forget(&digests).await,
            Invalidation::AllAuth => self.auth.forget_all().await,
            Invalidation::Unknown => self.flush().await,
        }
    }

    /// Drops everything every cache holds.
    pub async fn flush(&self) {
        self.reads.changed(Change::Everything).await;
        self.auth.forget_all().await;
    }
}

/// The channel of the listener's pings (see the module docs).
pub const PING_CHANNEL: &str = "pgbatch_listener_ping";

/// The listener's `application_name`, which names it in `pg_stat_activity`.
pub const APPLICATION_NAME: &str = "pgbatch-listener";

/// Listens on `target` until `stop`, applying notifications to `caches`
/// and keeping `coherence` true only while notifications are proved to
/// arrive: pings are sent from `sender`'s connections.
pub async fn listen(
    target: Postgres,
    sender: Pool,
    caches: Caches,
    coherence: Coherence,
    settings: InvalidationSettings,
    stop: CancellationToken,
) {
    let mut config = target.config.clone();
    config
        .application_name(APPLICATION_NAME)
        // The kernel gives up on a peer that stopped answering, even
        // between pings.
        .keepalives(true)
        .keepalives_idle(settings.ping_every)
        .tcp_user_timeout(settings.ping_every + settings.ping_timeout);
    // Each host gets the ping timeout (connect, login, the role check): a
    // hung first host, an old primary after a failover, does not use up
    // the others' time. The primary is whichever host takes writes now.
    // One connector for every session, so a host that hung is tried last
    // the next time too.
    let connector = target
        .connector()
        .with_config(config)
        .host_timeout(settings.ping_timeout);
    let mut backoff = settings.reconnect_min;
    loop {
        let started = Instant::now();
        let result = tokio::select! {
            () = stop.cancelled() => return,
            r = session(&connector, &sender, &caches, &coherence, &settings) => r,
        };
        coherence.failed();
        // A connection that lasted starts the backoff over; one that keeps
        // dropping at once does not flush every cache every 100 ms.
        if started.elapsed() >= InvalidationSettings::STABLE_AFTER {
            backoff = settings.reconnect_min;
        }
        if let Err(e) = result {
            tracing::warn!(error = %format!("{e:#}"), retry_in = ?backoff,
                "cache invalidation listener lost; caches bypassed until it is back");
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(settings.reconnect_max);
    }
}

/// Notifications received and not yet applied, at most: past it the
/// listener reconnects and flushes instead of growing without bound.
const BACKLOG: usize = 10_000;

/// One connection's life: connect, LISTEN, flush, prove delivery, then
/// apply notifications until the connection fails or a ping goes unheard.
async fn session(
    connector: &Connector<Tls>,
    sender: &Pool,
    caches: &Caches,
    coherence: &Coherence,
    settings: &InvalidationSettings,
) -> anyhow::Result<()> {
    let step = settings.ping_timeout;
    let (client, mut connection) = connector.connect().await.context("could not connect")?;
    let (tx, mut notifications) = mpsc::channel(BACKLOG);
    // The connection's messages are read by a task of its own: the client
    // needs it driven to run LISTEN and the position reads.
    let driver = tokio::spawn(async move {
        loop {
            match poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if tx.try_send(n).is_err() {
                        tracing::warn!(
                            backlog = BACKLOG,
                            "invalidations arrive faster than they are applied"
                        );
                        return;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "listener connection failed");
                    return;
                }
                None => return,
            }
        }
    });
    let _abort = AbortOnDrop(driver);
    tokio::time::timeout(
        step,
        client.batch_execute(&format!("LISTEN {CHANNEL}; LISTEN {PING_CHANNEL}")),
    )
    .await
    .context("LISTEN timed out")?
    .context("LISTEN failed")?;
    // Whatever was sent while no one listened is lost: start afresh. Fills
    // from replicas must then be at least as new as the primary now.
    caches.flush().await;
    if caches.router.has_replicas() {
        settle(&client, &caches.router, caches.router.ticket(), step).await?;
    }
    // The first ping must arrive before the caches are used at all. Pings
    // are sent while notifications go on being applied: a send may wait
    // for a connection (every host's turn, a hung one's first) and on a
    // slow database, and the invalidations must not. A ping that cannot
    // be sent is tried again, the first one too, until the listener has
    // gone unproved for too long (`unproved_limit`, from the session's
    // start for the first one).
    // The ping is expected (`ping`) before it is sent: Postgres may signal
    // the listener before it answers the sender.
    let first = Ping::new();
    let mut sending: Option<Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send + '_>>> =
        Some(Box::pin(Ping::notify(sender, first.nonce.clone(), step)));
    let mut ping = Some(first);
    let mut proved = false;
    let mut last_proof = Instant::now();
    let mut next_ping = Instant::now() + settings.ping_every;
    loop {
        tokio::select! {
            n = notifications.recv() => {
                let Some(n) = n else { bail!("the connection closed") };
                if n.channel() == PING_CHANNEL {
                    if ping.as_ref().is_some_and(|p| p.nonce == n.payload()) {
                        ping = None;
                        last_proof = Instant::now();
                        if !proved {
                            proved = true;
                            coherence.connected();
                            tracing::info!(channel = CHANNEL, "listening for cache invalidations");
                        } else if !coherence.caches_usable() {
                            // Everything sent before this ping has arrived
                            // (notifications come in commit order), so
                            // the caches missed nothing meanwhile.
                            coherence.set_usable(true);
                            tracing::info!("the invalidation listener is proved again; caches used again");
                        }
                    }
                    continue;
                }
                let invalidation = Invalidation::parse(n.payload());
                if invalidation == Invalidation::Unknown {
                    coherence.count_unreadable();
                    tracing::warn!(payload = n.payload(), "unreadable invalidation; flushing every cache");
                }
                // Each cache marks the router unsettled before it drops
                // anything (`Lookup::invalidate`, `Authenticator::forget`).
                caches.apply(invalidation).await;
                coherence.count_received();
            }
            // No proof for `step`: the listener's node may be gone (a
            // hung primary answers nothing, not even an error), so the
            // caches are bypassed from now until a ping comes through.
            () = tokio::time::sleep_until((last_proof + step).into()), if proved && coherence.caches_usable() => {
                coherence.set_usable(false);
                tracing::warn!(since_last_proof = ?last_proof.elapsed(),
                    "no ping has reached the invalidation listener lately; caches bypassed until one does");
            }
            ticket = caches.router.position_wanted() => {
                settle(&client, &caches.router, ticket, step).await?;
            }
            () = tokio::time::sleep_until(next_ping.into()), if ping.is_none() && sending.is_none() => {
                let next = Ping::new();
                sending = Some(Box::pin(Ping::notify(sender, next.nonce.clone(), step)));
                ping = Some(next);
                next_ping = Instant::now() + settings.ping_every;
            }
            // A send may wait for a connection longer than the listener
            // may go unproved (the pool's wait and create timeouts): the
            // bound holds meanwhile too.
            () = tokio::time::sleep_until((last_proof + unproved_limit(settings)).into()), if sending.is_some() => {
                bail!("no ping reached the listener for {:?}", last_proof.elapsed());
            }
            sent = async { sending.as_mut().expect("polled only while sending").await }, if sending.is_some() => {
                sending = None;
                match sent {
                    // Unless it arrived already.
                    Ok(()) => if let Some(p) = &mut ping {
                        p.due = Some(Instant::now() + step);
                    },
                    // No connection to send from is not a deaf listener:
                    // the kernel's keepalives still watch this connection,
                    // and the next ping tries again. Only a listener left
                    // unproved for long is given up.
                    Err(e) if last_proof.elapsed() < unproved_limit(settings) => {
                        ping = None;
                        tracing::warn!(error = %format!("{e:#}"), "could not send a ping to the invalidation listener; trying again");
                    }
                    Err(e) => return Err(e.context(format!(
                        "no ping reached the listener for {:?}", last_proof.elapsed()
                    ))),
                }
            }
            () = tokio::time::sleep_until(ping.as_ref().and_then(|p| p.due).unwrap_or(next_ping).into()), if ping.as_ref().is_some_and(|p| p.due.is_some()) => {
                bail!(
                    "a notification sent on {PING_CHANNEL} did not arrive within {step:?}: \
                     the connection does not deliver notifications (is it behind a \
                     transaction-mode pooler? then set --direct-url)"
                );
            }
        }
    }
}

/// How long a proved listener may go without a ping arriving, because
/// none could be sent, before it is given up and connects again: three
/// intervals (the caches are bypassed from the first missed proof on).
fn unproved_limit(settings: &InvalidationSettings) -> std::time::Duration {
    settings.ping_every * 3 + settings.ping_timeout
}

/// A ping expected: its payload, and once it is sent, when it must have
/// arrived.
struct Ping {
    nonce: String,
    due: Option<Instant>,
}

impl Ping {
    fn new() -> Self {
        Self {
            nonce: format!("{:016x}", rand::random::<u64>()),
            due: None,
        }
    }

    /// Sends `nonce` on [`PING_CHANNEL`] from one of `sender`'s
    /// connections: another connection than the listener's, since a pooler
    /// may deliver a client's own notification to it and nothing else.
    ///
    /// The connection is waited for within the pool's own bounds, whose
    /// create timeout gives every host its turn: under the ping's `step`,
    /// one host's deadline, a hung old primary tried first would use it
    /// all, and no ping could be sent after a failover. The NOTIFY itself
    /// has `step`.
    async fn notify(sender: &Pool, nonce: String, step: std::time::Duration) -> anyhow::Result<()> {
        let client = crate::db::lease(sender)
            .await
            .context("no connection to send a ping from")?;
        let sent = tokio::time::timeout(step, system::notify(&**client, PING_CHANNEL, &nonce))
            .await
            .context("sending a ping timed out")?;
        client.settle(&sent);
        sent.context("sending a ping failed")
    }
}

/// Reads the primary's WAL position on the listener's connection, after
/// the invalidations up to `ticket` were applied, and tells `router`.
async fn settle(
    client: &tokio_postgres::Client,
    router: &ReadRouter,
    ticket: u64,
    step: std::time::Duration,
) -> anyhow::Result<()> {
    let position = tokio::time::timeout(step, system::wal_position(client))
        .await
        .context("reading the WAL position timed out")?
        .context("reading the WAL position failed")?;
    router.settle(ticket, position);
    Ok(())
}

/// Stops the connection's task when the session ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
