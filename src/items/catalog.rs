//! Every instance's in-memory view of the items on sale, so the purchase path checks the
//! sale window, the pause flag and "sold out" without a network round trip. It holds the
//! items current now (on sale, coming, ended within [`KEPT_AFTER_END`]) plus a bounded
//! cache of older ones, and refreshes them every half second at a cost that does not grow
//! with the catalogue (a window of at most [`STOCK_READS_PER_TICK`] buckets; announced
//! items first). How and why: docs/architecture.md, "How it works" and "A bounded
//! catalogue".

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::AsyncCommands;
use serde::Serialize;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::background::{Schedule, repeat};
use crate::domain::{ItemId, UserId};
use crate::keys::{ItemKeys, Keys};
use crate::shops::cache::Shops;
use crate::store::{Db, DbError, MissLimit, RedisConns, RedisError, StoreError, redis_timed};
use crate::telemetry::{ItemLevels, Meters};

use super::repo::{self, Item};
use super::stock;

const REFRESH_EVERY: Duration = Duration::from_millis(500);
/// A full read of the definitions this often, as a safety net under the incremental ones.
const FULL_RELOAD_EVERY: Duration = Duration::from_secs(30);
/// How far back an incremental read reaches before the previous one: a change whose
/// transaction committed this long after it stamped `updated_at` is still seen.
const CHANGE_OVERLAP: Duration = Duration::from_secs(3);
/// Buckets whose stock one refresh reads besides the announced ones.
pub const STOCK_READS_PER_TICK: usize = 1_000;
/// Stock older than this is read again when a storefront asks for the item...
const STOCK_FRESH_FOR_MS: i64 = 500;
/// ...unless Redis takes longer than this: a storefront read never waits on a slow Redis.
const STOCK_READ_ON_DEMAND_WITHIN: Duration = Duration::from_millis(50);
/// How long "no such item" is remembered, so unknown ids do not reach MySQL each time. A
/// write forgets it sooner: every announced item change clears these answers everywhere.
const UNKNOWN_FOR: Duration = Duration::from_secs(30);
/// Look-ups of items not in memory remembered at most (each a definition of a few hundred
/// bytes, or "none").
const LOOKUPS_KEPT: u64 = 10_000;
/// An item stays in the catalogue this long after its sale ended (its stock is read for
/// the first hour only); older ones are in it only while looked up, in [`Inner::others`].
pub const KEPT_AFTER_END: Duration = Duration::from_secs(86_400);
/// Buckets of older items kept (each about 3 KB of key names); a minute each at most.
const OTHERS_KEPT_BUCKETS: u64 = 4_096;
const OTHERS_FOR: Duration = Duration::from_secs(60);

#[derive(Clone)]
pub struct Catalog {
    inner: Arc<Inner>,
}

struct Inner {
    db: Db,
    redis: RedisConns,
    keys: Keys,
    meters: Arc<Meters>,
    /// The shops of the items, kept loaded for the purchase path.
    shops: Shops,
    /// The items on sale, about to be, or ended within [`KEPT_AFTER_END`].
    items: RwLock<HashMap<ItemId, Arc<CatalogItem>>>,
    /// The ids of `items` in order, for the stock window's walk.
    ids: RwLock<BTreeSet<ItemId>>,
    /// Older items looked up by id: bounded, and never walked by the stock refresh.
    others: moka::sync::Cache<ItemId, Arc<CatalogItem>>,
    /// Coalesced MySQL look-ups of items not (yet) in `items`, remembered briefly.
    lookups: moka::future::Cache<ItemId, Option<Item>>,
    /// Shares MySQL with the other look-ups of unknown ids.
    misses: MissLimit,
    wake: Notify,
    /// What the refresh tracks between ticks.
    progress: std::sync::Mutex<Progress>,
}

/// The refresh's place: since when definitions are known, and where the stock window is.
#[derive(Default)]
struct Progress {
    /// MySQL's clock at the last read of the definitions, and when the last full read was.
    read_at: Option<DateTime<Utc>>,
    full_at: Option<std::time::Instant>,
    /// Items announced since the last refresh: their stock is read first.
    announced: HashSet<ItemId>,
    /// The id the stock window starts from (it walks the catalogue by id).
    window_from: u64,
}

