//! Whether a shop is open, read locally: this instance's cache (moka, one second), then
//! Redis, then MySQL, each layer filling the one above. What is cached is the shop's
//! definition (hours, exceptions, override), and "open" is computed from it at read time,
//! so the status follows the hours by itself as time passes.
//!
//! A change is announced on the `{ns}.shops` fanout exchange; every instance marks the
//! shop stale and reloads it once the announcements have been quiet for [`QUIET`] (or
//! [`AT_MOST`] after the first), so a burst of changes to one shop costs each instance one
//! reload. The one-second lifetime bounds the
//! delay when an announcement is lost. With Redis down, reads go to MySQL; with MySQL down
//! too, the last value this instance knew is served (and a warning logged).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

use crate::background::{Schedule, repeat};
use crate::keys::Keys;
use crate::store::{Db, DbError, MissLimit, RedisConns, RedisError, redis_timed};
use crate::telemetry::Meters;

use super::repo::{self, Shop};

const LOCAL_FOR: Duration = Duration::from_secs(1);
/// How long "no such shop" is remembered for readers without a token; a change of the
/// shop, or finding it, forgets it sooner.
const UNKNOWN_FOR: Duration = Duration::from_secs(30);
/// A stale shop is reloaded once no announcement about it came for this long …
const QUIET: Duration = Duration::from_millis(200);
/// … or this long after the first, whichever comes first.
const AT_MOST: Duration = Duration::from_millis(700);
const FLUSH_EVERY: Duration = Duration::from_millis(50);

#[derive(Clone)]
pub struct Shops {
    inner: Arc<Inner>,
}

struct Inner {
    db: Db,
    redis: RedisConns,
    keys: Keys,
    meters: Arc<Meters>,
    local: moka::future::Cache<u64, Arc<Shop>>,
    /// Shops readers asked for that do not exist.
    unknown: moka::future::Cache<u64, ()>,
    /// Shares MySQL with the other look-ups of unknown ids.
    misses: MissLimit,
    /// Every shop this instance has seen, for when both stores are down.
    last_known: RwLock<HashMap<u64, Arc<Shop>>>,
    /// Shops announced as changed: when the first and the last announcement came.
    stale: Mutex<HashMap<u64, (Instant, Instant)>>,
}

#[derive(Debug, thiserror::Error)]
#[error("no store answers and this instance has never seen shop {0}")]
pub struct Unknowable(pub u64);

