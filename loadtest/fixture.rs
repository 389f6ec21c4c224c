//! What the benchmark's examples share (`#[path]`-included by loadtest/bare.rs and
//! loadtest/redis_cost.rs): a fresh item of their own in Redis, and the minimal
//! pop-and-record script that is the second yardstick.

use redis::Script;
use redis::aio::ConnectionLike;

use seckill::domain::{BucketId, ItemId, OrderPlaced, OrderSn, UserId};
use seckill::testing::ItemKeys;
use seckill::testing::lua::RULES_SET;

/// `loadtest/lua/minimal.lua`: ZSCORE, LPOP, ZADD, HINCRBY.
pub static MINIMAL: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(include_str!("lua/minimal.lua")));

/// The minimal script's buyers: a set of its own beside the item's keys (same hash tag).
pub fn minimal_buyers(keys: &ItemKeys) -> String {
    format!("{}:minimal_buyers", keys.meta)
}

/// Deletes every key of the item that a run writes.
pub async fn clear(redis: &mut impl ConnectionLike, keys: &ItemKeys) -> anyhow::Result<()> {
    let mut pipe = redis::pipe();
    pipe.del(&keys.meta)
        .del(&keys.tokens)
        .del(&keys.pending)
        .del(&keys.outbox)
        .del(minimal_buyers(keys));
    for key in keys.buyer_order_shards() {
        pipe.del(key);
    }
    pipe.query_async::<()>(redis).await?;
    Ok(())
}

/// A fresh item: every key of the item rebuilt, `units` tokens, its window open — its meta
/// written as a warm-up writes it, through `lua/rules_set.lua`, so its packed `rules` are
/// there and `grab.lua` reads one field, as on the server, not its eight-field fallback.
pub async fn load(
    redis: &mut impl ConnectionLike,
    keys: &ItemKeys,
    units: u64,
) -> anyhow::Result<()> {
    clear(redis, keys).await?;
    for start in (0..units).step_by(10_000) {
        let batch: Vec<u64> = (start..(start + 10_000).min(units)).collect();
        redis::cmd("RPUSH")
            .arg(&keys.tokens)
            .arg(batch)
            .query_async::<()>(redis)
            .await?;
    }
    let units = units.to_string();
    RULES_SET
        .key(&keys.meta)
        .arg(&[
            ("loaded", "1"),
            ("paused", "0"),
            ("start_ms", "0"),
            ("end_ms", "99999999999999"),
            ("per_user", "1"),
            ("total", units.as_str()),
        ])
        .invoke_async::<()>(redis)
        .await?;
    let rules: Option<String> = redis::cmd("HGET")
        .arg(&keys.meta)
        .arg("rules")
        .query_async(redis)
        .await?;
    anyhow::ensure!(rules.is_some(), "the fixture's meta has no packed rules");
    Ok(())
}

/// The order a win of `item` by `user` stores, as seckill's purchase handler makes it:
/// its number and its JSON.
pub fn order(item: ItemId, user: UserId) -> (OrderSn, String) {
    let now = chrono::Utc::now().timestamp_millis();
    let order = OrderPlaced {
        order_sn: OrderSn::generate(BucketId::whole(item), false),
        item_id: item,
        user_id: user,
        created_at_ms: now,
        pay_deadline_ms: now + 1_800_000,
        slot: 0,
    };
    let json = order.to_json();
    (order.order_sn, json)
}

/// One minimal sale to `user`: `won`, `duplicate` or `sold_out`.
pub async fn minimal(
    redis: &mut impl ConnectionLike,
    keys: &ItemKeys,
    user: UserId,
    now_ms: i64,
) -> redis::RedisResult<String> {
    MINIMAL
        .key(&keys.meta)
        .key(&keys.tokens)
        .key(minimal_buyers(keys))
        .arg(user.get())
        .arg(now_ms)
        .invoke_async(redis)
        .await
}
