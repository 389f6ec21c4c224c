//! The bulk warm-up's fast path: items never loaded, without orders and with nothing in
//! Redis are loaded 500 at a time — one MySQL read, their locks at once, one pipelined
//! round trip to check their Redis side, one to load them (`lua/load_fresh.lua` per
//! bucket), one to read them back, one `UPDATE`. Anything else (loaded before, with
//! orders, a large stock, something found in Redis) goes the one-item way, where reloads
//! and rebuilds are decided. docs/benchmarks.md: "A large catalogue".

use std::collections::{HashMap, HashSet};

use redis::Value;

use crate::domain::{BucketId, ItemId};
use crate::items::repo::{self, Item};
use crate::items::stock;
use crate::keys::{ItemKeys, Keys};
use crate::lock::RedisLock;
use crate::lua::{LOAD_FRESH, LOAD_FRESH_CODE};
use crate::orders::repo as orders;
use crate::store::{Grouped, RedisConns};

use super::{BucketMeta, GUARDED, LOCK_FOR, Warmup, WarmupError, meta_after};

/// Items per round of the fast path.
pub const CHUNK: usize = 500;
/// Items with more units than this go the one-item way (its load is paged).
const MOST_UNITS: u32 = 10_000;

/// What the fast path did with a chunk of ids.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Items it decided: loaded (`Ok`), or refused.
    pub decided: Vec<(ItemId, Result<(), WarmupError>)>,
    /// Items that are not fresh: for the one-item way.
    pub not_fresh: Vec<ItemId>,
}

/// Loads those of `ids` that are fresh; says which were not.
pub async fn load(warmup: &Warmup<'_>, ids: &[ItemId]) -> Result<Loaded, WarmupError> {
    let mut out = Loaded::default();
    let found: HashMap<ItemId, Item> = repo::get_many(warmup.db, ids)
        .await?
        .into_iter()
        .map(|item| (item.id, item))
        .collect();
    let with_orders: HashSet<ItemId> = orders::items_having_orders(warmup.db, ids)
        .await?
        .into_iter()
        .collect();
    let mut fresh = Vec::new();
    for id in ids {
        match found.get(id) {
            None => out.decided.push((*id, Err(WarmupError::NotFound))),
            Some(item)
                if item.loaded_at.is_none()
                    && !with_orders.contains(id)
                    && item.total <= MOST_UNITS =>
            {
                fresh.push(item)
            }
            Some(_) => out.not_fresh.push(*id),
        }
    }
    // Each item's warm-up lock, all at once.
    let lock_keys = fresh
        .iter()
        .map(|item| warmup.keys.warmup_lock(item.id))
        .collect();
    let locks = RedisLock::try_take_many(warmup.redis, lock_keys, LOCK_FOR).await?;
    let mut locked = Vec::new();
    for (item, lock) in fresh.into_iter().zip(locks) {
        match lock {
            Some(lock) => locked.push((item, lock)),
            None => out.decided.push((item.id, Err(WarmupError::Busy))),
        }
    }
    let items: Vec<&Item> = locked.iter().map(|(item, _)| *item).collect();
    let result = load_locked(warmup, &items, &mut out).await;
    let locks = locked.into_iter().map(|(_, lock)| lock).collect();
    if let Err(e) = RedisLock::release_many(warmup.redis, locks).await {
        tracing::warn!(error = %e, "could not release bulk warm-up locks; they expire by themselves");
    }
    result.map(|()| out)
}

/// One bucket of an item being loaded.
struct Bucket<'a> {
    item: &'a Item,
    keys: ItemKeys,
    seen: Vec<Option<String>>,
    /// Its units are numbered after this many.
    first: u64,
    units: u64,
}

async fn load_locked(
    warmup: &Warmup<'_>,
    locked: &[&Item],
    out: &mut Loaded,
) -> Result<(), WarmupError> {
    let buckets = buckets_of(locked, warmup.keys);
    let buckets = fresh_only(warmup.redis, buckets, out).await?;
    if buckets.is_empty() {
        return Ok(());
    }
    load_buckets(warmup.redis, warmup.keys, &buckets).await?;
    let outcomes = read_back(warmup.redis, &buckets).await?;
    let loaded: Vec<ItemId> = outcomes
        .iter()
        .filter(|(_, outcome)| outcome.is_ok())
        .map(|(id, _)| *id)
        .collect();
    repo::mark_loaded(warmup.db, &loaded).await?;
    out.decided.extend(outcomes);
    Ok(())
}

/// The items' buckets, each with its share of the units (numbered on across buckets).
fn buckets_of<'i>(items: &[&'i Item], keys: &Keys) -> Vec<Bucket<'i>> {
    let mut buckets = Vec::new();
    for item in items {
        let mut first = 0;
        for (stock, units) in item.bucket_ids().zip(BucketId::spread(
            u64::from(item.total),
            usize::from(item.buckets),
        )) {
            buckets.push(Bucket {
                item,
                keys: keys.bucket(stock),
                seen: Vec::new(),
                first,
                units,
            });
            first += units;
        }
    }
    buckets
}

