//! The consumer role: takes won orders off RabbitMQ and writes them to MySQL.
//!
//! Batches: whatever is ready (up to [`BATCH`], with [`PREFETCH`] in flight) goes into one
//! multi-row idempotent INSERT; after the commit the orders leave Redis's `pending` hash;
//! then one `ack` with `multiple` covers the whole batch. A crash anywhere before the ack
//! means redelivery, which the unique key on `order_sn` turns into a no-op. While MySQL or
//! Redis is down the batch is retried with growing pauses, never in a busy loop, and
//! nothing is acked; an unparseable message is dead-lettered at once.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, BasicRejectOptions};
use lapin::types::FieldTable;
use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::domain::{ItemId, OrderPlaced};
use crate::keys::Keys;
use crate::store::{Db, DbError, RedisConns, RedisError, redis_timed};

use super::repo::{self, OrderStatus};

const PREFETCH: u16 = 2_000;
const BATCH: usize = 500;
const MAX_BACKOFF: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct Consumer {
    pub broker: Broker,
    pub db: Db,
    pub redis: RedisConns,
    pub keys: Keys,
}

/// Why a consuming session ended.
enum Ended {
    Shutdown,
    Broker(lapin::Error),
    /// The broker cancelled the consumer (the queue was deleted, the channel closed).
    Cancelled,
}

