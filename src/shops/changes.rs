//! Changing a shop: one change at a time per shop under a Redis lock (a random token,
//! released only by its owner), MySQL first, then Redis, then an announcement on the
//! `{ns}.shops` fanout exchange that every instance follows; and every change in the log.

use std::time::Duration;

use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use tokio_util::sync::CancellationToken;

use crate::broker::{Broker, Opened, Outbound, publish};
use crate::deps::Deps;
use crate::keys::Keys;
use crate::lock::RedisLock;
use crate::store::{Db, DbError, RedisConns, RedisError, StoreError};

use super::cache::Shops;
use super::repo::{self, Shop};

/// A crashed holder's lock goes away after this long.
const LOCK_FOR: Duration = Duration::from_secs(5);
/// How long a change waits for another one to finish.
const WAIT_FOR_LOCK: Duration = Duration::from_millis(800);

/// What a shop change works with.
pub struct ShopChange<'a> {
    pub deps: &'a Deps,
    pub shops: &'a Shops,
}

/// Why a shop change did not go through (whole).
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    #[error("another change of this shop is in progress")]
    Busy,
    #[error("no such shop")]
    NotFound,
    /// Saved in MySQL and logged, but Redis did not take it: a scheduler pushes it as soon
    /// as Redis answers; until then instances that read Redis may show the old status.
    #[error("shop {shop} changed in MySQL, not yet in Redis")]
    NotInRedis { shop: u64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

crate::store::from_either_store!(ChangeError);

impl ShopChange<'_> {
    /// One change under the shop's lock: `write` to MySQL (which flags the shop for
    /// Redis), the log, then Redis, then the announcement. Returns the shop after it; or,
    /// when Redis did not take it, `NotInRedis` — the change stands in MySQL, but an
    /// operator must not take it for done.
    pub async fn apply<F, Fut>(
        &self,
        id: u64,
        what: &str,
        by: &str,
        reason: &str,
        write: F,
    ) -> Result<Shop, ChangeError>
    where
        F: FnOnce(Db) -> Fut,
        Fut: std::future::Future<Output = Result<(), DbError>>,
    {
        let Some(lock) = lock(&self.deps.redis, &self.deps.keys, id).await? else {
            return Err(ChangeError::Busy);
        };
        let result = async {
            let now = crate::clock::now();
            let before = repo::load(&self.deps.db, id).await?;
            write(self.deps.db.clone()).await?;
            let after = repo::load(&self.deps.db, id)
                .await?
                .ok_or(ChangeError::NotFound)?;
            let (old, new) = (
                before.as_ref().is_none_or(|s| s.open_at(now)),
                after.open_at(now),
            );
            repo::log_change(&self.deps.db, id, what, old, new, by, reason).await?;
            let pushed = push(self.shops, &self.deps.db, &after).await;
            Ok::<_, ChangeError>((after, pushed))
        }
        .await;
        lock.let_go(&self.deps.redis).await;
        let (after, pushed) = result?;
        // Whatever Redis did: instances reload the shop from MySQL when told.
        self.shops.reload(id).await;
        announce(&self.deps.broker, id).await;
        let open = after.open_at(crate::clock::now());
        if let Err(e) = pushed {
            tracing::warn!(shop = id, what, by, reason, open, error = %crate::error::cause_chain(&e), "shop changed in MySQL, not yet in Redis");
            return Err(ChangeError::NotInRedis { shop: id });
        }
        tracing::info!(shop = id, what, by, reason, open, "shop changed");
        Ok(after)
    }

    /// Recomputes the shop's status from MySQL and pushes it everywhere.
    pub async fn refresh(&self, id: u64) -> Result<Shop, ChangeError> {
        if repo::load(&self.deps.db, id).await?.is_none() {
            return Err(ChangeError::NotFound);
        }
        self.apply(
            id,
            "refresh",
            "admin",
            "refreshed by hand",
            |db| async move { repo::mark_redis_stale(&db, id).await },
        )
        .await
    }
}

/// Takes the shop's change lock, waiting a little for a change in progress; `None` if it
/// stayed taken.
pub async fn lock(
    redis: &RedisConns,
    keys: &Keys,
    shop: u64,
) -> Result<Option<RedisLock>, RedisError> {
    RedisLock::take_within(redis, keys.shop_lock(shop), LOCK_FOR, WAIT_FOR_LOCK).await
}

/// Writes the shop as MySQL has it into Redis, then clears its flag (unless a newer change
/// came meanwhile). The caller holds the shop's lock.
pub async fn push(shops: &Shops, db: &Db, shop: &Shop) -> Result<(), StoreError> {
    shops.store_in_redis(shop).await?;
    repo::mark_redis_synced(db, shop.id, shop.updated_at).await?;
    Ok(())
}

/// Tells every instance that the shop changed. A lost announcement costs at most the
/// local cache's one second.
pub async fn announce(broker: &Broker, shop: u64) {
    let Some(channel) = broker.publish_channel() else {
        tracing::warn!(
            shop,
            "no broker connection: instances see the shop change within a second anyway"
        );
        return;
    };
    let sent = publish(&channel, broker.topology(), &[Outbound::ShopChanged(shop)]).await;
    if sent != [true] {
        tracing::warn!(shop, "could not announce a shop change");
    }
}

/// Follows the announcements with a queue of this instance's own, until shutdown.
pub async fn follow(shops: Shops, deps: Deps, shutdown: CancellationToken) {
    let broker = deps.broker;
    loop {
        let Some(opened) = broker.open_channel(&shutdown).await else {
            return;
        };
        let followed = async {
            let Opened { channel, mut gone } = opened?;
            let queue = channel
                .queue_declare(
                    "".into(),
                    QueueDeclareOptions {
                        exclusive: true,
                        auto_delete: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await?;
            channel
                .queue_bind(
                    queue.name().as_str().into(),
                    broker.topology().shops_exchange.as_str().into(),
                    "".into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            let mut deliveries = channel
                .basic_consume(
                    queue.name().as_str().into(),
                    "shops".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return Ok(()),
                    () = gone.wait() => return Ok(()),
                    delivery = deliveries.next() => match delivery {
                        Some(Ok(delivery)) => {
                            if let Some(id) = std::str::from_utf8(&delivery.data).ok().and_then(|s| s.parse().ok()) {
                                shops.mark_stale(id).await;
                            }
                            delivery.ack(BasicAckOptions::default()).await?;
                        }
                        Some(Err(e)) => return Err(e),
                        None => return Ok(()),
                    },
                }
            }
        }
        .await;
        if let Err(e) = followed {
            tracing::warn!(error = %e, "lost the shop announcements; following again");
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}
