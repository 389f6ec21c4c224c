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
    /// Items over several buckets: units of `remaining` lent from one bucket to another
    /// and not arrived, on no list. A transfer cut off (a failed `WAIT`, a crash) gives its
    /// unit back to its lender's list once the repair settles it: 5 s after the loan at
    /// the earliest, within about 6.5 s of both buckets' masters having their replicas in
    /// step again (docs/architecture.md, "A hot item over many buckets").
    #[serde(skip_serializing_if = "Option::is_none")]
    moving: Option<u64>,
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
    /// remaining + unreleased + pending + unpaid + paid = total, right now, exactly, with
    /// every bucket listing the units its waves hold back.
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
    // Each bucket's units listed, and what waves still to come hold back of them there (by
    // this host's clock: at a wave's very moment Redis's may differ by a little).
    let (stock, buckets) = match stock::retired(&item, counts.unpaid + counts.paid) {
        // Its waves all opened before it ended.
        Some(stock) => (stock, vec![(stock.remaining, 0)]),
        None => {
            let mut conn = redis.bulk().await?;
            let each = stock::bucket_snapshots(&mut conn, keys, item.bucket_ids()).await?;
            let now_ms = crate::clock::now().timestamp_millis();
            let buckets = item
                .bucket_ids()
                .zip(&each)
                .map(|(bucket, one)| {
                    let held = item.release.holds(item.buckets, bucket.index).at(now_ms);
                    (one.remaining, held)
                })
                .collect();
            (stock::sum(&each), buckets)
        }
    };
    let unreleased: u64 = buckets.iter().map(|(_, held)| held).sum();
    let held_by_orders = stock.pending + counts.unpaid + counts.paid;
    let (remaining, consistent) = adds_up(&buckets, held_by_orders, item.total);
    Ok(Some(Stats {
        item_id: id,
        total: item.total,
        loaded: stock.loaded,
        reloading: stock.reloading,
        sold: stock.sold,
        remaining,
        moving: (item.buckets > 1 && item.retired_at.is_none()).then_some(stock.moving),
        unreleased: (!item.release.is_empty()).then_some(unreleased),
        pending: stock.pending,
        entries: match item.draw_at {
            Some(_) if item.retired_at.is_none() => Some(entries(redis, keys, &item).await?),
            _ => None,
        },
        orders: counts,
        consistent,
        retired_at: item.retired_at,
        replicas: replica_stats(redis, keys, &item).await,
    }))
}

/// The contract's equation (§7, invariant 4): remaining + unreleased + pending + unpaid +
/// paid = total, exactly. `buckets`: each bucket's units listed and those of them waves
/// still to come hold back; `held_by_orders`: pending + unpaid + paid. Returns the units
/// on sale and whether it adds up. A bucket listing fewer units than it holds back has
/// fewer than none on sale: the units its waves promise are not there, and nothing —
/// neither the plan's count of them nor a surplus elsewhere — stands in for them.
fn adds_up(buckets: &[(u64, u64)], held_by_orders: u64, total: u32) -> (u64, bool) {
    let on_sale: Vec<i128> = buckets
        .iter()
        .map(|(listed, held)| i128::from(*listed) - i128::from(*held))
        .collect();
    let unreleased: i128 = buckets.iter().map(|(_, held)| i128::from(*held)).sum();
    let consistent = on_sale.iter().all(|n| *n >= 0)
        && on_sale.iter().sum::<i128>() + unreleased + i128::from(held_by_orders)
            == i128::from(total);
    let remaining = on_sale.iter().map(|n| u64::try_from(*n).unwrap_or(0)).sum();
    (remaining, consistent)
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

#[cfg(test)]
mod tests {
    use super::adds_up;

    #[test]
    fn stock_adds_up_only_by_the_equation() {
        // 20 units: 10 listed and held back for a wave, 10 unpaid.
        assert_eq!(adds_up(&[(10, 10)], 10, 20), (0, true));
        // 5 of those held back gone: the wave's count does not stand in for them.
        assert_eq!(adds_up(&[(5, 10)], 10, 20), (0, false));
        // Held back more than listed (a wave enlarged after sales): 130 units of 100.
        assert_eq!(adds_up(&[(50, 80)], 50, 100), (0, false));
        // On sale and held back, with pending, unpaid and paid among the rest.
        assert_eq!(adds_up(&[(7, 3)], 3, 10), (4, true));
        assert_eq!(adds_up(&[(7, 3)], 4, 10), (4, false));
        assert_eq!(adds_up(&[(7, 0)], 2, 10), (7, false));
    }

    #[test]
    fn each_bucket_must_list_what_it_holds_back() {
        // Two buckets holding 2 back each; 6 listed in all and 10 sold of 16 adds up only
        // while each lists its 2.
        assert_eq!(adds_up(&[(3, 2), (3, 2)], 10, 16), (2, true));
        // One lists 1 of its 2, the other a unit more: the same sums, but a unit of the
        // wave is missing and one not held back is on sale in its place.
        assert_eq!(adds_up(&[(1, 2), (5, 2)], 10, 16), (3, false));
        // A retired sale: what it left unsold, nothing held back.
        assert_eq!(adds_up(&[(2, 0)], 1, 3), (2, true));
        assert_eq!(adds_up(&[], 0, 0), (0, true));
    }
}
