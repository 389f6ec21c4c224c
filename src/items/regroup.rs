//! Whether an item's `buckets` may still change: only while nothing of it exists anywhere —
//! no order in MySQL, nothing in Redis (units, buyer records, pending orders, loans, a
//! warm-up's fence). Every buyer's home bucket and every order's follow from the count:
//! changed with units out, past buyers would find no record and buy again. `loaded_at`
//! alone cannot tell: a failed `mark_loaded`, a `PUT` racing the first warm-up or a
//! partial bulk load leave it empty with units in Redis.

use std::collections::HashSet;
use std::time::Duration;

use crate::domain::{BucketId, ItemId};
use crate::keys::Keys;
use crate::lock::RedisLock;
use crate::store::{Db, Grouped, RedisConns, StoreError};

use super::repo::{self, ItemDraft};
use super::stock;

/// How long a write that changes buckets holds the items' warm-up locks, at most.
const HOLD_FOR: Duration = Duration::from_secs(10);

/// Items whose bucket count a write would change, held against warm-ups until written.
pub struct Regrouping {
    locks: Vec<RedisLock>,
    /// Those that must keep their buckets: something of them is in Redis, or a warm-up
    /// of them is running. (Orders in MySQL are checked in the write's transaction.)
    pub kept: HashSet<ItemId>,
}

impl Regrouping {
    /// For every item of `drafts` that exists with another bucket count: takes its
    /// warm-up lock (no warm-up loads it under the old count meanwhile) and looks for its
    /// state in Redis, in its present buckets.
    pub async fn hold(
        db: &Db,
        redis: &RedisConns,
        keys: &Keys,
        drafts: &[(ItemId, ItemDraft)],
    ) -> Result<Self, StoreError> {
        let ids: Vec<ItemId> = drafts.iter().map(|(id, _)| *id).collect();
        let changing: Vec<(ItemId, u8)> = repo::get_many(db, &ids)
            .await?
            .into_iter()
            .filter(|item| {
                drafts
                    .iter()
                    .any(|(id, draft)| *id == item.id && draft.buckets != item.buckets)
            })
            .map(|item| (item.id, item.buckets))
            .collect();
        let mut regrouping = Self {
            locks: Vec::new(),
            kept: HashSet::new(),
        };
        if changing.is_empty() {
            return Ok(regrouping);
        }
        let lock_keys = changing
            .iter()
            .map(|(id, _)| keys.warmup_lock(*id))
            .collect();
        let locks = RedisLock::try_take_many(redis, lock_keys, HOLD_FOR).await?;
        let mut locked = Vec::new();
        for ((id, buckets), lock) in changing.into_iter().zip(locks) {
            match lock {
                Some(lock) => {
                    regrouping.locks.push(lock);
                    locked.push((id, buckets));
                }
                None => {
                    regrouping.kept.insert(id);
                }
            }
        }
        let held = in_redis(redis, keys, &locked).await;
        match held {
            Ok(held) => regrouping.kept.extend(held),
            Err(e) => {
                regrouping.let_go(redis).await;
                return Err(e.into());
            }
        }
        Ok(regrouping)
    }

    /// Releases the warm-up locks (once the write is done).
    pub async fn let_go(self, redis: &RedisConns) {
        if let Err(e) = RedisLock::release_many(redis, self.locks).await {
            tracing::warn!(error = %e, "could not release warm-up locks; they expire by themselves");
        }
    }
}

/// Those of the items (with their present bucket counts) that have state in Redis.
pub(super) async fn in_redis(
    redis: &RedisConns,
    keys: &Keys,
    items: &[(ItemId, u8)],
) -> Result<Vec<ItemId>, crate::store::RedisError> {
    let mut grouped = Grouped::new(redis);
    let mut of = Vec::new();
    for (id, buckets) in items {
        for stock in BucketId::all(*id, *buckets) {
            stock::ask_held(grouped.group(), &keys.bucket(stock));
            of.push(*id);
        }
    }
    let found: Vec<(stock::Marks, u64)> = grouped.query(redis).await?;
    let mut held: Vec<ItemId> = of
        .into_iter()
        .zip(found)
        .filter(|(_, (marks, keys))| stock::holds(marks, *keys))
        .map(|(id, _)| id)
        .collect();
    held.dedup();
    Ok(held)
}
