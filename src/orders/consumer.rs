//! The consumer role: takes won orders off RabbitMQ and writes them to MySQL.
//!
//! A message carries one order or an array of them (the publisher sends up to 500 per
//! message). Whatever messages are ready (up to [`BATCH_BYTES`], with [`PREFETCH`] in
//! flight) are written with multi-row idempotent INSERTs (see [`placed::write`]); after the
//! commits the orders leave Redis's `pending` hash and their pay deadlines are scheduled;
//! then one `ack` with `multiple` covers the batch. A crash anywhere before the ack means
//! redelivery, which the unique key on `order_sn` turns into a no-op. While MySQL or Redis
//! is down the batch is retried with growing pauses, never in a busy loop, and nothing is
//! acked. What can never be written goes to the dead-letter queue with the reason, and the
//! rest of its batch lands: a message that cannot be read (after any readable orders in it
//! are written), an order whose times MySQL cannot hold, an order MySQL refuses.

use std::borrow::Cow;
use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio_util::sync::CancellationToken;

use crate::background;
use crate::broker::{Broker, CLOSE_WITHIN, DeadLetter, Gone, Opened, Outbound, publish};
use crate::delay_queue::Plan;
use crate::deps::Deps;
use crate::domain::{OrderPlaced, OrderSn};
use crate::keys::Keys;
use crate::store::{Db, RedisConns, StoreError};
use crate::telemetry::Meters;

use super::placed;

/// Messages in flight to each worker: at most 2 × 64 messages of up to 500 orders (an
/// order is about 140 bytes of JSON: about 9 MB) wait in memory.
const PREFETCH: u16 = 64;
/// At most about this many bytes of messages are taken per batch (about 11,000 orders):
/// counted in bytes, not messages, since a message holds one order or 500. Bigger batches
/// mean fewer statements and acks per order (measured with messages of up to 100 orders:
/// 32k orders/s at 32 messages a batch, 40k at 128, about as many bytes as this).
const BATCH_BYTES: usize = 1536 << 10;
/// Consuming loops per process, each with its own channel: while one waits for MySQL to
/// commit, another parses and inserts. Measured on 2 cores: 22k orders/s with one worker,
/// 32k with two, 33k with four.
const WORKERS: usize = 2;
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long a channel, its set-up, an ack or a nack may take.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// While MySQL answers, the longest a consumer holds an order it took before committing
/// it: a batch is written in well under a second (measured: 8,000 orders in 420 ms), and
/// one whose write failed is tried again within [`MAX_BACKOFF`]. (A rebuild of a Redis
/// that lost its `pending` hash waits this out after seeing the order queue empty.)
pub const HOLDS_AT_MOST: Duration = Duration::from_secs(MAX_BACKOFF.as_secs() + 3);

#[derive(Clone)]
pub struct Consumer {
    broker: Broker,
    db: Db,
    redis: RedisConns,
    keys: Keys,
    /// What to schedule for each order once it is written.
    plan: Plan,
    meters: Arc<Meters>,
}

impl Consumer {
    pub fn new(deps: &Deps) -> Self {
        Consumer {
            broker: deps.broker.clone(),
            db: deps.db.clone(),
            redis: deps.redis.clone(),
            keys: deps.keys.clone(),
            plan: Plan::from_settings(&deps.settings),
            meters: deps.meters.clone(),
        }
    }
}

/// The next batch: the first message to come, then every one already here, until the
/// batch holds [`BATCH_BYTES`]. (An error drops what was gathered: unacked, it comes again
/// on the next channel.)
async fn next_batch(consumer: &mut lapin::Consumer) -> Option<Result<Vec<Delivery>, lapin::Error>> {
    let first = match consumer.next().await? {
        Ok(first) => first,
        Err(e) => return Some(Err(e)),
    };
    let mut bytes = first.data.len();
    let mut batch = vec![first];
    while bytes < BATCH_BYTES {
        match consumer.next().now_or_never() {
            Some(Some(Ok(delivery))) => {
                bytes += delivery.data.len();
                batch.push(delivery);
            }
            Some(Some(Err(e))) => return Some(Err(e)),
            // Nothing more here yet, or the consumer ended (the next call tells).
            Some(None) | None => break,
        }
    }
    Some(Ok(batch))
}