/// The buckets of items whose Redis side is empty (`stock::ask_held`) — with what their
/// load is guarded by; the other items go the one-item way.
async fn fresh_only<'i>(
    redis: &RedisConns,
    mut buckets: Vec<Bucket<'i>>,
    out: &mut Loaded,
) -> Result<Vec<Bucket<'i>>, WarmupError> {
    let mut grouped = Grouped::new(redis);
    for bucket in &buckets {
        let pipe = grouped.group();
        pipe.cmd("HMGET").arg(&bucket.keys.meta).arg(&GUARDED);
        // Anything there (a fence too: a warm-up that did not finish, which the one-item
        // way lifts) sends the item the one-item way.
        stock::ask_held(pipe, &bucket.keys);
    }
    let states: Vec<(Vec<Option<String>>, stock::Marks, u64)> = grouped.query(redis).await?;
    let mut not_fresh = HashSet::new();
    for (bucket, (seen, marks, keys)) in buckets.iter_mut().zip(states) {
        if stock::holds(&marks, keys) {
            not_fresh.insert(bucket.item.id);
        }
        bucket.seen = seen;
    }
    buckets.retain(|b| !not_fresh.contains(&b.item.id));
    out.not_fresh.extend(not_fresh);
    Ok(buckets)
}

/// Each bucket in one call of `load_fresh.lua` (units and meta, guarded by `seen`), after
/// putting them in the items index (a bucket there with nothing loaded costs the sweeps
/// nothing) and their draws, if any, in the draw pass's schedule.
async fn load_buckets(
    redis: &RedisConns,
    keys: &Keys,
    buckets: &[Bucket<'_>],
) -> Result<(), WarmupError> {
    let members: Vec<String> = buckets.iter().map(|b| b.keys.bucket.to_string()).collect();
    // The index and the draws' schedule are two keys of two slots: a group each.
    let mut listed = Grouped::new(redis);
    listed.group().sadd(keys.items_index(), &members).ignore();
    let schedule = listed.group();
    for bucket in buckets.iter().filter(|b| b.keys.bucket.index == 0) {
        crate::items::draw_schedule::note_in(schedule, keys, bucket.item.id, bucket.item.draw_at);
    }
    listed.run(redis).await?;
    redis.load_script(LOAD_FRESH_CODE).await?;

    let mut grouped = Grouped::new(redis);
    for bucket in buckets {
        let meta = BucketMeta {
            total: bucket.units,
        };
        let pipe = grouped.group();
        pipe.cmd("EVALSHA")
            .arg(LOAD_FRESH.get_hash())
            .arg(2)
            .arg(&bucket.keys.meta)
            .arg(&bucket.keys.tokens);
        for value in &bucket.seen {
            pipe.arg(value.as_deref().unwrap_or_default());
        }
        pipe.arg(bucket.first).arg(bucket.units);
        for (field, value) in meta_after(bucket.item, bucket.keys.bucket.index, &meta) {
            pipe.arg(field).arg(value);
        }
    }
    if let Err(e) = grouped.query::<Vec<Value>>(redis).await {
        // Some loads may have happened: what Redis holds now is read back next.
        tracing::warn!(error = %e, "bulk warm-up: a load round trip failed; reading back what it did");
    }
    Ok(())
}

/// Each item's outcome: loaded when every bucket holds its units, under this load.
async fn read_back(
    redis: &RedisConns,
    buckets: &[Bucket<'_>],
) -> Result<Vec<(ItemId, Result<(), WarmupError>)>, WarmupError> {
    let mut grouped = Grouped::new(redis);
    for bucket in buckets {
        grouped
            .group()
            .hget(&bucket.keys.meta, "total")
            .llen(&bucket.keys.tokens);
    }
    let back: Vec<(Option<u64>, u64)> = grouped.query(redis).await?;
    let mut outcomes: Vec<(ItemId, Result<(), WarmupError>)> = Vec::new();
    for (bucket, (total, listed)) in buckets.iter().zip(back) {
        let id = bucket.item.id;
        if outcomes.last().is_none_or(|(last, _)| *last != id) {
            outcomes.push((id, Ok(())));
        }
        let Some((_, outcome)) = outcomes.last_mut() else {
            continue;
        };
        *outcome = match (total, &outcome) {
            // The load refused: the item changed since its read (a pause, say).
            (None, _) => Err(WarmupError::Raced),
            (_, Err(_)) => continue,
            (Some(total), Ok(())) if total == bucket.units && listed == bucket.units => Ok(()),
            (Some(_), Ok(())) => Err(WarmupError::Verify {
                expected: bucket.units,
                found: listed,
            }),
        };
    }
    Ok(outcomes)
}
