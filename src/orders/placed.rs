//! Won orders arriving in MySQL: the idempotent write, then the Redis follow-up (no longer
//! pending; deadline and reminders scheduled). The consumer does this for every order; a
//! pay or cancel of an order still on its way does it for that one order first. Reading
//! an order still pending is here too.

use std::collections::{HashMap, HashSet};

use redis::AsyncCommands;

use crate::delay_queue::Plan;
use crate::domain::{BucketId, OrderPlaced, OrderSn, UserId};
use crate::keys::{ItemKeys, Keys};
use crate::marks::{self, Work};
use crate::store::{
    Db, DbError, Grouped, RedisConns, RedisError, mysql_begin, mysql_timed, redis_timed,
    retrying_deadlocks,
};

use super::repo::{self, OrderStatus};

/// Rows per INSERT statement.
const ROWS_PER_INSERT: usize = 1_000;

/// Writes the orders with multi-row idempotent INSERTs in one transaction (one commit,
/// so one log flush, per batch rather than per statement): an order already there (a
/// message delivered twice) is left as it is.
///
/// A pay or cancel writing its pending order while the consumer writes a batch holding
/// the same order can deadlock on the unique keys; MySQL then rolls one transaction back
/// whole, and that one is simply tried again.
pub async fn write(db: &Db, orders: &[OrderPlaced]) -> Result<(), DbError> {
    retrying_deadlocks("order write", || write_once(db, orders)).await
}

async fn write_once(db: &Db, orders: &[OrderPlaced]) -> Result<(), DbError> {
    let mut tx = mysql_begin(db).await?;
    for rows in orders.chunks(ROWS_PER_INSERT) {
        mysql_timed(repo::insert_batch(&mut *tx, rows, OrderStatus::Unpaid)).await?;
        // The affected-rows count cannot tell a redelivered order (already there) from
        // one MySQL refused as a second live order of a user for an item: the driver
        // counts an untouched duplicate as affected. So ask, with one count first.
        // Distinct: one order twice in a batch is one row, not a refused second one.
        let mut sns: Vec<&str> = rows.iter().map(|o| o.order_sn.as_str()).collect();
        sns.sort_unstable();
        sns.dedup();
        if repo::count_existing(&mut *tx, &sns).await? == sns.len() as u64 {
            continue;
        }
        let present: HashSet<String> = repo::existing(&mut *tx, &sns).await?.into_iter().collect();
        let refused: Vec<&OrderPlaced> = rows
            .iter()
            .filter(|o| !present.contains(o.order_sn.as_str()))
            .collect();
        tracing::error!(
            orders = ?refused.iter().map(|o| o.order_sn.as_str()).collect::<Vec<_>>(),
            "MySQL refused a second live order of a user for an item; recorded as cancelled"
        );
        mysql_timed(repo::insert_batch(
            &mut *tx,
            refused,
            OrderStatus::Cancelled,
        ))
        .await?;
    }
    mysql_timed(tx.commit()).await?;
    Ok(())
}

/// The orders are in MySQL: they leave Redis's `pending` hash (and the outbox's `confirmed`
/// set), and their deadline and reminders go into the delay queue, in one round trip (then
/// their buckets are marked for the deadline pass, in a second).
pub async fn settle_in_redis(
    redis: &RedisConns,
    keys: &Keys,
    plan: &Plan,
    orders: &[OrderPlaced],
) -> Result<(), RedisError> {
    let mut by_bucket: HashMap<BucketId, Vec<&str>> = HashMap::new();
    let mut grouped = Grouped::new(redis);
    plan.schedule(&mut grouped, keys, orders);
    for order in orders {
        by_bucket
            .entry(order.order_sn.bucket())
            .or_default()
            .push(order.order_sn.as_str());
    }
    for (bucket, sns) in &by_bucket {
        // With their marks as confirmed, and any outbox entry (a claim made to write it:
        // `crate::outbox::cleared_to_send`).
        grouped
            .group()
            .hdel(keys.pending(*bucket), sns)
            .ignore()
            .srem(keys.confirmed(*bucket), sns)
            .ignore()
            .zrem(keys.outbox(*bucket), sns)
            .ignore();
    }
    grouped.run(redis).await?;
    // After the tasks are written: the deadline pass reads them when it takes the mark.
    let mut conn = redis.bulk().await?;
    marks::mark(&mut conn, keys, Work::Deadlines, by_bucket.into_keys()).await
}

/// The orders `user` holds of an item, as the buyer record in their home bucket (`keys`)
/// names them (by place: `lua/lib/places.lua`).
pub async fn held_by(
    redis: &RedisConns,
    keys: &ItemKeys,
    user: UserId,
) -> Result<Vec<OrderSn>, RedisError> {
    let mut conn = redis.hot().await?;
    let record: Option<String> =
        redis_timed(conn.hget(keys.buyer_orders(user), user.get())).await?;
    Ok(record
        .iter()
        .flat_map(|r| orders_in(r))
        .filter_map(OrderSn::parse)
        .collect())
}

/// Whether none of `orders` (what [`held_by`] read of `user`'s record) is pending, and the
/// record still names each: both read at one instant, so that an order given back meanwhile
/// (`lua/give_back.lua` drops it from both) is not taken for one written to MySQL.
pub async fn none_pending(
    redis: &RedisConns,
    keys: &ItemKeys,
    user: UserId,
    orders: &[OrderSn],
) -> Result<bool, RedisError> {
    if orders.is_empty() {
        return Ok(true);
    }
    let sns: Vec<&str> = orders.iter().map(OrderSn::as_str).collect();
    let mut conn = redis.hot().await?;
    let (record, pending): (Option<String>, Vec<Option<String>>) = redis_timed(
        redis::pipe()
            .atomic()
            .hget(keys.buyer_orders(user), user.get())
            .cmd("HMGET")
            .arg(&keys.pending)
            .arg(&sns)
            .query_async(&mut conn),
    )
    .await?;
    let named: HashSet<&str> = record
        .as_deref()
        .map(orders_in)
        .into_iter()
        .flatten()
        .collect();
    Ok(pending.iter().all(Option::is_none) && sns.iter().all(|sn| named.contains(sn)))
}

/// The order numbers a buyer record holds, by place (`lua/lib/places.lua`: `-` marks a
/// free place).
pub fn orders_in(record: &str) -> impl Iterator<Item = &str> {
    places_in(record).map(|(_, sn)| sn)
}

/// [`orders_in`] with each order's place (its `slot`).
pub fn places_in(record: &str) -> impl Iterator<Item = (u8, &str)> {
    record
        .split(' ')
        .enumerate()
        .filter(|(_, place)| *place != "-")
        .map(|(slot, sn)| (u8::try_from(slot).unwrap_or(u8::MAX), sn))
}

/// The order as Redis's `pending` hash holds it (won, not yet in MySQL), if it does.
pub async fn pending(
    redis: &RedisConns,
    keys: &Keys,
    sn: &OrderSn,
) -> Result<Option<OrderPlaced>, RedisError> {
    let mut conn = redis.hot().await?;
    let json: Option<String> =
        redis_timed(conn.hget(keys.pending(sn.bucket()), sn.as_str())).await?;
    json.map(|json| {
        serde_json::from_str(&json)
            .map_err(|e| RedisError::Unexpected(format!("pending order JSON: {e}")))
    })
    .transpose()
}