/// Why a reader's look-up of a shop has no answer.
#[derive(Debug, thiserror::Error)]
pub enum ShopLookupError {
    #[error(transparent)]
    Unknowable(#[from] Unknowable),
    #[error(transparent)]
    Busy(#[from] DbError),
}

impl Shops {
    pub fn new(
        db: Db,
        redis: RedisConns,
        keys: Keys,
        meters: Arc<Meters>,
        misses: MissLimit,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                db,
                redis,
                keys,
                meters,
                local: moka::future::Cache::builder()
                    .max_capacity(100_000)
                    .time_to_live(LOCAL_FOR)
                    .build(),
                unknown: moka::future::Cache::builder()
                    .max_capacity(100_000)
                    .time_to_live(UNKNOWN_FOR)
                    .build(),
                misses,
                last_known: RwLock::new(HashMap::new()),
                stale: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The shop (`None`: no such shop), from the nearest layer that answers.
    pub async fn get(&self, id: u64) -> Result<Option<Arc<Shop>>, Unknowable> {
        if let Some(shop) = self.inner.local.get(&id).await {
            return Ok(Some(shop));
        }
        let from_redis = self.read_redis(id).await;
        let shop = match from_redis {
            // Older than what this instance already saw: a change Redis did not take
            // (yet). Never step back to it; MySQL has the newer one.
            Ok(Some(shop))
                if self
                    .last_known(id)
                    .is_some_and(|k| k.updated_at > shop.updated_at) =>
            {
                match repo::load(&self.inner.db, id).await {
                    Ok(found) => {
                        self.inner.meters.shop_fill("mysql");
                        found
                    }
                    Err(e) => {
                        tracing::warn!(shop = id, error = %e, "Redis holds an older shop and MySQL failed; serving the last known");
                        self.last_known(id).map(|k| Shop::clone(&k))
                    }
                }
            }
            Ok(Some(shop)) => Some(shop),
            redis_said => match repo::load(&self.inner.db, id).await {
                Ok(Some(shop)) => {
                    // Redis lacked it (or is down): fill it for the other instances.
                    if redis_said.is_ok()
                        && let Err(e) = self.store_in_redis(&shop).await
                    {
                        tracing::warn!(shop = id, error = %e, "cannot fill the shop into Redis");
                    }
                    self.inner.meters.shop_fill("mysql");
                    Some(shop)
                }
                Ok(None) => return Ok(None),
                Err(e) => {
                    let last = self.last_known(id).ok_or(Unknowable(id))?;
                    tracing::warn!(shop = id, error = %e, "Redis and MySQL both failed; serving the last known shop status");
                    self.inner.meters.shop_fill("last_known");
                    return Ok(Some(last));
                }
            },
        };
        Ok(match shop {
            Some(shop) => Some(self.keep(shop).await),
            None => None,
        })
    }

    /// The shop for a reader without a token: like [`Shops::get`], but a shop found not
    /// to exist is remembered, and a look-up beyond this instance's memory waits its turn
    /// among the other look-ups of unknown ids (`503` when none comes soon).
    pub async fn lookup(&self, id: u64) -> Result<Option<Arc<Shop>>, ShopLookupError> {
        if let Some(shop) = self.inner.local.get(&id).await {
            return Ok(Some(shop));
        }
        if self.inner.unknown.contains_key(&id) {
            return Ok(None);
        }
        let found = self
            .inner
            .misses
            .run(async { Ok(self.get(id).await) })
            .await??;
        if found.is_none() {
            self.inner.unknown.insert(id, ()).await;
        }
        Ok(found)
    }

    /// Whether the shop is open now, for the purchase path: from memory, as last loaded
    /// (the item catalogue reloads its items' shops every half second, and an announced
    /// change reloads at once), so a purchase never waits for a store here. A shop this
    /// instance has not loaded yet is loaded now; one nobody can tell about (both stores
    /// down, never seen) counts as open: the stock is safe either way.
    pub async fn open_now(&self, id: u64) -> bool {
        let now = crate::clock::now();
        if let Some(shop) = self.last_known(id) {
            return shop.open_at(now);
        }
        // Boxed: the loading future is kilobytes, and every purchase's future would carry it.
        match Box::pin(self.get(id)).await {
            Ok(Some(shop)) => shop.open_at(now),
            Ok(None) | Err(_) => true,
        }
    }

    async fn keep(&self, shop: Shop) -> Arc<Shop> {
        let shop = Arc::new(shop);
        self.inner.unknown.invalidate(&shop.id).await;
        self.inner
            .last_known
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(shop.id, shop.clone());
        self.inner.local.insert(shop.id, shop.clone()).await;
        shop
    }

    fn last_known(&self, id: u64) -> Option<Arc<Shop>> {
        let known = self
            .inner
            .last_known
            .read()
            .unwrap_or_else(|e| e.into_inner());
        known.get(&id).cloned()
    }

    async fn read_redis(&self, id: u64) -> Result<Option<Shop>, RedisError> {
        let mut conn = self.inner.redis.bulk().await?;
        let json: Option<String> = redis_timed(conn.get(self.inner.keys.shop(id))).await?;
        let Some(json) = json else {
            return Ok(None);
        };
        match serde_json::from_str(&json) {
            Ok(shop) => {
                self.inner.meters.shop_fill("redis");
                Ok(Some(shop))
            }
            Err(e) => {
                // Treated as missing: MySQL fills it again.
                tracing::error!(shop = id, error = %e, "unreadable shop in Redis; reloading from MySQL");
                Ok(None)
            }
        }
    }

    /// Writes the shop into Redis (the layer every instance fills from).
    pub async fn store_in_redis(&self, shop: &Shop) -> Result<(), RedisError> {
        let json = serde_json::to_string(shop)
            .map_err(|e| RedisError::Unexpected(format!("shop JSON: {e}")))?;
        let mut conn = self.inner.redis.bulk().await?;
        redis_timed(conn.set(self.inner.keys.shop(shop.id), json)).await
    }

    /// What Redis holds for the shop, as text (for the consistency check).
    pub async fn redis_text(&self, id: u64) -> Result<Option<String>, RedisError> {
        let mut conn = self.inner.redis.bulk().await?;
        redis_timed(conn.get(self.inner.keys.shop(id))).await
    }

    /// The shop as this instance's cache holds it right now, if it does.
    pub async fn cached(&self, id: u64) -> Option<Arc<Shop>> {
        self.inner.local.get(&id).await
    }

    /// The shop changed somewhere: reload it once the announcements calm down.
    pub async fn mark_stale(&self, id: u64) {
        self.inner.unknown.invalidate(&id).await;
        let now = Instant::now();
        self.inner
            .stale
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id)
            .and_modify(|(_, last)| *last = now)
            .or_insert((now, now));
    }

    /// Reloads it now (this instance made or was told of the change): from MySQL, which
    /// has every change first, or through the layers when MySQL does not answer.
    pub async fn reload(&self, id: u64) {
        self.inner.unknown.invalidate(&id).await;
        self.inner.local.invalidate(&id).await;
        match repo::load(&self.inner.db, id).await {
            Ok(Some(shop)) => {
                self.inner.meters.shop_fill("mysql");
                self.keep(shop).await;
            }
            Ok(None) => {}
            Err(_) => {
                if let Err(e) = self.get(id).await {
                    tracing::debug!(shop = id, error = %e, "cannot reload the shop yet");
                }
            }
        }
    }

    pub fn meters(&self) -> &Meters {
        &self.inner.meters
    }

    /// Reloads the stale shops whose announcements have calmed down, until shutdown.
    pub async fn flush_stale(self, shutdown: CancellationToken) {
        let every = Schedule::every(FLUSH_EVERY);
        repeat("shop reloads", every, &shutdown, || async {
            for id in self.calmed_down() {
                // Now, so the purchase path's view follows at once.
                self.reload(id).await;
            }
            Ok::<_, Infallible>(())
        })
        .await;
    }

    /// The stale shops whose announcements have calmed down, taken off the stale list.
    fn calmed_down(&self) -> Vec<u64> {
        let now = Instant::now();
        let mut stale = self.inner.stale.lock().unwrap_or_else(|e| e.into_inner());
        let due: Vec<u64> = stale
            .iter()
            .filter(|(_, (first, last))| now - *last >= QUIET || now - *first >= AT_MOST)
            .map(|(id, _)| *id)
            .collect();
        for id in &due {
            stale.remove(id);
        }
        due
    }
}
