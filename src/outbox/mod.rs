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

use crate::broker::Outgoing;
use crate::domain::Stock;
use crate::keys::Keys;
use crate::store::{Grouped, RedisConns, RedisError};

/// Takes confirmed orders out of their items' outboxes, in one round trip.
pub async fn clear_confirmed<'a>(
    redis: &RedisConns,
    keys: &Keys,
    confirmed: impl Iterator<Item = &'a Outgoing>,
) -> Result<(), RedisError> {
    let mut by_stock: HashMap<Stock, Vec<&str>> = HashMap::new();
    for order in confirmed {
        by_stock
            .entry(order.order_sn.stock())
            .or_default()
            .push(order.order_sn.as_str());
    }
    let mut grouped = Grouped::new(redis);
    for (stock, sns) in by_stock {
        grouped.group().zrem(keys.outbox(stock), sns).ignore();
    }
    grouped.run(redis).await
}
