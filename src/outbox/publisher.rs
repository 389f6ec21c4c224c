//! The in-process publisher: takes won orders from purchase handlers and sends them to
//! RabbitMQ in batches, without ever making a purchase wait.
//!
//! Bounded on both sides: at most [`BUFFER`] orders wait in memory (a full buffer, or no
//! broker, leaves the order in the Redis outbox for the relay) and at most [`IN_FLIGHT`]
//! batches await their confirms at once.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::broker::{Broker, Outgoing, publish_confirmed};
use crate::keys::Keys;
use crate::store::RedisConns;

const BUFFER: usize = 20_000;
const BATCH: usize = 500;
const IN_FLIGHT: usize = 4;

/// The purchase handlers' end of the publisher.
#[derive(Clone)]
pub struct OrderPublisher {
    tx: mpsc::Sender<Outgoing>,
}

impl OrderPublisher {
    /// Hands an order over without waiting. If the buffer is full the order simply stays
    /// in the outbox, where the relay finds it.
    pub fn offer(&self, order: Outgoing) {
        if self.tx.try_send(order).is_err() {
            tracing::debug!("publisher buffer full; the relay will send this order");
        }
    }

    /// Starts the publishing task; it ends after shutdown, once its buffer is sent.
    pub fn spawn(
        broker: Broker,
        redis: RedisConns,
        keys: Keys,
        shutdown: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(BUFFER);
        let task = tokio::spawn(run(rx, broker, redis, keys, shutdown));
        (Self { tx }, task)
    }
}

async fn run(
    mut rx: mpsc::Receiver<Outgoing>,
    broker: Broker,
    redis: RedisConns,
    keys: Keys,
    shutdown: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut tasks = JoinSet::new();
    loop {
        let mut batch = Vec::with_capacity(BATCH);
        let received = tokio::select! {
            n = rx.recv_many(&mut batch, BATCH) => n,
            () = shutdown.cancelled() => {
                // Send what is buffered, then stop; anything left is in the outbox anyway.
                rx.close();
                rx.recv_many(&mut batch, BUFFER).await
            }
        };
        if received == 0 {
            break;
        }
        let Some(channel) = broker.publish_channel() else {
            tracing::debug!(
                orders = batch.len(),
                "no broker connection; orders wait in the outbox"
            );
            continue;
        };
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let (broker, redis, keys) = (broker.clone(), redis.clone(), keys.clone());
        tasks.spawn(async move {
            let started = Instant::now();
            let confirmed = publish_confirmed(&channel, broker.topology(), &batch).await;
            let sent = batch
                .iter()
                .zip(&confirmed)
                .filter_map(|(order, ok)| ok.then_some(order));
            let cleared = super::clear_confirmed(&redis, &keys, sent).await;
            let ok = confirmed.iter().filter(|c| **c).count();
            tracing::info!(
                orders = batch.len(),
                confirmed = ok,
                outcome = if ok == batch.len() {
                    "confirmed"
                } else {
                    "partly_confirmed"
                },
                duration_ms = started.elapsed().as_secs_f64() * 1e3,
                "mq_publish"
            );
            if let Err(e) = cleared {
                // Harmless: the relay will send these again and the insert is idempotent.
                tracing::warn!(error = %e, "could not clear confirmed orders from the outbox");
            }
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}
