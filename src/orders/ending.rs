//! Ending orders — by their owner, at their pay deadline, at the end of a sale — and giving
//! their units back to the sale.
//!
//! MySQL decides (a conditional `UPDATE … WHERE status = 'unpaid'`), then `release.lua`
//! returns the unit. The release is idempotent and keyed on the buyer record, so it is
//! safe to run again for any cancelled order: whoever finds an order cancelled finishes
//! its release, and a process that died between the two steps loses nothing.

use std::collections::HashMap;

use crate::domain::{ItemId, UserId};
use crate::items::catalog;
use crate::keys::Keys;
use crate::lua::RELEASE;
use crate::store::{Db, RedisConns, RedisError, StoreError, redis_timed};

use super::repo::{self, CancelReason, OrderRow, OrderStatus};

/// Orders per `release.lua` call (each brings two keys and two arguments).
const RELEASE_CHUNK: usize = 500;

/// An order whose unit should go back: who held it and its number.
#[derive(Clone, Debug)]
pub struct Held {
    pub item: ItemId,
    pub user: UserId,
    pub order_sn: String,
}

impl From<&OrderRow> for Held {
    fn from(row: &OrderRow) -> Self {
        Self {
            item: row.item_id,
            user: row.user(),
            order_sn: row.order_sn.to_string(),
        }
    }
}

/// Gives the units of these ended orders back (those whose buyer record still names them),
/// then tells every instance about each item that got units back, so "sold out" clears
/// everywhere. Returns the order numbers whose unit came back.
pub async fn release(
    redis: &RedisConns,
    keys: &Keys,
    orders: &[Held],
) -> Result<Vec<String>, RedisError> {
    let mut by_item: HashMap<ItemId, Vec<&Held>> = HashMap::new();
    for order in orders {
        by_item.entry(order.item).or_default().push(order);
    }
    let mut released = Vec::new();
    let mut conn = redis.bulk().await?;
    for (item, orders) in by_item {
        let item_keys = keys.item(item);
        let before = released.len();
        for chunk in orders.chunks(RELEASE_CHUNK) {
            let mut call = RELEASE.key(&item_keys.meta);
            call.key(&item_keys.tokens);
            for order in chunk {
                call.key(item_keys.buyers(order.user))
                    .key(item_keys.buyer_orders(order.user))
                    .arg(order.user.get())
                    .arg(&order.order_sn);
            }
            let back: Vec<String> = redis_timed(call.invoke_async(&mut *conn)).await?;
            released.extend(back);
        }
        if released.len() > before {
            tracing::info!(%item, units = released.len() - before, "units back on sale");
            if let Err(e) = catalog::announce_change(&mut *conn, keys, item).await {
                tracing::warn!(%item, error = %e, "could not announce returned units; instances see them within a second anyway");
            }
        }
    }
    Ok(released)
}

/// What [`cancel_overdue`] did.
#[derive(Debug, Default)]
pub struct Cancelled {
    /// Orders this call moved from `unpaid` to `cancelled`.
    pub cancelled: u64,
    /// Units that came back (including those of orders cancelled earlier whose release
    /// had not happened).
    pub released: u64,
    /// Orders still unpaid: paid in the meantime is not among them, but a deadline not yet
    /// passed by MySQL's clock is (try again shortly).
    pub still_unpaid: Vec<String>,
    /// Order numbers MySQL does not have.
    pub missing: Vec<String>,
}

/// Cancels those of these orders that are unpaid past their deadline, then gives back the
/// unit of every one of them that is cancelled now.
pub async fn cancel_overdue(
    db: &Db,
    redis: &RedisConns,
    keys: &Keys,
    sns: &[&str],
    reason: CancelReason,
) -> Result<Cancelled, StoreError> {
    let cancelled = repo::cancel_overdue(db, sns, reason).await?;
    let rows = repo::find_many(db, sns).await?;
    let mut outcome = Cancelled {
        cancelled,
        ..Default::default()
    };
    let found: std::collections::HashSet<&str> = rows.iter().map(|r| r.order_sn.as_str()).collect();
    outcome.missing = sns
        .iter()
        .filter(|sn| !found.contains(**sn))
        .map(|sn| (*sn).to_owned())
        .collect();
    let mut ended = Vec::new();
    for row in &rows {
        match row.status {
            OrderStatus::Cancelled => ended.push(Held::from(row)),
            OrderStatus::Unpaid => outcome.still_unpaid.push(row.order_sn.to_string()),
            OrderStatus::Paid => {}
        }
    }
    outcome.released = release(redis, keys, &ended).await?.len() as u64;
    Ok(outcome)
}
