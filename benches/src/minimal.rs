//! The strongest fair baseline of the engine: the eager batcher an engineer
//! writes by hand in a hundred lines, with a fixed set of connections and
//! a cap on the batch, which `autotune --only baseline` sweeps to find its
//! best setting. If pgbatch's defaults cannot beat that setting, the
//! self-tuning is not earning its keep.
//!
//! Eager: a worker sends a batch as soon as its connection is free, with
//! whatever queued meanwhile; no timer, no limit that adapts.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use pgbatch::pg::BatchQuery as _;
use server::db::queries::kv::KvQuery;
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls, Statement};

/// Where a key's payload goes.
type Reply = oneshot::Sender<Option<String>>;
/// A key and where its payload goes.
type Request = (String, Reply);

/// Reads of `random_read_test` batched by one worker per connection.
#[derive(Debug)]
pub struct MinimalBatcher {
    tx: mpsc::Sender<Request>,
    workers: Vec<JoinHandle<()>>,
    counts: Arc<Counts>,
}

/// What the workers loaded, for the mean batch and the time the
/// connections were busy.
#[derive(Debug, Default)]
struct Counts {
    batches: AtomicU64,
    keys: AtomicU64,
    busy_ns: AtomicU64,
}

impl MinimalBatcher {
    /// Opens `connections` connections, each with its worker, that send
    /// batches of at most `max_batch` keys.
    ///
    /// # Errors
    ///
    /// When a connection cannot be made or the statement prepared.
    pub async fn start(
        config: &tokio_postgres::Config,
        connections: usize,
        max_batch: usize,
    ) -> anyhow::Result<Self> {
        let max_batch = max_batch.max(1);
        // pgbatch's queue bound, so neither pushes back on callers sooner.
        let (tx, rx) = mpsc::channel(pgbatch::defaults::CHANNEL_CAPACITY);
        let rx = Arc::new(Mutex::new(rx));
        let counts = Arc::new(Counts::default());
        let mut workers = Vec::with_capacity(connections);
        for _ in 0..connections.max(1) {
            let (client, conn) = config.connect(NoTls).await?;
            tokio::spawn(conn);
            let stmt = client.prepare(KvQuery.batch_sql()).await?;
            let worker = work(
                client,
                stmt,
                Arc::clone(&rx),
                Arc::clone(&counts),
                max_batch,
            );
            workers.push(tokio::spawn(worker));
        }
        Ok(Self {
            tx,
            workers,
            counts,
        })
    }

    /// The payload of `key`'s row, or `None` when there is no such row.
    ///
    /// # Errors
    ///
    /// When the batcher is shut down or the key's batch failed.
    pub async fn get(&self, key: String) -> anyhow::Result<Option<String>> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send((key, tx))
            .await
            .map_err(|_| anyhow!("minimal batcher closed"))?;
        rx.await.context("minimal batcher: the batch failed")
    }

    /// Keys per statement so far (0 before the first).
    pub fn mean_batch(&self) -> f64 {
        let batches = self.counts.batches.load(Relaxed);
        if batches == 0 {
            return 0.0;
        }
        self.counts.keys.load(Relaxed) as f64 / batches as f64
    }

    /// The time statements have run so far, summed over the connections.
    pub fn busy(&self) -> Duration {
        Duration::from_nanos(self.counts.busy_ns.load(Relaxed))
    }

    /// Answers what is queued, then waits for the workers to end.
    pub async fn shutdown(self) {
        drop(self.tx);
        for worker in self.workers {
            if let Err(e) = worker.await {
                eprintln!("minimal batcher: a worker panicked: {e}");
            }
        }
    }
}

/// One connection's loop: take a batch, run it, answer it.
async fn work(
    client: Client,
    stmt: Statement,
    rx: Arc<Mutex<mpsc::Receiver<Request>>>,
    counts: Arc<Counts>,
    max_batch: usize,
) {
    loop {
        // Duplicates go to the database once.
        let mut batch: HashMap<String, Vec<Reply>> = HashMap::new();
        {
            // An async lock held across `recv`: the workers take turns at
            // the queue, and the one whose turn it is sends as soon as a
            // request arrives, with whatever queued while it waited.
            let mut rx = rx.lock().await;
            let Some((key, tx)) = rx.recv().await else {
                return;
            };
            batch.entry(key).or_default().push(tx);
            while batch.len() < max_batch {
                let Ok((key, tx)) = rx.try_recv() else {
                    break;
                };
                batch.entry(key).or_default().push(tx);
            }
        }
        let keys: Vec<String> = batch.keys().cloned().collect();
        let started = Instant::now();
        let rows = client.query(&stmt, &[&keys]).await;
        let busy = started.elapsed().as_nanos();
        counts
            .busy_ns
            .fetch_add(u64::try_from(busy).unwrap_or(u64::MAX), Relaxed);
        let rows = rows.and_then(|rows| {
            rows.iter()
                .map(|row| KvQuery.map_row(row))
                .collect::<Result<Vec<_>, _>>()
        });
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => {
                // The batch's senders are dropped with it, which fails
                // their callers; the next batch may well succeed.
                eprintln!("minimal batcher: {} keys failed: {e}", keys.len());
                continue;
            }
        };
        counts.batches.fetch_add(1, Relaxed);
        counts.keys.fetch_add(keys.len() as u64, Relaxed);
        for (pk, payload) in rows {
            for tx in batch.remove(&pk).unwrap_or_default() {
                let _ = tx.send(Some(payload.clone())); // caller gave up; nothing to do
            }
        }
        for tx in batch.into_values().flatten() {
            let _ = tx.send(None); // caller gave up; nothing to do
        }
    }
}
