//! Cache coherence across instances, on Postgres's own LISTEN/NOTIFY.
//!
//! Triggers (migration `V20261122000100__invalidation`) send, from the
//! transaction of every committed change a cache may hold, one
//! notification per statement on [`CHANNEL`]; Postgres delivers it at
//! commit, and only if the transaction commits. Each instance keeps one
//! dedicated connection (never from a pool, never through a pooler, which
//! would not keep a session's LISTEN) and applies what arrives to its
//! object-stat and token caches.
//!
//! Notifications sent while the listener is disconnected are lost. So
//! while it is down the caches are bypassed ([`Coherence`]): reads go to
//! the database, and nothing is cached. After it reconnects and LISTENs
//! again, every cache is flushed before they are used again. A ping every
//! second finds a connection that died silently (a frozen or partitioned
//! database sends no error). The caches' TTL stays as a last safety net.

use std::time::Duration;

use anyhow::{bail, Context as _};
use futures_util::future::poll_fn;
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

use crate::auth::Authenticator;
use crate::coherence::Coherence;
use crate::db::Postgres;
use crate::queries::objects::ObjectKey;
use crate::reads::Reads;

/// The notification channel the triggers send on.
pub const CHANNEL: &str = "pgbatch_invalidate";

/// The listener's `application_name`, which names it in `pg_stat_activity`.
pub const APPLICATION_NAME: &str = "pgbatch-listener";

/// How long connecting, LISTEN and each ping may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the connection is checked.
const PING_EVERY: Duration = Duration::from_secs(1);
/// The first and the longest wait between reconnection attempts.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

/// What a notification asks to drop.
#[derive(Debug, PartialEq, Eq)]
enum Invalidation {
    Objects(Vec<ObjectKey>),
    AllObjects,
    Tokens(Vec<Vec<u8>>),
    AllAuth,
    /// A payload this version cannot read: everything is dropped.
    Unknown,
}

#[derive(Deserialize)]
struct Payload {
    c: String,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    k: Vec<serde_json::Value>,
}

impl Invalidation {
    fn parse(text: &str) -> Self {
        let Ok(p) = serde_json::from_str::<Payload>(text) else {
            return Self::Unknown;
        };
        match (p.c.as_str(), p.all) {
            ("objects", true) => Self::AllObjects,
            ("auth", _) | ("tokens", true) => Self::AllAuth,
            ("objects", false) => p
                .k
                .into_iter()
                .map(|k| {
                    let (repository, path): (String, String) = serde_json::from_value(k).ok()?;
                    Some(ObjectKey { repository, path })
                })
                .collect::<Option<_>>()
                .map_or(Self::Unknown, Self::Objects),
            ("tokens", false) => {
                p.k.into_iter()
                    .map(|k| hex::decode(k.as_str()?).ok())
                    .collect::<Option<_>>()
                    .map_or(Self::Unknown, Self::Tokens)
            }
            _ => Self::Unknown,
        }
    }
}

/// The caches notifications are applied to.
#[derive(Debug, Clone)]
pub struct Caches {
    /// The object-stat (and kv) lookups.
    pub reads: Reads,
    /// The token cache.
    pub auth: Authenticator,
}

impl Caches {
    async fn apply(&self, invalidation: Invalidation) {
        match invalidation {
            Invalidation::Objects(keys) => {
                for key in &keys {
                    self.reads.object_stat.invalidate(key).await;
                }
            }
            Invalidation::AllObjects => self.reads.object_stat.invalidate_all(),
            Invalidation::Tokens(digests) => self.auth.forget(&digests).await,
            Invalidation::AllAuth => self.auth.forget_all(),
            Invalidation::Unknown => self.flush(),
        }
    }

    fn flush(&self) {
        self.reads.object_stat.invalidate_all();
        self.reads.kv.invalidate_all();
        self.auth.forget_all();
    }
}

/// Listens on `target` until `stop`, applying notifications to `caches`
/// and keeping `coherence` true only while listening.
pub async fn listen(
    target: Postgres,
    caches: Caches,
    coherence: Coherence,
    stop: CancellationToken,
) {
    let mut backoff = BACKOFF.0;
    loop {
        let result = tokio::select! {
            () = stop.cancelled() => return,
            r = session(&target, &caches, &coherence, &mut backoff) => r,
        };
        coherence.failed();
        if let Err(e) = result {
            tracing::warn!(error = %format!("{e:#}"), retry_in = ?backoff,
                "cache invalidation listener lost; caches bypassed until it is back");
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(BACKOFF.1);
    }
}

/// One connection's life: connect, LISTEN, flush, then apply
/// notifications until the connection fails.
async fn session(
    target: &Postgres,
    caches: &Caches,
    coherence: &Coherence,
    backoff: &mut Duration,
) -> anyhow::Result<()> {
    let mut config = target.config.clone();
    config.application_name(APPLICATION_NAME);
    let (client, mut connection) =
        tokio::time::timeout(STEP_TIMEOUT, config.connect(target.tls.clone()))
            .await
            .context("connecting timed out")?
            .context("could not connect")?;
    let (tx, mut notifications) = mpsc::unbounded_channel();
    // The connection's messages are read by a task of its own: the client
    // needs it driven to run LISTEN and the pings.
    let driver = tokio::spawn(async move {
        loop {
            match poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if tx.send(n).is_err() {
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
        STEP_TIMEOUT,
        client.batch_execute(&format!("LISTEN {CHANNEL}")),
    )
    .await
    .context("LISTEN timed out")?
    .context("LISTEN failed")?;
    // Whatever was sent while no one listened is lost: start afresh.
    caches.flush();
    coherence.connected();
    *backoff = BACKOFF.0;
    tracing::info!(channel = CHANNEL, "listening for cache invalidations");

    let mut ping = tokio::time::interval(PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            n = notifications.recv() => {
                let Some(n) = n else { bail!("the connection closed") };
                let invalidation = Invalidation::parse(n.payload());
                if invalidation == Invalidation::Unknown {
                    tracing::warn!(payload = n.payload(), "unreadable invalidation; flushing every cache");
                }
                caches.apply(invalidation).await;
                coherence.count_received();
            }
            _ = ping.tick() => {
                tokio::time::timeout(STEP_TIMEOUT, client.simple_query(""))
                    .await
                    .context("the database did not answer a ping")?
                    .context("ping failed")?;
            }
        }
    }
}

/// Stops the connection's task when the session ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_parse_and_anything_else_flushes() {
        assert_eq!(
            Invalidation::parse(r#"{"c":"objects","k":[["demo","a/b"],["x","y z"]]}"#),
            Invalidation::Objects(vec![
                ObjectKey {
                    repository: "demo".into(),
                    path: "a/b".into()
                },
                ObjectKey {
                    repository: "x".into(),
                    path: "y z".into()
                },
            ])
        );
        assert_eq!(
            Invalidation::parse(r#"{"c":"objects","all":true}"#),
            Invalidation::AllObjects
        );
        assert_eq!(
            Invalidation::parse(r#"{"c":"tokens","k":["00ff"]}"#),
            Invalidation::Tokens(vec![vec![0, 255]])
        );
        assert_eq!(
            Invalidation::parse(r#"{"c":"auth","all":true}"#),
            Invalidation::AllAuth
        );
        for bad in [
            "",
            "not json",
            r#"{"c":"objects","k":[["only-one"]]}"#,
            r#"{"c":"tokens","k":["zz"]}"#,
            r#"{"c":"future"}"#,
        ] {
            assert_eq!(Invalidation::parse(bad), Invalidation::Unknown, "{bad}");
        }
    }
}
