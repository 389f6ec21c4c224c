//! Keeping Redis and the caches in step with MySQL (scheduler role): every second, shops
//! whose change Redis did not take are pushed there and announced; and the periodic repair
//! (`SECKILL_SHOP_REPAIR_EVERY_S`) reads every shop from MySQL, the truth, compares it
//! with Redis and with this instance's cache, and reports (log and metric) and repairs a
//! layer that differs.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::background::{Schedule, repeat};
use crate::broker::Broker;
use crate::deps::Deps;
use crate::keys::Keys;
use crate::store::{Db, RedisConns, StoreError};

use super::cache::Shops;
use super::changes::{self, announce};
use super::repo::{self, Shop};

/// How often shops whose change Redis did not take are looked for.
const PUSH_STALE_EVERY: Duration = Duration::from_secs(1);

/// Pushes changes Redis missed, every second, until shutdown.
pub async fn push_stale(shops: Shops, deps: Deps, shutdown: CancellationToken) {
    let Deps {
        db,
        redis,
        keys,
        broker,
        ..
    } = deps;
    let schedule = Schedule::every(PUSH_STALE_EVERY);
    repeat(
        "pushing shop changes to Redis",
        schedule,
        &shutdown,
        || async {
            push_stale_once(&shops, &db, &redis, &keys, &broker)
                .await
                .map(drop)
        },
    )
    .await;
}

/// Pushes every shop flagged in MySQL to Redis (under its lock, so never over a newer
/// change) and announces it. Returns how many were pushed.
pub async fn push_stale_once(
    shops: &Shops,
    db: &Db,
    redis: &RedisConns,
    keys: &Keys,
    broker: &Broker,
) -> Result<u64, StoreError> {
    let mut pushed = 0;
    for id in repo::redis_stale_ids(db).await? {
        // Held: a change is in progress, and it pushes the shop itself.
        let Some(lock) = changes::lock(redis, keys, id).await? else {
            continue;
        };
        let result = async {
            match repo::load(db, id).await? {
                Some(shop) => changes::push(shops, db, &shop).await,
                None => Ok(()),
            }
        }
        .await;
        lock.let_go(redis).await;
        result?;
        tracing::warn!(
            shop = id,
            "shop change reached Redis late (Redis had failed to take it)"
        );
        shops.meters().shop_repair("redis");
        announce(broker, id).await;
        pushed += 1;
    }
    Ok(pushed)
}

pub async fn run(shops: Shops, deps: Deps, shutdown: CancellationToken) {
    let every = Duration::from_secs(deps.settings.shop_repair_every_s);
    let Deps { db, broker, .. } = deps;
    repeat("shop repair", Schedule::every(every), &shutdown, || async {
        repair_all(&shops, &db, &broker).await.map(drop)
    })
    .await;
}

/// Compares and repairs every shop; returns how many layers were repaired.
pub async fn repair_all(shops: &Shops, db: &Db, broker: &Broker) -> Result<u64, StoreError> {
    let mut repaired = 0;
    for id in repo::all_ids(db).await? {
        let Some(truth) = repo::load(db, id).await? else {
            continue;
        };
        let in_redis: Option<Shop> = shops
            .redis_text(id)
            .await?
            .and_then(|json| serde_json::from_str(&json).ok());
        if in_redis.as_ref() != Some(&truth) {
            tracing::warn!(shop = id, found = ?in_redis, "shop in Redis differs from MySQL; repaired");
            shops.store_in_redis(&truth).await?;
            shops.meters().shop_repair("redis");
            announce(broker, id).await;
            repaired += 1;
        }
        if shops.cached(id).await.is_some_and(|local| *local != truth) {
            tracing::warn!(
                shop = id,
                "shop in this instance's cache differs from MySQL; dropped"
            );
            shops.reload(id).await;
            shops.meters().shop_repair("local");
            repaired += 1;
        }
    }
    Ok(repaired)
}
