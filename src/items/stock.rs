//! An item's live stock in Redis, as operators and the catalogue read it.

use redis::AsyncCommands;

use crate::keys::ItemKeys;
use crate::store::{Grouped, RedisConns, RedisError, redis_timed};
use crate::telemetry::ItemLevels;

use super::repo::Item;

/// The Redis side of an item at one instant (read in one MULTI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StockSnapshot {
    pub loaded: bool,
    /// When the units were loaded (ms since the epoch), by the warm-up's own clock.
    pub loaded_at_ms: Option<i64>,
    /// Units still in the token list.
    pub remaining: u64,
    /// Units sold and not given back.
    pub sold: u64,
    /// Won units whose order is not in MySQL yet.
    pub pending: u64,
}

pub async fn snapshot<C>(conn: &mut C, keys: &ItemKeys) -> Result<StockSnapshot, RedisError>
where
    C: redis::aio::ConnectionLike + Send,
{
    let ((loaded, sold), remaining, pending): ((Option<i64>, Option<u64>), u64, u64) = redis_timed(
        redis::pipe()
            .atomic()
            .cmd("HMGET")
            .arg(&keys.meta)
            .arg("loaded")
            .arg("sold")
            .llen(&keys.tokens)
            .hlen(&keys.pending)
            .query_async(conn),
    )
    .await?;
    Ok(StockSnapshot {
        loaded: loaded.is_some(),
        loaded_at_ms: loaded,
        remaining,
        sold: sold.unwrap_or(0),
        pending,
    })
}

/// What the catalogue refresh reads of each item.
#[derive(Clone, Copy, Debug, Default)]
pub struct LiveState {
    pub loaded: bool,
    pub levels: ItemLevels,
}

/// The live state of many items (one round trip on one server), for the catalogue refresh.
pub async fn live_states<'a>(
    redis: &RedisConns,
    items: impl Iterator<Item = &'a ItemKeys>,
) -> Result<Vec<LiveState>, RedisError> {
    let mut grouped = Grouped::new(redis);
    for keys in items {
        grouped
            .group()
            .hexists(&keys.meta, "loaded")
            .llen(&keys.tokens)
            .zcard(&keys.outbox)
            .hlen(&keys.pending)
            .zcard(&keys.due);
    }
    let states: Vec<(bool, u64, u64, u64, u64)> = grouped.query(redis).await?;
    Ok(states
        .into_iter()
        .map(|(loaded, remaining, outbox, pending, delayed)| LiveState {
            loaded,
            levels: ItemLevels {
                remaining,
                outbox,
                pending,
                delayed,
            },
        })
        .collect())
}

/// Copies what `grab.lua` checks from the MySQL record into the item's meta hash: the sale
/// window and the pause flag. Harmless before a warm-up (`grab.lua` first checks `loaded`).
pub async fn sync_rules<C>(conn: &mut C, keys: &ItemKeys, item: &Item) -> Result<(), RedisError>
where
    C: redis::aio::ConnectionLike + Send + Sync,
{
    redis_timed(conn.hset_multiple::<_, _, _, ()>(
        &keys.meta,
        &[
            ("start_ms", item.start_at.timestamp_millis()),
            ("end_ms", item.end_at.timestamp_millis()),
            ("paused", i64::from(item.paused)),
        ],
    ))
    .await
}
