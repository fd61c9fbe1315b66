//! The poller: every `poll_every`, the primary's WAL position and each
//! replica's replay position, which decide each replica's lag and whether
//! reads may use it.

use std::sync::atomic::Ordering;
use std::time::Instant;

use pgbatch::pg::PgError;
use tokio_postgres::types::PgLsn;
use tokio_util::sync::CancellationToken;

use super::lag::{as_micros, Samples};
use super::{ReadRouter, Replica};
use crate::db::queries::system as sql;
use crate::settings::ReplicaSettings;

impl ReadRouter {
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
        let client = crate::db::lease(self.primary()).await?;
        let position = sql::wal_position(&**client).await;
        client.settle(&position);
        Ok(position?)
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
            // Every host its URL names, as the replica's pool connects.
            let (c, connection) = replica
                .target
                .connector()
                .host_timeout(settings.poll_timeout)
                .connect()
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
