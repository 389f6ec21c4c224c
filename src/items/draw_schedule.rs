//! Which draws are coming, in Redis: one sorted set, item id → `draw_at` (ms), written
//! whenever an item is written or loaded, so the scheduler's draw pass asks MySQL about an
//! item only once its draw is due — never on a timer for every item (a query a second from
//! every scheduler took MySQL connections from buyers when MySQL was slow).

use chrono::{DateTime, Utc};
use redis::AsyncCommands;

use crate::domain::ItemId;
use crate::keys::Keys;
use crate::store::{RedisError, redis_timed};

/// Notes the item's draw (or that it has none) in a pipeline.
pub fn note_in(
    pipe: &mut redis::Pipeline,
    keys: &Keys,
    id: ItemId,
    draw_at: Option<DateTime<Utc>>,
) {
    match draw_at {
        Some(at) => pipe.zadd(keys.draws(), id.get(), at.timestamp_millis()),
        None => pipe.zrem(keys.draws(), id.get()),
    }
    .ignore();
}

/// The items whose draw is due by `now`.
pub async fn due<C>(
    conn: &mut C,
    keys: &Keys,
    now: DateTime<Utc>,
) -> Result<Vec<ItemId>, RedisError>
where
    C: redis::aio::ConnectionLike + Send + Sync,
{
    let ids: Vec<u64> =
        redis_timed(conn.zrangebyscore(keys.draws(), "-inf", now.timestamp_millis())).await?;
    Ok(ids.into_iter().filter_map(ItemId::new).collect())
}

/// Forgets draws that are over (their sale ended, or the item is gone).
pub async fn forget<C>(conn: &mut C, keys: &Keys, ids: &[ItemId]) -> Result<(), RedisError>
where
    C: redis::aio::ConnectionLike + Send + Sync,
{
    if ids.is_empty() {
        return Ok(());
    }
    let ids: Vec<u64> = ids.iter().map(|id| id.get()).collect();
    redis_timed(conn.zrem::<_, _, ()>(keys.draws(), ids)).await
}
