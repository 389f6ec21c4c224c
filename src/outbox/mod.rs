//! The Redis outbox: how a won order reaches MySQL even when RabbitMQ, the consumer or a
//! process dies on the way.
//!
//! `grab.lua` writes every won order into the item's `pending` hash (its JSON, until the
//! consumer has it in MySQL) in the same atomic step that sells the unit. The purchase's
//! own publisher sends it at once; a confirm notes it in the item's `confirmed` set, which
//! the consumer empties with `pending`. An order that publisher could not deliver goes into
//! the item's `outbox` sorted set, where the relay finds it. So where a pending order is:
//!
//! | outbox | confirmed | the order |
//! |---|---|---|
//! | – | – | won and with its publisher (in its buffer or on its way to RabbitMQ), or lost to it: its process died, or its give-back kept it |
//! | when it was won (ms) | – | for the relay: the broker did not confirm it, or there was none, or the buffer was full, or the safety sweep found it lost |
//! | negative | – | claimed: a sender waits for Redis's replicas before it sends ([`cleared_to_send`]), or an answer naming it (a repeat of the `Idempotency-Key` that bought it, a `409` to its buyer) waits for them before it is given (`lua/lib/repeats.lua`) |
//! | – | ✓ | confirmed by RabbitMQ, waiting for the consumer |
//!
//! The [`publisher`] sends new orders at once, in batches, and enters what the broker did
//! not confirm; the [`relay`] sends again whatever stayed in the outbox too long, and the
//! safety sweep ([`relay::Relay::sweep_pending`]) enters the orders in neither set well
//! after any publisher would have delivered them. Inserts are idempotent, so sending twice
//! is harmless and sending never is impossible.
//!
//! The grab used to enter every win itself (servers up to commit 668f7da, 2026-12-03), then
//! the publisher entered each batch before sending it (up to commit 3136a93); each entry
//! and its removal cost a won order a tenth of its Redis work. Older servers read the
//! outbox as before (an entry: not confirmed), the oldest never the `confirmed` set: to
//! them a confirmed order not yet written looks unsent after their sweep's delay, and they
//! send it again, harmlessly.

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
    /// Whether the broker confirmed each order, in the order they were given (the
    /// confirmed ones are out of their outboxes, in `confirmed`).
    pub each: Vec<bool>,
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
    let not_cleared = mark_confirmed(redis, keys, sent).await.err();
    Sent {
        each: confirmed,
        took,
        not_cleared,
    }
}

impl Sent {
    /// Whether the broker left any of them unconfirmed.
    pub fn any_unconfirmed(&self) -> bool {
        self.each.contains(&false)
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
