//! An item's stock against its orders, right now: Redis's units and pending orders,
//! MySQL's orders by status, and whether they add up to the total (what
//! `GET /admin/items/{id}/stats` shows; `admin.rs` serves it).

use clap::ValueEnum;
use serde::Serialize;
use utoipa::ToSchema;

use crate::deps::Deps;
use crate::domain::ItemId;
use crate::items::repo::Item;
use crate::items::{self, stock};
use crate::keys::Keys;
use crate::store::{RedisConns, RedisError, StoreError};

use super::repo::{self, StatusCounts};

/// An item's stock against its orders, right now.
#[derive(Serialize, ToSchema)]
pub struct Stats {
    item_id: ItemId,
    total: u32,
    /// Whether the units are in Redis.
    loaded: bool,
    /// A warm-up is replacing the units (or one was cut off before it finished: run it
    /// again); nothing sells meanwhile.
    reloading: bool,
    /// Units won, from Redis (for a retired sale: orders paid or unpaid).
    sold: u64,
    /// Units on sale, from Redis (for a retired sale: those it left unsold); for an item
    /// with waves, not counting those still to come.
    remaining: u64,
    /// Items with waves: units of waves still to come (loaded in Redis, not on sale yet).
    #[serde(skip_serializing_if = "Option::is_none")]
    unreleased: Option<u64>,
    /// Units won whose order is not yet in MySQL.
    pending: u64,
    /// Draws: entries so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    entries: Option<u64>,
    /// Orders in MySQL by status.
    orders: StatusCounts,
    /// remaining + unreleased + pending + unpaid + paid = total, right now.
    consistent: bool,
    /// When the ended sale was retired from Redis: its figures are MySQL's since.
    #[serde(skip_serializing_if = "Option::is_none")]
    retired_at: Option<chrono::DateTime<chrono::Utc>>,
    /// With `SECKILL_REDIS_WAIT_REPLICAS` ≥ 1: the item's buckets whose Redis master has
    /// fewer replicas in step than that.
    #[serde(skip_serializing_if = "Option::is_none")]
    replicas: Option<ReplicaStats>,
}

/// Where an item's sale waits for Redis replicas.
#[derive(Serialize, ToSchema)]
struct ReplicaStats {
    /// `SECKILL_REDIS_WAIT_REPLICAS`.
    required: u32,
    /// `SECKILL_REDIS_WAIT_POLICY`: `refuse` (no unit is sold in a bucket short of
    /// replicas) or `degrade` (sold without them).
    policy: String,
    /// Buckets (0 for an item not split) whose master has fewer replicas in step.
    short: Vec<u8>,
    /// Of those, the ones whose master still has a replica that could take over: a
    /// replica is expected back, and pending orders there wait for it. (A master with none
    /// left sends them: nothing but its own loss can undo them.)
    expected_back: Vec<u8>,
}

/// The buckets of an item whose master is short of replicas, when any are asked for.
async fn replica_stats(redis: &RedisConns, keys: &Keys, item: &Item) -> Option<ReplicaStats> {
    let rule = redis.wait_rule()?;
    let mut stats = ReplicaStats {
        required: rule.replicas,
        policy: rule
            .policy
            .to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_owned()),
        short: Vec::new(),
        expected_back: Vec::new(),
    };
    for stock in item.bucket_ids() {
        let key = keys.replicated(stock);
        if redis.short_of_replicas(&key).await {
            stats.short.push(stock.index);
            if !redis.alone(&key).await {
                stats.expected_back.push(stock.index);
            }
        }
    }
    Some(stats)
}

/// The item's stock against its orders, right now; `None` for an unknown item.
pub async fn of(deps: &Deps, id: ItemId) -> Result<Option<Stats>, StoreError> {
    let Deps {
        db, redis, keys, ..
    } = deps;
    let Some(item) = items::repo::get(db, id).await? else {
        return Ok(None);
    };
    let counts = repo::count_by_status(db, id).await?;
    let stock = match stock::retired(&item, counts.unpaid + counts.paid) {
        Some(stock) => stock,
        None => {
            let mut conn = redis.bulk().await?;
            stock::item_snapshot(&mut conn, keys, item.bucket_ids()).await?
        }
    };
    // Units listed in Redis are on sale or held back for a wave (by this host's clock: at a
    // wave's very moment Redis's may differ by a little; the sum does not).
    let unreleased = match item.retired_at {
        Some(_) => 0,
        None => item.release.unreleased(crate::clock::now()),
    };
    let remaining = stock.remaining.saturating_sub(unreleased);
    let accounted = remaining + unreleased + stock.pending + counts.unpaid + counts.paid;
    Ok(Some(Stats {
        item_id: id,
        total: item.total,
        loaded: stock.loaded,
        reloading: stock.reloading,
        sold: stock.sold,
        remaining,
        unreleased: (!item.release.is_empty()).then_some(unreleased),
        pending: stock.pending,
        entries: match item.draw_at {
            Some(_) if item.retired_at.is_none() => Some(entries(redis, keys, &item).await?),
            _ => None,
        },
        orders: counts,
        consistent: accounted == u64::from(item.total),
        retired_at: item.retired_at,
        replicas: replica_stats(redis, keys, &item).await,
    }))
}

/// A draw's entries, over its buckets.
async fn entries(
    redis: &crate::store::RedisConns,
    keys: &crate::keys::Keys,
    item: &items::repo::Item,
) -> Result<u64, RedisError> {
    let mut grouped = crate::store::Grouped::new(redis);
    for stock in item.bucket_ids() {
        grouped.group().zcard(keys.entries(stock));
    }
    // Each group's answers come as one array: here, of one count.
    let counts: Vec<(u64,)> = grouped.query(redis).await?;
    Ok(counts.into_iter().map(|(n,)| n).sum())
}
