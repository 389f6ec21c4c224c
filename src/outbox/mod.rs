//! The Redis outbox: how a won order reaches MySQL even when RabbitMQ, the consumer or a
//! process dies on the way.
//!
//! `grab.lua` writes every won order into the item's `pending` hash (its JSON, until the
//! consumer has it in MySQL) in the same atomic step that sells the unit. Whoever sends it
//! first enters it in the item's `outbox` sorted set; a confirm moves it into the item's
//! `confirmed` set, which the consumer empties with `pending`. So where a pending order is:
//!
//! | outbox | confirmed | the order |
//! |---|---|---|
//! | – | – | won, not handed to a sender yet: in a publisher's buffer, or its process died, or the buffer was full, or its give-back kept it |
//! | when it was won (ms) | – | handed to a sender, not yet confirmed by RabbitMQ |
//! | negative | – | claimed: a sender waits for Redis's replicas before it sends ([`cleared_to_send`]) |
//! | – | ✓ | confirmed by RabbitMQ, waiting for the consumer |
//!
//! The [`publisher`] enters and sends new orders at once, in batches; the [`relay`] sends
//! again whatever stayed in the outbox unconfirmed too long, and the safety sweep
//! ([`relay::Relay::sweep_pending`]) enters the orders no publisher took. Inserts are
//! idempotent, so sending twice is harmless and sending never is impossible.
//!
//! The grab used to enter every win itself (servers up to commit 668f7da, 2026-12-03); a
//! sorted-set insert inside the script cost a tenth of a win's Redis instructions, and the
//! publisher enters a whole batch in one round trip. Old servers read the outbox as before
//! (an entry: not confirmed) and never the `confirmed` set.

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
    /// How many the broker confirmed (these are out of their outboxes, in `confirmed`).
    pub confirmed: usize,
    pub took: Duration,
    /// Confirmed orders still in the outbox (Redis did not answer the move): harmless, the
    /// relay sends them again and the insert is idempotent.
    pub not_cleared: Option<RedisError>,
}

/// The one way orders are sent: published with confirms, counted, logged, and the
/// confirmed ones moved from their outboxes to their `confirmed` sets.
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
        not_cleared: mark_confirmed(redis, keys, sent).await.err(),
    }
}

/// Moves confirmed orders from their items' outboxes to their `confirmed` sets, in one
/// round trip. One the consumer wrote meanwhile (RabbitMQ may deliver a message before it
/// confirms it) leaves a member there without a `pending` entry, which the safety sweep
/// takes out ([`relay::Relay::prune_confirmed`]).
async fn mark_confirmed<'a>(
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
        grouped
            .group()
            .zrem(keys.outbox(stock), &sns)
            .ignore()
            .sadd(keys.confirmed(stock), &sns)
            .ignore();
    }
    grouped.run(redis).await
}

/// Enters won orders in their items' outboxes as handed to a sender (each scored by when it
/// was won), in `grouped`'s round trip. `NX`: an entry there already (claimed) stays as it
/// is.
pub fn enter<'a>(grouped: &mut Grouped, keys: &Keys, orders: impl Iterator<Item = &'a Outgoing>) {
    let mut by_stock: HashMap<BucketId, Vec<&Outgoing>> = HashMap::new();
    for order in orders {
        by_stock
            .entry(order.order_sn.bucket())
            .or_default()
            .push(order);
    }
    for (stock, orders) in by_stock {
        let entry = grouped
            .group()
            .cmd("ZADD")
            .arg(keys.outbox(stock))
            .arg("NX");
        for order in orders {
            entry.arg(order.won_at_ms).arg(order.order_sn.as_str());
        }
        entry.ignore();
    }
}

/// Whether these won orders of one bucket may leave Redis for MySQL, when replicas are
/// asked for (`SECKILL_REDIS_WAIT_REPLICAS`; always, when not): a failover could otherwise
/// put their units back on sale while MySQL has their orders. Each is an order number and
/// when it was won (ms).
///
/// First they are claimed: their outbox score turns negative (an order not there yet is
/// entered so), so the purchase that won one can no longer give it back
/// (`lua/give_back.lua`) once it is on its way. Then the
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
    // `LT`: a claimed score stays as it is. Not `XX`: an order no one entered yet must be
    // claimed as well. A claim of an order the consumer took out meanwhile leaves an entry
    // without a `pending` one, which the relay drops; one confirmed already is sent again,
    // harmlessly.
    let mut claim = redis::cmd("ZADD");
    claim.arg(&outbox).arg("LT");
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
