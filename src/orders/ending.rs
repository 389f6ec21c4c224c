//! Ending orders — by their owner, at their pay deadline, at the end of a sale — and giving
//! their units back to the sale.
//!
//! First the cancel is recorded as begun (the item's `ending` set in Redis), then MySQL
//! decides (a conditional `UPDATE … WHERE status = 'unpaid'`), then `release.lua` returns
//! the unit and clears the record. The release is idempotent and keyed on the buyer
//! record, so it is safe to run again for any cancelled order: a request cut off between
//! MySQL and Redis, or a process that died there, leaves its record behind, and the
//! scheduler's [`finish_cut_off`] sweep returns the unit within seconds — rather than at
//! the order's deadline or the end of the sale.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use chrono::Utc;

use crate::domain::{OrderSn, Stock, UserId};
use crate::items::catalog;
use crate::keys::Keys;
use crate::lua::{FORGET, RELEASE};
use crate::marks::{self, Work};
use crate::store::{Db, Grouped, RedisConns, RedisError, StoreError, redis_timed};

use super::repo::{self, CancelReason, OrderRow, OrderStatus};

/// Orders per `release.lua` call (each brings two keys and two arguments).
const RELEASE_CHUNK: usize = 500;

/// An order whose unit should go back: who held it and its number.
#[derive(Clone, Debug)]
pub struct Held {
    /// The bucket holding the order's records.
    pub stock: Stock,
    pub user: UserId,
    pub order_sn: String,
}