/// One item as the purchase path sees it.
pub struct CatalogItem {
    /// Its definition, as MySQL has it.
    pub record: Item,
    /// The keys of each of its buckets (one for an item not split).
    pub buckets: Arc<[ItemKeys]>,
    live: Arc<LiveStock>,
}

/// The item's stock as last seen in Redis (shared across reloads of the definition).
struct LiveStock {
    /// Every bucket loaded.
    loaded: AtomicBool,
    /// Some bucket seen loaded, ever (by this instance).
    seen_loaded: AtomicBool,
    /// Per bucket.
    remaining: Box<[AtomicU64]>,
    /// Per bucket: until when (ms since the epoch) it counts as empty whatever `remaining`
    /// says, because a purchase found nothing on sale there before a wave (0: no mark).
    empty_until_ms: Box<[AtomicI64]>,
    /// When it was read (ms since the epoch; 0: never).
    read_at_ms: AtomicI64,
}

impl LiveStock {
    fn new(buckets: u8) -> Self {
        Self {
            loaded: AtomicBool::new(false),
            seen_loaded: AtomicBool::new(false),
            remaining: (0..buckets.max(1)).map(|_| AtomicU64::new(0)).collect(),
            empty_until_ms: (0..buckets.max(1)).map(|_| AtomicI64::new(0)).collect(),
            read_at_ms: AtomicI64::new(0),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    Scheduled,
    Active,
    Paused,
    Ended,
    SoldOut,
    /// Everything released so far is sold; a wave is still to come.
    BetweenReleases,
}

impl CatalogItem {
    /// Units listed, as last seen (less the buckets a purchase found empty since, while
    /// their mark holds at `now`).
    pub fn remaining(&self, now: DateTime<Utc>) -> u64 {
        if let Some(unsold) = self.retired_unsold() {
            return unsold;
        }
        (0..self.live.remaining.len())
            .map(|bucket| self.listed_in(bucket, now))
            .sum()
    }

    /// Units on sale at `now`: those listed, less what waves still to come hold back.
    pub fn on_sale(&self, now: DateTime<Utc>) -> u64 {
        self.remaining(now)
            .saturating_sub(self.record.release.unreleased(now))
    }

    /// A bucket's units at `now`, as last seen.
    pub fn remaining_in(&self, bucket: u8, now: DateTime<Utc>) -> u64 {
        self.listed_in(usize::from(bucket), now)
    }

    fn listed_in(&self, bucket: usize, now: DateTime<Utc>) -> u64 {
        let marked = self
            .live
            .empty_until_ms
            .get(bucket)
            .is_some_and(|until| now.timestamp_millis() < until.load(Ordering::Relaxed));
        match self.live.remaining.get(bucket) {
            Some(r) if !marked => r.load(Ordering::Relaxed),
            _ => 0,
        }
    }

    pub fn sold_out(&self, now: DateTime<Utc>) -> bool {
        match self.retired_unsold() {
            Some(unsold) => unsold == 0,
            None => self.live.loaded.load(Ordering::Relaxed) && self.remaining(now) == 0,
        }
    }

    /// Whether nothing of it can have been on sale yet, so no purchase won (an
    /// `Idempotency-Key` bought nothing): no warm-up recorded a load in MySQL, and this
    /// instance never saw a bucket of it loaded in Redis (a warm-up cut off between its load
    /// and that record leaves units on sale: the next read of the stock sees them).
    pub fn never_loaded(&self) -> bool {
        self.record.loaded_at.is_none() && !self.live.seen_loaded.load(Ordering::Relaxed)
    }

    /// For a sale retired from Redis: the units it left unsold (its stock is not read).
    fn retired_unsold(&self) -> Option<u64> {
        self.record.retired_at?;
        Some(u64::from(self.record.unsold.unwrap_or(0)))
    }

    /// Whether its stock is worth reading from Redis: on sale, or ended within the hour
    /// (units coming back from cancels), and not retired.
    fn stock_read(&self, now: DateTime<Utc>) -> bool {
        self.record.retired_at.is_none() && self.record.end_at > now - chrono::Duration::hours(1)
    }

    /// The keys of the bucket that keeps `user`'s record.
    pub fn home(&self, user: UserId) -> &ItemKeys {
        let bucket = user.bucket(self.record.buckets);
        &self.buckets[usize::from(bucket).min(self.buckets.len() - 1)]
    }

    /// Remembers that a purchase found a bucket empty, until the next read of the stock
    /// says otherwise — or, when it had nothing on sale only until a wave (`wave`: its
    /// time, by Redis's clock, as `grab.lua` named it), until that wave at the latest:
    /// from then on the units it holds back are on sale, and the units last read are
    /// counted again (with thousands of buckets the refresh comes round to an item only
    /// every few seconds, and a memory of "empty" must not refuse buyers meanwhile).
    pub fn mark_empty(&self, bucket: u8, wave: Option<DateTime<Utc>>) {
        let bucket = usize::from(bucket);
        match wave {
            Some(at) => {
                if let Some(until) = self.live.empty_until_ms.get(bucket) {
                    until.store(at.timestamp_millis(), Ordering::Relaxed);
                }
            }
            None => {
                if let Some(r) = self.live.remaining.get(bucket) {
                    r.store(0, Ordering::Relaxed);
                }
            }
        }
    }

    /// Remembers that a bucket has a unit again (one at least), until the next refresh.
    pub fn mark_stocked(&self, bucket: u8) {
        let bucket = usize::from(bucket);
        if let Some(until) = self.live.empty_until_ms.get(bucket) {
            until.store(0, Ordering::Relaxed);
        }
        if let Some(r) = self.live.remaining.get(bucket) {
            r.fetch_max(1, Ordering::Relaxed);
        }
    }

    /// Remembers what `grab.lua` just found (every bucket empty, no wave to come), until
    /// the next refresh says otherwise. Returns whether this instance thought otherwise
    /// until now.
    pub fn mark_sold_out(&self) -> bool {
        let news = !self.sold_out(crate::clock::now());
        self.live.loaded.store(true, Ordering::Relaxed);
        self.live.seen_loaded.store(true, Ordering::Relaxed);
        for r in &self.live.remaining {
            r.store(0, Ordering::Relaxed);
        }
        news
    }

    pub fn status(&self, now: DateTime<Utc>) -> ItemStatus {
        if now >= self.record.end_at {
            ItemStatus::Ended
        } else if self.record.paused {
            ItemStatus::Paused
        } else if now < self.record.start_at {
            ItemStatus::Scheduled
        } else if self.on_sale(now) == 0 && self.record.release.next_at(now).is_some() {
            ItemStatus::BetweenReleases
        } else if self.sold_out(now) {
            ItemStatus::SoldOut
        } else {
            ItemStatus::Active
        }
    }
}

impl Catalog {
    pub fn new(
        db: Db,
        redis: RedisConns,
        keys: Keys,
        meters: Arc<Meters>,
        shops: Shops,
        misses: MissLimit,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                db,
                redis,
                keys,
                meters,
                shops,
                items: RwLock::new(HashMap::new()),
                ids: RwLock::new(BTreeSet::new()),
                others: moka::sync::Cache::builder()
                    .max_capacity(OTHERS_KEPT_BUCKETS)
                    .weigher(|_, entry: &Arc<CatalogItem>| entry.buckets.len() as u32)
                    .time_to_live(OTHERS_FOR)
                    .build(),
                lookups: moka::future::Cache::builder()
                    .max_capacity(LOOKUPS_KEPT)
                    .time_to_live(UNKNOWN_FOR)
                    .build(),
                misses,
                wake: Notify::new(),
                progress: std::sync::Mutex::default(),
            }),
        }
    }

    /// The item, from memory; an item not seen yet costs one (coalesced) MySQL read.
    pub async fn get(&self, id: ItemId) -> Result<Option<Arc<CatalogItem>>, DbError> {
        if let Some(hit) = self.cached(id) {
            return Ok(Some(hit));
        }
        // Boxed: the read's future is kilobytes, and every purchase's future would carry it.
        Box::pin(self.load(id)).await
    }

    /// An item not in memory: read from MySQL (coalesced, and misses remembered).
    async fn load(&self, id: ItemId) -> Result<Option<Arc<CatalogItem>>, DbError> {
        let (db, misses) = (self.inner.db.clone(), self.inner.misses.clone());
        let found = self
            .inner
            .lookups
            .try_get_with(id, async move { misses.run(repo::get(&db, id)).await })
            .await
            .map_err(DbError::Shared)?;
        Ok(found.map(|item| {
            let entry = self.upsert(item);
            if entry.stock_read(crate::clock::now()) {
                // Its stock, at the next refresh rather than in half a second.
                self.inner.wake.notify_one();
            }
            entry
        }))
    }

    fn cached(&self, id: ItemId) -> Option<Arc<CatalogItem>> {
        let items = self.inner.items.read().unwrap_or_else(|e| e.into_inner());
        items
            .get(&id)
            .cloned()
            .or_else(|| self.inner.others.get(&id))
    }

    /// An older item, into the bounded cache (its stock is never read: it is over).
    fn other(&self, item: Item) -> Arc<CatalogItem> {
        let entry = Arc::new(CatalogItem {
            buckets: item
                .bucket_ids()
                .map(|s| self.inner.keys.bucket(s))
                .collect(),
            live: Arc::new(LiveStock::new(item.buckets)),
            record: item,
        });
        self.inner.others.insert(entry.record.id, entry.clone());
        entry
    }

    /// Puts a definition in the map, keeping the live stock of an earlier version (an
    /// item no longer current leaves it).
    fn upsert(&self, item: Item) -> Arc<CatalogItem> {
        if !current(&item, crate::clock::now()) {
            self.forget(&[item.id]);
            return self.other(item);
        }
        self.inner.others.invalidate(&item.id);
        let mut items = self.inner.items.write().unwrap_or_else(|e| e.into_inner());
        let (buckets, live) = match items.get(&item.id) {
            Some(old) if old.record == item => return old.clone(),
            Some(old) if old.record.buckets == item.buckets => {
                (old.buckets.clone(), old.live.clone())
            }
            _ => (
                item.bucket_ids()
                    .map(|s| self.inner.keys.bucket(s))
                    .collect(),
                Arc::new(LiveStock::new(item.buckets)),
            ),
        };
        let entry = Arc::new(CatalogItem {
            record: item,
            buckets,
            live,
        });
        if items.insert(entry.record.id, entry.clone()).is_none() {
            let mut ids = self.inner.ids.write().unwrap_or_else(|e| e.into_inner());
            ids.insert(entry.record.id);
        }
        entry
    }

    /// Drops these items from the map (they ended long ago).
    fn forget(&self, gone: &[ItemId]) {
        if gone.is_empty() {
            return;
        }
        let mut items = self.inner.items.write().unwrap_or_else(|e| e.into_inner());
        let mut ids = self.inner.ids.write().unwrap_or_else(|e| e.into_inner());
        for id in gone {
            items.remove(id);
            ids.remove(id);
        }
    }

    /// Drops the items whose sale ended more than [`KEPT_AFTER_END`] ago.
    fn forget_old(&self) {
        let now = crate::clock::now();
        let gone: Vec<ItemId> = {
            let items = self.inner.items.read().unwrap_or_else(|e| e.into_inner());
            items
                .values()
                .filter(|e| !current(&e.record, now))
                .map(|e| e.record.id)
                .collect()
        };
        self.forget(&gone);
    }

    /// Shows how many items it holds, current and older (`seckill_catalogue_items`).
    fn show_size(&self) {
        let current = self.inner.items.read().map_or(0, |items| items.len());
        self.inner.others.run_pending_tasks();
        let others = self.inner.others.entry_count();
        self.inner.meters.catalogue_size(current as u64, others);
    }

    /// Reloads the definitions that changed from MySQL and the stock of announced items
    /// and of the next window of the catalogue from Redis, now.
    pub async fn refresh(&self) -> Result<(), StoreError> {
        let (since, announced) = self.next_round();
        self.forget_old();
        // MySQL down: keep the definitions we have, still refresh stock from Redis.
        let definitions = repo::recent(&self.inner.db, since, KEPT_AFTER_END).await;
        if let Ok((items, read_at)) = &definitions {
            for item in items {
                self.upsert(item.clone());
            }
            self.read_up_to(*read_at, since.is_none());
        }
        self.show_size();
        let entries = self.stock_to_read(&announced);
        self.read_stock(&entries).await?;
        let shops: std::collections::BTreeSet<u64> =
            entries.iter().map(|e| e.record.shop_id).collect();
        for shop in shops {
            // From the local cache while it is fresh; any failure keeps the last known.
            let _ = self.inner.shops.get(shop).await;
        }
        definitions.map(|_| ()).map_err(StoreError::from)
    }

    /// This one item, now: its definition from MySQL and its stock from Redis — after an
    /// operator's change, without waiting for the next round or paying for a whole one.
    pub async fn refresh_item(&self, id: ItemId) -> Result<(), StoreError> {
        if let Some(item) = repo::get(&self.inner.db, id).await? {
            let entry = self.upsert(item);
            self.read_stock(std::slice::from_ref(&entry)).await?;
            let _ = self.inner.shops.get(entry.record.shop_id).await;
        }
        Ok(())
    }

    /// Since when to read definitions (`None`: all of them), and the items announced since
    /// the last round (taken).
    fn next_round(&self) -> (Option<DateTime<Utc>>, Vec<ItemId>) {
        let mut progress = self.progress();
        let full_due = progress
            .full_at
            .is_none_or(|at| at.elapsed() >= FULL_RELOAD_EVERY);
        let since = match progress.read_at {
            Some(at) if !full_due => Some(at - CHANGE_OVERLAP),
            _ => None,
        };
        (since, progress.announced.drain().collect())
    }

    fn read_up_to(&self, read_at: DateTime<Utc>, full: bool) {
        let mut progress = self.progress();
        progress.read_at = Some(read_at);
        if full {
            progress.full_at = Some(std::time::Instant::now());
        }
    }

    /// The announced items, then the next window of the catalogue (walked by id), up to
    /// [`STOCK_READS_PER_TICK`] buckets in all; sales over for an hour are left alone.
    /// Its cost is the window's, whatever the catalogue's size.
    fn stock_to_read(&self, announced: &[ItemId]) -> Vec<Arc<CatalogItem>> {
        let now = crate::clock::now();
        let items = self.inner.items.read().unwrap_or_else(|e| e.into_inner());
        let current = |e: &&Arc<CatalogItem>| e.stock_read(now);
        if items.len() <= STOCK_READS_PER_TICK {
            let all: Vec<Arc<CatalogItem>> = items.values().filter(current).cloned().collect();
            if all.iter().map(|e| e.buckets.len()).sum::<usize>() <= STOCK_READS_PER_TICK {
                return all;
            }
        }
        let announced: HashSet<ItemId> = announced.iter().copied().collect();
        let mut chosen: Vec<Arc<CatalogItem>> = announced
            .iter()
            .filter_map(|id| items.get(id).filter(current).cloned())
            .collect();
        let mut budget = STOCK_READS_PER_TICK;
        let mut progress = self.progress();
        // Past the largest id, round to the start.
        let from = ItemId::new(progress.window_from).unwrap_or(ItemId::MIN);
        let ids = self.inner.ids.read().unwrap_or_else(|e| e.into_inner());
        for id in ids.range(from..).chain(ids.range(..from)) {
            let Some(entry) = items.get(id) else { continue };
            if current(&entry) {
                if budget < entry.buckets.len() {
                    break;
                }
                budget -= entry.buckets.len();
                if !announced.contains(id) {
                    chosen.push(entry.clone());
                }
            }
            progress.window_from = id.get() + 1;
        }
        chosen
    }

    /// Reads these items' stock from Redis (one round trip on one server).
    async fn read_stock(&self, entries: &[Arc<CatalogItem>]) -> Result<(), RedisError> {
        let states = stock::live_states(
            &self.inner.redis,
            entries.iter().flat_map(|e| e.buckets.iter()),
        )
        .await?;
        let now_ms = crate::clock::now().timestamp_millis();
        let mut states = states.into_iter();
        for entry in entries {
            let mut loaded = true;
            let mut levels = ItemLevels::default();
            let buckets = entry.live.remaining.iter().zip(&entry.live.empty_until_ms);
            for ((remaining, empty_until), state) in buckets.zip(states.by_ref()) {
                loaded &= state.loaded;
                if state.loaded {
                    entry.live.seen_loaded.store(true, Ordering::Relaxed);
                }
                remaining.store(state.levels.remaining, Ordering::Relaxed);
                empty_until.store(0, Ordering::Relaxed);
                levels.remaining += state.levels.remaining;
                levels.outbox += state.levels.outbox;
                levels.pending += state.levels.pending;
                levels.delayed += state.levels.delayed;
            }
            entry.live.loaded.store(loaded, Ordering::Relaxed);
            entry.live.read_at_ms.store(now_ms, Ordering::Relaxed);
            self.inner.meters.item_levels(entry.record.id, levels);
        }
        Ok(())
    }

    /// The item's stock, read again from Redis when older than half a second (for
    /// storefronts: with a large catalogue the background refresh reaches each item only
    /// now and then). A Redis that does not answer leaves the last known.
    pub async fn fresh_stock(&self, entry: &Arc<CatalogItem>) {
        // A retired sale's figures are MySQL's; any other is read, however old.
        if entry.record.retired_at.is_some() {
            return;
        }
        let read_at = entry.live.read_at_ms.load(Ordering::Relaxed);
        if crate::clock::now().timestamp_millis() - read_at <= STOCK_FRESH_FOR_MS {
            return;
        }
        let read = tokio::time::timeout(
            STOCK_READ_ON_DEMAND_WITHIN,
            self.read_stock(std::slice::from_ref(entry)),
        )
        .await;
        if !matches!(read, Ok(Ok(()))) {
            tracing::debug!(item = %entry.record.id, "stock read on demand failed or was slow; serving the last known");
        }
    }

    fn progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.inner
            .progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Tells every instance (this one included) that an item changed.
    pub async fn announce(&self, id: ItemId) -> Result<(), RedisError> {
        self.progress().announced.insert(id);
        let mut conn = self.inner.redis.bulk().await?;
        announce_change(&mut conn, &self.inner.keys, id).await
    }

    /// The background refresh: periodic, and at once on an item event.
    pub async fn run(self, shutdown: CancellationToken) {
        let listener = tokio::spawn(self.clone().listen(shutdown.clone()));
        // Failing, it serves the last known state.
        let schedule = Schedule {
            every: REFRESH_EVERY,
            wake: Some(&self.inner.wake),
            at_start: true,
        };
        repeat("item catalogue refresh", schedule, &shutdown, || {
            self.refresh()
        })
        .await;
        let _ = listener.await;
    }

    /// Subscribes to the item-events channel; each message (or a fresh subscription, which
    /// may have missed some) wakes the refresh and forgets the "no such item" answers (an
    /// item may have been created).
    async fn listen(self, shutdown: CancellationToken) {
        let channel = self.inner.keys.item_events_channel();
        let redis = self.inner.redis.clone();
        redis
            .listen(&channel, &shutdown, |message| {
                self.inner.lookups.invalidate_all();
                let id = message
                    .and_then(|m| m.get_payload::<u64>().ok())
                    .and_then(ItemId::new);
                match id {
                    Some(id) => {
                        self.progress().announced.insert(id);
                    }
                    // A fresh subscription (it may have missed some), or a message
                    // not naming an item: everything again.
                    None => self.progress().full_at = None,
                }
                self.inner.wake.notify_one();
            })
            .await;
    }

    /// Tells every instance (this one included) that many items changed: each reads every
    /// definition again, and forgets its "no such item" answers.
    pub async fn announce_all(&self) {
        self.forget_unknown();
        self.progress().full_at = None;
        let published = async {
            let mut conn = self.inner.redis.bulk().await?;
            redis_timed(conn.publish::<_, _, ()>(self.inner.keys.item_events_channel(), "all"))
                .await
        };
        if let Err(e) = published.await {
            tracing::warn!(error = %e, "could not announce item changes; other instances read them within 30 s anyway");
        }
        if let Err(e) = self.refresh().await {
            tracing::warn!(error = %crate::error::cause_chain(&e), "item catalogue refresh failed");
        }
    }

    /// Forgets the "no such item" answers now (this instance just wrote an item).
    pub fn forget_unknown(&self) {
        self.inner.lookups.invalidate_all();
    }
}

/// Whether the item belongs in the catalogue proper: not ended [`KEPT_AFTER_END`] ago.
fn current(item: &Item, now: DateTime<Utc>) -> bool {
    item.end_at + KEPT_AFTER_END > now
}

/// Tells every instance's catalogue that an item changed (for processes without one).
pub async fn announce_change<C>(conn: &mut C, keys: &Keys, id: ItemId) -> Result<(), RedisError>
where
    C: redis::aio::ConnectionLike + Send + Sync,
{
    redis_timed(conn.publish::<_, _, ()>(keys.item_events_channel(), id.get())).await
}
