//! Loading an item's units into Redis before its sale (the admin endpoint and
//! `seckill warmup` both come here).
//!
//! The units go into a side list in pipelined batches, are counted, and then replace the
//! live list in one MULTI together with the item's meta and its buyer records, so a sale
//! never sees a half-loaded list. The number loaded is `total - held`, where `held` counts
//! the orders that already hold a unit (live in MySQL, or won and still pending in Redis):
//! a reload after a Redis loss, or after `total` changed, can never sell a unit twice.
//! The meta hash is WATCHed from the first read to the swap: a sale, a pause or another
//! warm-up in between changes it and aborts this one instead of overwriting its work.

use std::collections::HashSet;

use chrono::Utc;
use redis::AsyncCommands;
use serde::Serialize;

use crate::domain::{ItemId, OrderPlaced};
use crate::keys::{ItemKeys, Keys};
use crate::orders::repo as orders;
use crate::store::{Db, DbError, RedisConns, RedisError, redis_timed};

use super::repo::{self, Item};
use super::stock;

/// Units per RPUSH, and RPUSHes per round trip.
const BATCH: u64 = 1_000;
const BATCHES_PER_TRIP: u64 = 20;

#[derive(Clone, Debug, Serialize)]
pub struct WarmupReport {
    pub item_id: ItemId,
    pub total: u32,
    /// Units already held by orders (not loaded again).
    pub held: u64,
    /// Units on sale, read back from Redis after the load.
    pub remaining: u64,
    /// Units counted as sold in Redis, read back after the load (equal to `held`).
    pub sold: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum WarmupError {
    #[error("no such item")]
    NotFound,
    #[error(
        "item already loaded ({remaining} units remaining); force a reload with ?force=true (HTTP) or --force (command line)"
    )]
    AlreadyLoaded { remaining: u64 },
    #[error("the sale is live: pause the item before reloading it")]
    LiveSale,
    #[error("{held} units are held by orders but the item's total is {total}: raise the total")]
    OverHeld { held: u64, total: u32 },
    #[error("the item changed during the warm-up (a sale, a pause or another warm-up); try again")]
    Raced,
    #[error("read back {found} units instead of {expected}")]
    Verify { expected: u64, found: u64 },
    #[error(transparent)]
    Redis(#[from] RedisError),
    #[error(transparent)]
    Database(#[from] DbError),
}

/// Loads the item's units. `progress(done, to_load)` is called after each round trip.
pub async fn warmup(
    db: &Db,
    redis: &RedisConns,
    keys: &Keys,
    id: ItemId,
    force: bool,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<WarmupReport, WarmupError> {
    let item = repo::get(db, id).await?.ok_or(WarmupError::NotFound)?;
    // A connection of our own from the pool, so WATCH guards only this warm-up.
    let mut conn = redis.bulk().await?;
    let result = load(db, &mut conn, keys, &item, force, progress).await;
    if result.is_err() {
        // EXEC ends a WATCH; an early return must end it by hand before the connection
        // goes back to the pool.
        let _ = redis_timed(redis::cmd("UNWATCH").query_async::<()>(&mut *conn)).await;
    }
    result
}

async fn load(
    db: &Db,
    conn: &mut deadpool_redis::Connection,
    keys: &Keys,
    item: &Item,
    force: bool,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<WarmupReport, WarmupError> {
    let id = item.id;
    let item_keys = keys.item(id);
    redis_timed(
        redis::cmd("WATCH")
            .arg(&item_keys.meta)
            .query_async::<()>(&mut **conn),
    )
    .await?;

    let before = stock::snapshot(&mut **conn, &item_keys).await?;
    if before.loaded {
        if !force {
            return Err(WarmupError::AlreadyLoaded {
                remaining: before.remaining,
            });
        }
        let now = Utc::now();
        if !item.paused && item.start_at <= now && now < item.end_at {
            return Err(WarmupError::LiveSale);
        }
    }

    let holders = holders(db, conn, &item_keys, id).await?;
    let held = holders.len() as u64;
    let to_load = u64::from(item.total)
        .checked_sub(held)
        .ok_or(WarmupError::OverHeld {
            held,
            total: item.total,
        })?;

    fill_side_list(conn, &item_keys, held, to_load, progress).await?;
    swap_in(conn, keys, &item_keys, item, &holders, to_load).await?;

    let after = stock::snapshot(&mut **conn, &item_keys).await?;
    if after.remaining != to_load || after.sold != held {
        return Err(WarmupError::Verify {
            expected: to_load,
            found: after.remaining,
        });
    }
    super::catalog::announce_change(&mut **conn, keys, id).await?;
    Ok(WarmupReport {
        item_id: id,
        total: item.total,
        held,
        remaining: after.remaining,
        sold: after.sold,
    })
}

/// `(user_id, order_sn)` of every order holding a unit: live in MySQL or pending in Redis.
async fn holders(
    db: &Db,
    conn: &mut deadpool_redis::Connection,
    keys: &ItemKeys,
    id: ItemId,
) -> Result<Vec<(u64, String)>, WarmupError> {
    // Pending first, MySQL second: an order moving from one to the other in between is
    // then seen twice (and counted once), never missed.
    let pending: Vec<String> = redis_timed(conn.hvals(&keys.pending)).await?;
    let mut holders = orders::live_holders(db, id).await?;
    let in_mysql: HashSet<String> = holders.iter().map(|(_, sn)| sn.clone()).collect();
    for json in pending {
        // An unreadable entry cannot be a holder that matters more than the others; the
        // relay reports it.
        if let Ok(order) = serde_json::from_str::<OrderPlaced>(&json)
            && !in_mysql.contains(order.order_sn.as_str())
        {
            holders.push((order.user_id.get(), order.order_sn.to_string()));
        }
    }
    Ok(holders)
}

async fn fill_side_list(
    conn: &mut deadpool_redis::Connection,
    keys: &ItemKeys,
    first_unit: u64,
    to_load: u64,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<(), WarmupError> {
    redis_timed(conn.del::<_, ()>(&keys.tokens_loading)).await?;
    progress(0, to_load);
    let mut done = 0;
    while done < to_load {
        let mut pipe = redis::pipe();
        for _ in 0..BATCHES_PER_TRIP {
            if done >= to_load {
                break;
            }
            let end = (done + BATCH).min(to_load);
            // Unit numbers continue after the held ones, so every unit has its own number.
            let units: Vec<u64> = (first_unit + done + 1..=first_unit + end).collect();
            pipe.rpush(&keys.tokens_loading, units).ignore();
            done = end;
        }
        redis_timed(pipe.query_async::<()>(conn)).await?;
        progress(done, to_load);
    }
    let found: u64 = redis_timed(conn.llen(&keys.tokens_loading)).await?;
    if found != to_load {
        return Err(WarmupError::Verify {
            expected: to_load,
            found,
        });
    }
    Ok(())
}

/// Replaces the live list, the meta and the buyer records in one MULTI.
async fn swap_in(
    conn: &mut deadpool_redis::Connection,
    keys: &Keys,
    item_keys: &ItemKeys,
    item: &Item,
    holders: &[(u64, String)],
    to_load: u64,
) -> Result<(), WarmupError> {
    let now = Utc::now().timestamp_millis();
    let mut pipe = redis::pipe();
    pipe.atomic().del(&item_keys.tokens).ignore();
    if to_load > 0 {
        pipe.rename(&item_keys.tokens_loading, &item_keys.tokens)
            .ignore();
    }
    for key in item_keys.all_buyer_keys() {
        pipe.del(key).ignore();
    }
    for (user, sn) in holders {
        let user_id = crate::domain::UserId::new(*user);
        pipe.zadd(item_keys.buyers(user_id), user, now)
            .ignore()
            .hset(item_keys.buyer_orders(user_id), user, sn)
            .ignore();
    }
    pipe.hset_multiple(
        &item_keys.meta,
        &[
            ("loaded", now),
            ("total", i64::from(item.total)),
            ("sold", holders.len() as i64),
            ("start_ms", item.start_at.timestamp_millis()),
            ("end_ms", item.end_at.timestamp_millis()),
            ("paused", i64::from(item.paused)),
        ],
    )
    .ignore()
    .sadd(keys.items_index(), item.id.get())
    .ignore();
    // EXEC answers nil when the WATCHed meta changed since the first read.
    let applied: Option<()> = redis_timed(pipe.query_async(conn)).await?;
    applied.ok_or(WarmupError::Raced)
}
