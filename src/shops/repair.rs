//! The periodic repair (scheduler role, `SECKILL_SHOP_REPAIR_EVERY_S`): every shop is read
//! from MySQL, the truth, and compared with Redis and with this instance's cache; a layer
//! that differs is reported (log and metric) and repaired from MySQL.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::store::{Db, StoreError};

use super::cache::Shops;
use super::changes::announce;
use super::repo::{self, Shop};

pub async fn run(
    shops: Shops,
    db: Db,
    broker: Broker,
    every: Duration,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        if let Err(e) = repair_all(&shops, &db, &broker).await {
            tracing::warn!(error = %crate::error::cause_chain(&e), "shop repair failed; next one in {every:?}");
        }
    }
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
