//! The Redis outbox: how a won order reaches MySQL even when RabbitMQ, the consumer or a
//! process dies on the way.
//!
//! `grab.lua` writes every won order into the item's `pending` hash (its JSON, until the
//! consumer has it in MySQL) and `outbox` set (until RabbitMQ confirms it) in the same
//! atomic step that sells the unit. The [`publisher`] sends new orders at once, in
//! batches; the [`relay`] sends again whatever stayed in the outbox too long. Inserts are
//! idempotent, so sending twice is harmless and sending never is impossible.

pub mod publisher;
pub mod relay;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use lapin::Channel;

use crate::broker::{Broker, Outgoing, publish_orders};
use crate::domain::{BucketId, OrderSn};
use crate::keys::Keys;
use crate::store::{Grouped, RedisConns, RedisError, redis_timed};
use crate::telemetry::Meters;

/// Where orders are sent from, for the log and the meters.
#[derive(Clone, Copy, Debug)]
pub enum Via {
    Publisher,
    Relay,
}

impl Via {
    fn name(self) -> &'static str {
        match self {
            Via::Publisher => "publisher",
            Via::Relay => "relay",
        }
    }
}

/// What one send did.
#[derive(Debug)]
pub struct Sent {
    pub orders: usize,
    /// How many the broker confirmed (these are out of their outboxes).
    pub confirmed: usize,
    pub took: Duration,
    /// Confirmed orders still in the outbox (Redis did not answer the clean-up): harmless,
    /// the relay sends them again and the insert is idempotent.
    pub not_cleared: Option<RedisError>,
}

/// The one way orders are sent: published with confirms, counted, logged, and the
/// confirmed ones taken out of their outboxes.
pub async fn send(
    channel: &Channel,
    broker: &Broker,
    outboxes: (&RedisConns, &Keys),
    meters: &Meters,
    via: Via,
    orders: &[Outgoing],
) -> Sent {
    let started = Instant::now();
    let confirmed = publish_orders(channel, broker.topology(), orders).await;
    let took = started.elapsed();
    let ok = confirmed.iter().filter(|c| **c).count();
    meters.mq_publish_seconds.record(took);
    meters.published.increment(ok as u64);
    tracing::info!(
        via = via.name(),
        orders = orders.len(),
        confirmed = ok,
        outcome = if ok == orders.len() {
            "confirmed"
        } else {
            "partly_confirmed"
        },
        duration_ms = took.as_secs_f64() * 1e3,
        "mq_publish"
    );
    let sent = orders
        .iter()
        .zip(&confirmed)
        .filter_map(|(order, ok)| ok.then_some(order));
    let (redis, keys) = outboxes;
    Sent {
        orders: orders.len(),
        confirmed: ok,
        took,
        not_cleared: clear_confirmed(redis, keys, sent).await.err(),
    }
}

/// Takes confirmed orders out of their items' outboxes, in one round trip.
async fn clear_confirmed<'a>(
    redis: &RedisConns,
    keys: &Keys,
    confirmed: impl Iterator<Item = &'a Outgoing>,
) -> Result<(), RedisError> {
    let mut by_stock: HashMap<BucketId, Vec<&str>> = HashMap::new();
    for order in confirmed {
        by_stock
            .entry(order.order_sn.bucket())
            .or_default()
            .push(order.order_sn.as_str());
    }
    let mut grouped = Grouped::new(redis);
    for (stock, sns) in by_stock {
        grouped.group().zrem(keys.outbox(stock), sns).ignore();
    }
    grouped.run(redis).await
}

/// Whether these won orders of one bucket may leave Redis for MySQL, when replicas are
/// asked for (`SECKILL_REDIS_WAIT_REPLICAS`; always, when not): a failover could otherwise
/// put their units back on sale while MySQL has their orders. Each is an order number and
/// when it was won (ms).
///
/// First they are claimed: their outbox score turns negative, so the purchase that won
/// one can no longer give it back (`lua/give_back.lua`) once it is on its way. Then the
/// replicas must hold everything written on the bucket's master, the claim included. Or,
/// should that master have no replica left that a failover could promote (it is alone for
/// good), they go anyway: nothing can undo its writes then but its own loss — the rule that
/// settles orders taken just before a master lost its last replica (docs/architecture.md: "A master
/// short of replicas"). False: they wait, and are asked about again.
pub async fn cleared_to_send(
    redis: &RedisConns,
    keys: &Keys,
    stock: BucketId,
    orders: &[(&OrderSn, i64)],
) -> Result<bool, RedisError> {
    if redis.wait_rule().is_none() || orders.is_empty() {
        return Ok(true);
    }
    let outbox = keys.outbox(stock);
    let replication = redis.replicas_for(&keys.replicated(stock)).await;
    // `XX`: only entries still there (one sent already needs no claim); `LT`: a claimed
    // score stays as it is.
    let mut claim = redis::cmd("ZADD");
    claim.arg(&outbox).arg("XX").arg("LT");
    for (order_sn, won_at_ms) in orders {
        claim.arg(-won_at_ms.abs()).arg(order_sn.as_str());
    }
    let mut conn = redis.bulk().await?;
    redis_timed(claim.query_async::<()>(&mut conn)).await?;
    let held = match replication {
        Ok(replication) => replication.held().await,
        Err(_) => false,
    };
    if held {
        return Ok(true);
    }
    if redis.alone(&outbox).await {
        tracing::warn!(
            %stock,
            orders = orders.len(),
            "sending won orders no Redis replica holds: their master has no replica left that could take over"
        );
        return Ok(true);
    }
    Ok(false)
}