impl From<&OrderRow> for Held {
    fn from(row: &OrderRow) -> Self {
        Self {
            stock: row.order_sn.stock(),
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
    let mut by_stock: BTreeMap<Stock, Vec<&Held>> = BTreeMap::new();
    for order in orders {
        by_stock.entry(order.stock).or_default().push(order);
    }
    let mut released = Vec::new();
    let mut back_items = BTreeSet::new();
    let mut conn = redis.bulk().await?;
    for (stock, orders) in by_stock {
        let item_keys = keys.stock(stock);
        let before = released.len();
        for chunk in orders.chunks(RELEASE_CHUNK) {
            let mut call = RELEASE.key(&item_keys.meta);
            call.key(&item_keys.tokens).key(keys.ending(stock));
            for order in chunk {
                call.key(item_keys.buyers(order.user))
                    .key(item_keys.buyer_orders(order.user))
                    .arg(order.user.get())
                    .arg(&order.order_sn);
            }
            let back: Vec<String> = redis_timed(call.invoke_async(&mut conn)).await?;
            released.extend(back);
        }
        if released.len() > before {
            tracing::info!(%stock, units = released.len() - before, "units back on sale");
            back_items.insert(stock.item);
        }
    }
    for item in back_items {
        if let Err(e) = catalog::announce_change(&mut conn, keys, item).await {
            tracing::warn!(%item, error = %e, "could not announce returned units; instances see them within a second anyway");
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

/// Records that these orders are about to be cancelled, before MySQL is asked: if the
/// caller is cut off after MySQL said yes, [`finish_cut_off`] returns their units.
pub async fn begin(redis: &RedisConns, keys: &Keys, sns: &[&OrderSn]) -> Result<(), RedisError> {
    if sns.is_empty() {
        return Ok(());
    }
    let now = Utc::now().timestamp_millis();
    let mut by_stock: BTreeMap<Stock, Vec<(i64, &str)>> = BTreeMap::new();
    for sn in sns {
        by_stock
            .entry(sn.stock())
            .or_default()
            .push((now, sn.as_str()));
    }
    let mut grouped = Grouped::new(redis);
    for (stock, members) in &by_stock {
        grouped
            .group()
            .zadd_multiple(keys.ending(*stock), members)
            .ignore();
    }
    grouped.run(redis).await?;
    let mut conn = redis.bulk().await?;
    marks::mark(&mut conn, keys, Work::CutOff, by_stock.into_keys()).await
}

/// These cancels ended without a unit to return (the order was paid, still unpaid, or
/// unknown): their records go.
pub async fn abandon(redis: &RedisConns, keys: &Keys, sns: &[&str]) -> Result<(), RedisError> {
    let mut grouped = Grouped::new(redis);
    for sn in sns {
        if let Some(parsed) = OrderSn::parse(sn) {
            grouped
                .group()
                .zrem(keys.ending(parsed.stock()), *sn)
                .ignore();
        }
    }
    grouped.run(redis).await
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
    let parsed: Vec<OrderSn> = sns.iter().filter_map(|sn| OrderSn::parse(sn)).collect();
    begin(redis, keys, &parsed.iter().collect::<Vec<_>>()).await?;
    let cancelled = repo::cancel_overdue(db, sns, reason).await?;
    let rows = repo::find_many(db, sns).await?;
    let mut outcome = Cancelled {
        cancelled,
        ..Default::default()
    };
    let found: HashSet<&str> = rows.iter().map(|r| r.order_sn.as_str()).collect();
    outcome.missing = sns
        .iter()
        .filter(|sn| !found.contains(**sn))
        .map(|sn| (*sn).to_owned())
        .collect();
    let mut ended = Vec::new();
    let mut moot: Vec<&str> = outcome.missing.iter().map(String::as_str).collect();
    for row in &rows {
        match row.status {
            OrderStatus::Cancelled => ended.push(Held::from(row)),
            OrderStatus::Unpaid => {
                outcome.still_unpaid.push(row.order_sn.to_string());
                moot.push(row.order_sn.as_str());
            }
            OrderStatus::Paid => moot.push(row.order_sn.as_str()),
        }
    }
    outcome.released = release(redis, keys, &ended).await?.len() as u64;
    abandon(redis, keys, &moot).await?;
    Ok(outcome)
}

/// A cancel begun this long ago has finished or was cut off: its request's budget and a
/// scheduler's store calls are long over.
pub const CUT_OFF_AFTER: Duration = Duration::from_secs(5);
/// Records looked at per bucket and sweep.
const SWEEP_BATCH: isize = 500;

/// Finishes cancels of these buckets that were cut off between MySQL and Redis: for every
/// record older than [`CUT_OFF_AFTER`], an order MySQL has cancelled gets its unit back;
/// any other record is dropped. Returns how many units came back.
pub async fn finish_cut_off(
    db: &Db,
    redis: &RedisConns,
    keys: &Keys,
    stocks: &[Stock],
) -> Result<u64, StoreError> {
    let cutoff = Utc::now().timestamp_millis() - CUT_OFF_AFTER.as_millis() as i64;
    let mut grouped = Grouped::new(redis);
    for stock in stocks {
        grouped
            .group()
            .zrangebyscore_limit(keys.ending(*stock), "-inf", cutoff, 0, SWEEP_BATCH);
    }
    let found: Vec<(Vec<String>,)> = grouped.query(redis).await?;
    let mut released = 0;
    for (stock, (sns,)) in stocks.iter().zip(found) {
        if !sns.is_empty() {
            released += finish_records(db, redis, keys, *stock, cutoff, &sns).await?;
        }
    }
    Ok(released)
}

/// One bucket's cut-off records: units back for those MySQL cancelled, the rest dropped.
async fn finish_records(
    db: &Db,
    redis: &RedisConns,
    keys: &Keys,
    stock: Stock,
    cutoff: i64,
    sns: &[String],
) -> Result<u64, StoreError> {
    let refs: Vec<&str> = sns.iter().map(String::as_str).collect();
    let rows = repo::find_many(db, &refs).await?;
    let cancelled: Vec<Held> = rows
        .iter()
        .filter(|r| r.status == OrderStatus::Cancelled)
        .map(Held::from)
        .collect();
    let back = release(redis, keys, &cancelled).await?.len() as u64;
    if back > 0 {
        tracing::warn!(%stock, units = back, "finished cancels that were cut off between MySQL and Redis");
    }
    // Not cancelled (paid, still unpaid, unknown): nothing to return. Dropped only if not
    // written again since (a newer cancel of the same order).
    let cancelled_sns: HashSet<&str> = cancelled.iter().map(|h| h.order_sn.as_str()).collect();
    let moot: Vec<&str> = refs
        .iter()
        .copied()
        .filter(|sn| !cancelled_sns.contains(sn))
        .collect();
    if !moot.is_empty() {
        let mut conn = redis.bulk().await?;
        redis_timed(
            FORGET
                .key(keys.ending(stock))
                .arg(cutoff)
                .arg(&moot)
                .invoke_async::<i64>(&mut conn),
        )
        .await?;
    }
    Ok(back)
}