impl Consumer {
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            let Some(channel) = self.broker.open_channel(&shutdown).await else {
                return;
            };
            let ended = match channel {
                Ok(channel) => self.consume(channel, &shutdown).await,
                Err(e) => Ended::Broker(e),
            };
            match ended {
                Ended::Shutdown => return,
                Ended::Broker(e) => {
                    tracing::warn!(error = %crate::error::cause_chain(&e), "order consumer lost its channel; resuming");
                }
                Ended::Cancelled => {
                    tracing::warn!("order consumer was cancelled by the broker; resuming");
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    async fn consume(&self, channel: lapin::Channel, shutdown: &CancellationToken) -> Ended {
        let started = async {
            channel
                .basic_qos(PREFETCH, BasicQosOptions::default())
                .await?;
            channel
                .basic_consume(
                    self.broker.topology().orders_queue.as_str().into(),
                    format!("seckill-{}", ulid::Ulid::new()).as_str().into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
        };
        let consumer = match started.await {
            Ok(consumer) => consumer,
            Err(e) => return Ended::Broker(e),
        };
        tracing::info!(queue = %self.broker.topology().orders_queue, "order consumer started");
        let mut batches = consumer.ready_chunks(BATCH);
        loop {
            let batch = tokio::select! {
                () = shutdown.cancelled() => {
                    // Unacked prefetched messages go back to the queue when the channel closes.
                    let _ = channel.close(200, "shutting down".into()).await;
                    return Ended::Shutdown;
                }
                batch = batches.next() => batch,
            };
            let Some(batch) = batch else {
                return Ended::Cancelled;
            };
            let mut deliveries = Vec::with_capacity(batch.len());
            for delivery in batch {
                match delivery {
                    Ok(d) => deliveries.push(d),
                    Err(e) => return Ended::Broker(e),
                }
            }
            match self.handle(deliveries, shutdown).await {
                Ok(true) => {}
                Ok(false) => return Ended::Shutdown,
                Err(e) => return Ended::Broker(e),
            }
        }
    }

    /// Writes one batch and acks it. `Ok(false)`: shut down before it was written (nothing
    /// acked; the broker redelivers).
    async fn handle(
        &self,
        deliveries: Vec<Delivery>,
        shutdown: &CancellationToken,
    ) -> Result<bool, lapin::Error> {
        let started = Instant::now();
        let mut orders = Vec::with_capacity(deliveries.len());
        let mut last_good = None;
        for delivery in deliveries {
            match serde_json::from_slice::<OrderPlaced>(&delivery.data) {
                Ok(order) => {
                    orders.push(order);
                    last_good = Some(delivery);
                }
                Err(e) => {
                    tracing::error!(
                        error = %e,
                        body = %String::from_utf8_lossy(&delivery.data).chars().take(200).collect::<String>(),
                        "unparseable order message; dead-lettered"
                    );
                    delivery
                        .reject(BasicRejectOptions { requeue: false })
                        .await?;
                }
            }
        }
        let Some(last_good) = last_good else {
            return Ok(true);
        };

        let Some(inserted) = retry("mysql", shutdown, || self.insert(&orders)).await else {
            return Ok(false);
        };
        tracing::info!(
            orders = orders.len(),
            inserted,
            outcome = "committed",
            duration_ms = started.elapsed().as_secs_f64() * 1e3,
            "mysql_insert"
        );
        if retry("redis", shutdown, || self.clear_pending(&orders))
            .await
            .is_none()
        {
            return Ok(false);
        }
        // One ack for the whole batch: every earlier delivery on this channel is either in
        // this batch or was rejected above.
        last_good.ack(BasicAckOptions { multiple: true }).await?;
        Ok(true)
    }

    /// Inserts the batch; returns how many rows were new.
    async fn insert(&self, orders: &[OrderPlaced]) -> Result<u64, ConsumeError> {
        let inserted = repo::insert_batch(&self.db, orders, OrderStatus::Unpaid).await?;
        if inserted as usize == orders.len() {
            return Ok(inserted);
        }
        // Some rows were there already (redelivery), or MySQL refused a second live order
        // of one user for one item. Record the refused ones, cancelled.
        let sns: Vec<&str> = orders.iter().map(|o| o.order_sn.as_str()).collect();
        let present: HashSet<String> = repo::existing(&self.db, &sns).await?.into_iter().collect();
        let refused: Vec<&OrderPlaced> = orders
            .iter()
            .filter(|o| !present.contains(o.order_sn.as_str()))
            .collect();
        if !refused.is_empty() {
            tracing::error!(
                orders = ?refused.iter().map(|o| o.order_sn.as_str()).collect::<Vec<_>>(),
                "MySQL refused a second live order of a user for an item; recorded as cancelled"
            );
            repo::insert_batch(&self.db, refused, OrderStatus::Cancelled).await?;
        }
        Ok(inserted)
    }

    /// The orders are in MySQL: they are no longer pending in Redis.
    async fn clear_pending(&self, orders: &[OrderPlaced]) -> Result<(), ConsumeError> {
        let mut by_item: HashMap<ItemId, Vec<&str>> = HashMap::new();
        for order in orders {
            by_item
                .entry(order.item_id)
                .or_default()
                .push(order.order_sn.as_str());
        }
        let mut pipe = redis::pipe();
        for (item, sns) in by_item {
            pipe.hdel(self.keys.pending(item), sns).ignore();
        }
        let mut conn = self.redis.bulk().await?;
        redis_timed(pipe.query_async::<()>(&mut *conn)).await?;
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
enum ConsumeError {
    #[error("inserting orders")]
    Insert(#[from] sqlx::Error),
    #[error("reading orders")]
    Read(#[from] DbError),
    #[error("clearing pending orders")]
    Redis(#[from] RedisError),
}

/// Runs `step` until it succeeds, pausing longer after each failure (up to
/// [`MAX_BACKOFF`]); `None` if shutdown came first.
async fn retry<T, F, Fut>(what: &str, shutdown: &CancellationToken, mut step: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ConsumeError>>,
{
    let mut pause = Duration::from_millis(100);
    let mut failures = 0u32;
    loop {
        match step().await {
            Ok(value) => {
                if failures > 0 {
                    tracing::info!(store = what, failures, "order consumer: store is back");
                }
                return Some(value);
            }
            Err(e) => {
                failures += 1;
                if failures == 1 || failures.is_power_of_two() {
                    tracing::warn!(store = what, failures, error = %crate::error::cause_chain(&e), "order consumer: write failed; retrying");
                }
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return None,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(MAX_BACKOFF);
    }
}