/// Why a consuming session ended.
enum Ended {
    Shutdown,
    Broker(lapin::Error),
    /// The broker did not answer within [`ANSWER_WITHIN`] (a node that died under the
    /// channel has been seen to leave an ack waiting forever): the session is dropped and
    /// its unacked messages come again on a new one.
    Unanswered,
    /// The broker cancelled the consumer (the queue was deleted, the channel closed).
    Cancelled,
    /// The link gave up the connection (its node lost or gone silent).
    GivenUp,
}

impl Consumer {
    /// Runs [`WORKERS`] consuming loops until shutdown.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..WORKERS {
            workers.spawn(self.clone().work(shutdown.clone()));
        }
        while workers.join_next().await.is_some() {}
    }

    /// One consuming loop on a channel of its own, reopened whenever it is lost.
    async fn work(self, shutdown: CancellationToken) {
        loop {
            let opened = tokio::time::timeout(ANSWER_WITHIN, self.broker.open_channel(&shutdown));
            let ended = match opened.await {
                Ok(None) => return,
                Err(_) => Ended::Unanswered,
                Ok(Some(Ok(Opened { channel, mut gone }))) => {
                    let ended = self.consume(&channel, &mut gone, &shutdown).await;
                    // Whatever ended the session: unacked messages go back to the queue,
                    // and the connection forgets the channel.
                    let closing = channel.close(200, "consumer done".into());
                    let _ = tokio::time::timeout(CLOSE_WITHIN, closing).await;
                    ended
                }
                Ok(Some(Err(e))) => Ended::Broker(e),
            };
            match ended {
                Ended::Shutdown => return,
                Ended::Broker(e) => {
                    tracing::warn!(error = %crate::error::cause_chain(&e), "order consumer lost its channel; resuming");
                }
                Ended::Cancelled => {
                    tracing::warn!("order consumer was cancelled by the broker; resuming");
                }
                Ended::GivenUp => {
                    tracing::warn!("order consumer's connection was given up; resuming");
                }
                Ended::Unanswered => {
                    tracing::warn!(
                        "the broker did not answer the order consumer within {} s; a new channel",
                        ANSWER_WITHIN.as_secs()
                    );
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    async fn consume(
        &self,
        channel: &lapin::Channel,
        gone: &mut Gone,
        shutdown: &CancellationToken,
    ) -> Ended {
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
        let mut consumer = match tokio::time::timeout(ANSWER_WITHIN, started).await {
            Ok(Ok(consumer)) => consumer,
            Ok(Err(e)) => return Ended::Broker(e),
            Err(_) => return Ended::Unanswered,
        };
        tracing::info!(queue = %self.broker.topology().orders_queue, "order consumer started");
        loop {
            let batch = tokio::select! {
                () = shutdown.cancelled() => return Ended::Shutdown,
                () = gone.wait() => return Ended::GivenUp,
                batch = next_batch(&mut consumer) => batch,
            };
            let deliveries = match batch {
                None => return Ended::Cancelled,
                Some(Err(e)) => return Ended::Broker(e),
                Some(Ok(deliveries)) => deliveries,
            };
            match self.handle(deliveries, shutdown).await {
                Ok(true) => {}
                Ok(false) => return Ended::Shutdown,
                Err(ended) => return ended,
            }
        }
    }

    /// Writes one batch and acks it. `Ok(false)`: shut down before it was written (nothing
    /// acked; the broker redelivers).
    async fn handle(
        &self,
        deliveries: Vec<Delivery>,
        shutdown: &CancellationToken,
    ) -> Result<bool, Ended> {
        let started = Instant::now();
        let mut messages: Vec<Message> = deliveries.into_iter().map(Message::read).collect();
        // Each order once: a message and its redelivered copy can share a batch.
        let orders: Vec<OrderPlaced> = {
            let mut seen = HashSet::new();
            messages
                .iter()
                .flat_map(|m| &m.orders)
                .filter(|o| seen.insert(o.order_sn.as_str()))
                .cloned()
                .collect()
        };

        if !orders.is_empty()
            && self
                .land(&mut messages, &orders, started, shutdown)
                .await
                .is_none()
        {
            return Ok(false);
        }

        let letters: Vec<DeadLetter> = messages.iter().flat_map(Message::dead_letters).collect();
        if !letters.is_empty() && !self.dead_letter(&letters).await {
            // Not set aside yet: the whole batch comes again (what landed is idempotent).
            tokio::select! {
                () = shutdown.cancelled() => return Ok(false),
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            if let Some(last) = messages.last() {
                answered(last.delivery.nack(BasicNackOptions {
                    multiple: true,
                    requeue: true,
                }))
                .await?;
            }
            return Ok(true);
        }
        // One ack for the batch: every earlier delivery on this channel is in it.
        if let Some(last) = messages.last() {
            answered(last.delivery.ack(BasicAckOptions { multiple: true })).await?;
        }
        Ok(true)
    }

    /// Writes the batch's orders to MySQL (each refused one set aside in its message) and
    /// settles the landed ones in Redis. `None`: shutting down before that was done.
    async fn land(
        &self,
        messages: &mut [Message],
        orders: &[OrderPlaced],
        started: Instant,
        shutdown: &CancellationToken,
    ) -> Option<()> {
        let written = retry("writing orders to MySQL", shutdown, || self.insert(orders)).await?;
        if written == Written::Refused {
            // Some order MySQL will never take: find it, message by message and then
            // order by order, so that every other one lands.
            let refused = retry("finding the order MySQL refuses", shutdown, || {
                self.isolate(messages)
            })
            .await?;
            for (message, refused) in messages.iter_mut().zip(refused) {
                message.refused.extend(refused);
            }
        }
        let refused: HashSet<&OrderSn> = messages
            .iter()
            .flat_map(|m| m.refused.iter().map(|(o, _)| &o.order_sn))
            .collect();
        let landed: Cow<[OrderPlaced]> = if refused.is_empty() {
            Cow::Borrowed(orders)
        } else {
            orders
                .iter()
                .filter(|o| !refused.contains(&o.order_sn))
                .cloned()
                .collect()
        };
        self.meters.mysql_insert_seconds.record(started.elapsed());
        self.meters.written.increment(landed.len() as u64);
        tracing::info!(
            orders = landed.len(),
            messages = messages.len(),
            outcome = "committed",
            duration_ms = started.elapsed().as_secs_f64() * 1e3,
            "mysql_insert"
        );
        retry("settling orders in Redis", shutdown, || {
            self.settle(&landed)
        })
        .await
    }

    /// Writes the orders in one transaction; `Refused` when MySQL refused some of the data
    /// (nothing was written then).
    async fn insert(&self, orders: &[OrderPlaced]) -> Result<Written, StoreError> {
        match placed::write(&self.db, orders).await {
            Ok(()) => Ok(Written::All),
            Err(e) if e.is_refusal() => {
                tracing::warn!(error = %crate::error::cause_chain(&e), "MySQL refused a batch of orders; writing them one message at a time");
                Ok(Written::Refused)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Writes each message's orders on its own, and the orders of a refused message one by
    /// one: the orders MySQL refused, with its reason, message by message.
    async fn isolate(&self, messages: &[Message]) -> Result<Vec<Refused>, StoreError> {
        let mut refused_by_message = Vec::with_capacity(messages.len());
        for message in messages {
            let mut refused = Vec::new();
            match placed::write(&self.db, &message.orders).await {
                Ok(()) => {
                    refused_by_message.push(refused);
                    continue;
                }
                Err(e) if e.is_refusal() => {}
                Err(e) => return Err(e.into()),
            }
            for order in &message.orders {
                match placed::write(&self.db, std::slice::from_ref(order)).await {
                    Ok(()) => {}
                    Err(e) if e.is_refusal() => {
                        let reason =
                            format!("MySQL refused the order: {}", crate::error::cause_chain(&e));
                        tracing::error!(order_sn = %order.order_sn, reason, "order dead-lettered");
                        refused.push((order.clone(), reason));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            refused_by_message.push(refused);
        }
        Ok(refused_by_message)
    }

    async fn settle(&self, orders: &[OrderPlaced]) -> Result<(), StoreError> {
        Ok(placed::settle_in_redis(&self.redis, &self.keys, &self.plan, orders).await?)
    }

    /// Sets letters aside in the dead-letter queue; whether the broker took them all.
    async fn dead_letter(&self, letters: &[DeadLetter]) -> bool {
        let Some(channel) = self.broker.publish_channel() else {
            return false;
        };
        let letters: Vec<Outbound> = letters.iter().map(Outbound::DeadLetter).collect();
        let taken = publish(&channel, self.broker.topology(), &letters)
            .await
            .into_iter()
            .all(|taken| taken);
        if taken {
            self.meters.dead_lettered(letters.len() as u64);
        }
        taken
    }
}

/// Orders that cannot be written, each with why.
type Refused = Vec<(OrderPlaced, String)>;

/// How a batch write went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Written {
    All,
    /// MySQL refused some order's data; nothing of the batch was written.
    Refused,
}

/// One delivery, read.
struct Message {
    delivery: Delivery,
    /// The orders it holds that can be written.
    orders: Vec<OrderPlaced>,
    /// Why part of it could not be read.
    unreadable: Option<String>,
    /// Its orders that cannot be written (out of range, or refused by MySQL).
    refused: Refused,
}

impl Message {
    fn read(delivery: Delivery) -> Self {
        let parsed = parse(&delivery.data);
        let (orders, out_of_range): (Vec<_>, Vec<_>) = parsed
            .orders
            .into_iter()
            .partition(|o| o.out_of_range().is_none());
        let refused = out_of_range
            .into_iter()
            .map(|o| {
                let reason = o.out_of_range().unwrap_or_default().to_owned();
                tracing::error!(order_sn = %o.order_sn, reason, "order dead-lettered");
                (o, reason)
            })
            .collect();
        if let Some(problem) = &parsed.unreadable {
            tracing::error!(
                problem,
                body = %String::from_utf8_lossy(&delivery.data).chars().take(300).collect::<String>(),
                "unreadable order message; dead-lettered"
            );
        }
        Self {
            delivery,
            orders,
            unreadable: parsed.unreadable,
            refused,
        }
    }

    /// What of it goes to the dead-letter queue: the whole message if part of it could not
    /// be read, and the orders that could not be written.
    fn dead_letters(&self) -> Vec<DeadLetter> {
        let mut letters = Vec::new();
        if let Some(problem) = &self.unreadable {
            letters.push(DeadLetter {
                body: self.delivery.data.clone(),
                reason: format!("unreadable: {problem}"),
            });
        }
        if let Some((_, reason)) = self.refused.first() {
            let orders: Vec<&OrderPlaced> = self.refused.iter().map(|(o, _)| o).collect();
            letters.push(DeadLetter {
                body: serde_json::to_vec(&orders).unwrap_or_default(),
                reason: reason.clone(),
            });
        }
        letters
    }
}

/// What a message holds.
#[derive(Debug, PartialEq)]
struct Parsed {
    orders: Vec<OrderPlaced>,
    /// Why a part of the message could not be read.
    unreadable: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    Many(Vec<OrderPlaced>),
    One(OrderPlaced),
}

/// An array of orders or a single order. From an array with unreadable elements the
/// readable ones are kept, so one bad element never holds the others hostage.
fn parse(data: &[u8]) -> Parsed {
    if let Ok(read) = serde_json::from_slice::<OneOrMany>(data) {
        let orders = match read {
            OneOrMany::Many(orders) => orders,
            OneOrMany::One(order) => vec![order],
        };
        return Parsed {
            orders,
            unreadable: None,
        };
    }
    let elements = match serde_json::from_slice::<Vec<serde_json::Value>>(data) {
        Ok(elements) => elements,
        Err(e) => {
            let problem = match serde_json::from_slice::<OrderPlaced>(data) {
                Err(as_order) if !as_order.is_syntax() && !as_order.is_eof() => as_order,
                _ => e,
            };
            return Parsed {
                orders: Vec::new(),
                unreadable: Some(problem.to_string()),
            };
        }
    };
    let mut problem = None;
    let orders = elements
        .into_iter()
        .filter_map(|e| {
            serde_path_to_error::deserialize(e)
                .map_err(|e| {
                    problem
                        .get_or_insert_with(|| format!("an element: `{}`: {}", e.path(), e.inner()))
                })
                .ok()
        })
        .collect();
    Parsed {
        orders,
        unreadable: problem,
    }
}

/// An ack or a nack, within [`ANSWER_WITHIN`].
async fn answered<T>(settle: impl Future<Output = Result<T, lapin::Error>>) -> Result<(), Ended> {
    match tokio::time::timeout(ANSWER_WITHIN, settle).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(Ended::Broker(e)),
        Err(_) => Err(Ended::Unanswered),
    }
}

/// [`background::retry`] for a store the consumer needs: the error with its causes.
async fn retry<T, F, Fut>(what: &str, shutdown: &CancellationToken, mut step: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let what = format!("order consumer: {what}");
    background::retry(&what, MAX_BACKOFF, shutdown, || {
        let attempt = step();
        async move { attempt.await.map_err(|e| crate::error::cause_chain(&e)) }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{BucketId, ItemId, OrderSn, UserId};

    fn order(user: u64) -> OrderPlaced {
        let item = ItemId::new(3).unwrap();
        OrderPlaced {
            order_sn: OrderSn::generate(BucketId::whole(item), false),
            item_id: item,
            user_id: UserId::new(user),
            created_at_ms: 1,
            pay_deadline_ms: 2,
            slot: 0,
        }
    }

    #[test]
    fn messages_hold_one_order_or_many() {
        let one = order(1);
        let parsed = parse(&serde_json::to_vec(&one).unwrap());
        assert_eq!(
            parsed,
            Parsed {
                orders: vec![one],
                unreadable: None
            }
        );
        let many = vec![order(1), order(2)];
        let parsed = parse(&serde_json::to_vec(&many).unwrap());
        assert_eq!(
            parsed,
            Parsed {
                orders: many,
                unreadable: None
            }
        );
    }

    #[test]
    fn unreadable_parts_are_named_and_readable_ones_kept() {
        let good = order(1);
        let body = format!(
            "[{}, {{\"order_sn\": 5}}]",
            serde_json::to_string(&good).unwrap()
        );
        let parsed = parse(body.as_bytes());
        assert_eq!(parsed.orders, vec![good]);
        assert!(
            parsed
                .unreadable
                .as_deref()
                .is_some_and(|p| p.contains("order_sn")),
            "{parsed:?}"
        );
        let parsed = parse(b"{not json");
        assert!(parsed.orders.is_empty());
        assert!(parsed.unreadable.is_some());
        let parsed = parse(br#"{"order_sn": "1-x"}"#);
        assert!(
            parsed
                .unreadable
                .as_deref()
                .is_some_and(|p| p.contains("order number")),
            "{parsed:?}"
        );
        assert_eq!(
            parse(b"[]"),
            Parsed {
                orders: vec![],
                unreadable: None
            }
        );
    }
}
