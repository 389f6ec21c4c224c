//! Writing items: records into MySQL (one, or many 500 per transaction), and what
//! `grab.lua` checks (window, pause, per-user limit, waves) copied to Redis, the draw pass's
//! schedule and every instance's catalogue. `admin.rs` and `bulk.rs` are its HTTP surface.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::deps::Deps;
use crate::domain::{BucketId, ItemId};
use crate::lock::RedisLock;
use crate::store::{Grouped, StoreError};

use super::catalog::Catalog;
use super::regroup::Regrouping;
use super::repo::{self, Item, ItemDraft, Upserted};
use super::stock;
use super::waves::Waves;

/// What item writes work with.
pub struct ItemWriter<'a> {
    pub deps: &'a Deps,
    pub catalog: &'a Catalog,
}

/// What one item's write did.
pub enum Put {
    Created(Item),
    Updated(Item),
    /// Nothing: `buckets` differs, and the item has units, buyer records or orders in the
    /// buckets it has (or a warm-up of it is running).
    BucketsFixed {
        buckets: u8,
    },
}

/// Why an item write did nothing.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("no such item")]
    NotFound,
    /// A loaded item's tranche at `at` is on sale already: released tranches may not be
    /// changed, removed or added. `index`: the item's place in a bulk call.
    #[error("the tranche of {at} is on sale already")]
    ReleaseStarted {
        at: DateTime<Utc>,
        index: Option<usize>,
    },
    /// The item's draw is under way or made (its time came, or units were given): its
    /// mode and `draw_at` are final. `field`: the one the write would change.
    #[error("the draw is under way or made: `{field}` is final")]
    DrawFixed {
        field: &'static str,
        index: Option<usize>,
    },
    /// The item was loaded, or has buyers, entries or orders: it keeps its mode.
    #[error("the item was loaded: it keeps its mode")]
    ModeFixed { index: Option<usize> },
    /// The item was loaded, or has buyers, entries or orders: it keeps its price, which
    /// every order's charge is judged against.
    #[error("the item was loaded: it keeps its price")]
    PriceFixed {
        price_cents: u64,
        index: Option<usize>,
    },
    /// Buyers hold places in the item's waiting room: it stays, and its `start_at` (where
    /// the pre-queue ends and arrivals begin) with it — either change would reorder them.
    #[error("buyers are waiting in the item's queue: `{field}` is fixed")]
    QueueFixed {
        field: &'static str,
        index: Option<usize>,
    },
    /// A wave would hold back more of a bucket's units than its list still has (units
    /// sold cannot be held back): `held` units now, of `listed`. `bucket`: which, for a
    /// split item; `index`: the item's place in a bulk call.
    #[error("a wave would hold back {held} units, and only {listed} are unsold")]
    StockCommitted {
        held: u64,
        listed: u64,
        bucket: Option<u8>,
        index: Option<usize>,
    },
    /// A warm-up of the item (or another write of its waves or mode) is running.
    #[error("a warm-up of item {id} or another change of its waves or mode is running")]
    Busy { id: ItemId, index: Option<usize> },
    #[error(transparent)]
    Store(#[from] StoreError),
}

crate::store::from_either_store!(WriteError);

/// How long a write that holds more units back for waves keeps the items' warm-up locks,
/// at most: as long as a bulk call may take.
const WAVES_HELD_FOR: Duration = Duration::from_secs(120);
/// How long such a write waits for a warm-up or another such write of an item to let go.
const WAVES_WAIT: Duration = Duration::from_millis(300);

/// The first released tranche `next` would change on the live item, if it is loaded
/// (before it is, nothing is on sale).
fn released_changed(live: &Item, next: &Waves) -> Option<DateTime<Utc>> {
    live.loaded_at?;
    live.release.released_changed(next, crate::clock::now())
}

/// The field `next` would change of the live item's draw once it is under way or made —
/// its time came for a loaded item, or a round gave units — if any: its mode and `draw_at`
/// are final then.
fn draw_made_changed(live: &Item, next: &ItemDraft, now: DateTime<Utc>) -> Option<&'static str> {
    let at = live.draw_at?;
    let made = (at <= now && live.loaded_at.is_some())
        || live.drawn_at.is_some()
        || live.draw_cutoff.is_some();
    match next.draw_at {
        _ if !made => None,
        None => Some("mode"),
        Some(next_at) if next_at != at => Some("draw_at"),
        Some(_) => None,
    }
}

impl ItemWriter<'_> {
    /// `PUT /admin/items/{id}`: [`ItemWriter::put`], with what the item's units can no
    /// longer honour refused first ([`ItemWriter::hold_waves`]).
    pub async fn put_honoured(&self, id: ItemId, draft: ItemDraft) -> Result<Put, WriteError> {
        let held = self.hold_waves(&[(id, draft.clone())], false).await?;
        let put = self.put(id, draft).await;
        held.settle(self.deps).await;
        put
    }

    /// `PUT /admin/items`: [`ItemWriter::put_many`], likewise.
    pub async fn put_many_honoured(
        &self,
        drafts: &[(ItemId, ItemDraft)],
    ) -> Result<Vec<(ItemId, Upserted)>, WriteError> {
        let held = self.hold_waves(drafts, true).await?;
        let done = self.put_many(drafts).await;
        held.settle(self.deps).await;
        done
    }

    /// Before items that exist are written: takes their warm-up locks (no warm-up, and no
    /// other write of them, runs until [`WavesHeld::settle`] — two writes of one item, one
    /// raising a wave and one without, would otherwise each leave half of itself), and in
    /// every bucket whose new plan holds more units back at some instant than the plan it
    /// replaces, writes the more of both (`lua/waves_raise.lua`) — only if the bucket's
    /// list covers what that holds back now, checked in the same step, so no purchase takes
    /// a unit the check counted. Purchases sell only above what is held back, so the list keeps
    /// covering it while the record is written, and after: `settle` writes the record's
    /// plan (the new one, or the old one if the write did not happen), which holds back
    /// no more than that. A plan holding no more than before needs no check (what is held
    /// back is on the list already). Refused (`StockCommitted`): nothing written anywhere.
    /// Items whose `buckets` or released tranches the write would change are left to
    /// [`ItemWriter::put`], which refuses them (or, for new buckets, nothing is on sale).
    /// `bulk`: a refusal names the item by its place in `drafts`.
    async fn hold_waves(
        &self,
        drafts: &[(ItemId, ItemDraft)],
        bulk: bool,
    ) -> Result<WavesHeld, WriteError> {
        let ids: Vec<ItemId> = drafts.iter().map(|(id, _)| *id).collect();
        let live: HashMap<ItemId, Item> = repo::get_many(&self.deps.db, &ids)
            .await?
            .into_iter()
            .map(|item| (item.id, item))
            .collect();
        // Items that exist and keep their buckets (a write that changes them takes the same
        // lock: `Regrouping`). Under the lock `keep_modes` checks the mode and price too: no first
        // warm-up loads the item between that check and the write.
        let existing: Vec<(Option<usize>, ItemId, &ItemDraft)> = drafts
            .iter()
            .enumerate()
            .filter(|(_, (id, draft))| {
                live.get(id)
                    .is_some_and(|item| item.buckets == draft.buckets)
            })
            .map(|(index, (id, draft))| (bulk.then_some(index), *id, draft))
            .collect();
        let mut held = WavesHeld::default();
        if existing.is_empty() {
            return Ok(held);
        }
        match self.raise_waves(&existing, &mut held).await {
            Ok(()) => Ok(held),
            Err(e) => {
                held.settle(self.deps).await;
                Err(e)
            }
        }
    }

    /// [`ItemWriter::hold_waves`]'s locks and raises (each item with its place in a bulk
    /// call), into `held` as they are taken.
    async fn raise_waves(
        &self,
        items: &[(Option<usize>, ItemId, &ItemDraft)],
        held: &mut WavesHeld,
    ) -> Result<(), WriteError> {
        let redis = &self.deps.redis;
        let lock_keys = items
            .iter()
            .map(|(_, id, _)| self.deps.keys.warmup_lock(*id))
            .collect();
        let taken = RedisLock::try_take_many(redis, lock_keys, WAVES_HELD_FOR).await?;
        let mut busy = Vec::new();
        for ((index, id, _), lock) in items.iter().zip(taken) {
            match lock {
                Some(lock) => held.locks.push(lock),
                None => busy.push((*index, *id)),
            }
        }
        let waited_until = Instant::now() + WAVES_WAIT;
        for (index, id) in busy {
            let wait = waited_until.saturating_duration_since(Instant::now());
            let key = self.deps.keys.warmup_lock(id);
            let lock = RedisLock::take_within(redis, key, WAVES_HELD_FOR, wait).await?;
            held.locks.push(lock.ok_or(WriteError::Busy { id, index })?);
        }
        // Read under the locks: no other write of these items' waves comes between.
        let ids: Vec<ItemId> = items.iter().map(|(_, id, _)| *id).collect();
        let live: HashMap<ItemId, Item> = repo::get_many(&self.deps.db, &ids)
            .await?
            .into_iter()
            .map(|item| (item.id, item))
            .collect();
        let mut conn = redis.bulk().await?;
        for (index, id, draft) in items {
            let Some(item) = live.get(id) else { continue };
            if item.buckets != draft.buckets || released_changed(item, &draft.release).is_some() {
                continue;
            }
            for bucket in item.bucket_ids() {
                let before = item.release.holds(item.buckets, bucket.index);
                let most = before.most(&draft.release.holds(item.buckets, bucket.index));
                if most == before {
                    continue;
                }
                if held.raised.last() != Some(id) {
                    held.raised.push(*id);
                }
                let keys = self.deps.keys.bucket(bucket);
                if let stock::Raised::Short { held, listed } =
                    stock::raise_waves(&mut conn, &keys, &most).await?
                {
                    return Err(WriteError::StockCommitted {
                        held,
                        listed,
                        bucket: item.split().then_some(bucket.index),
                        index: *index,
                    });
                }
            }
        }
        Ok(())
    }

    /// Creates or updates the item `id`; a changed `total` takes effect with a forced
    /// warm-up.
    pub async fn put(&self, id: ItemId, draft: ItemDraft) -> Result<Put, WriteError> {
        let live = repo::get(&self.deps.db, id).await?;
        if let Some(live) = &live
            && let Some(at) = released_changed(live, &draft.release)
        {
            return Err(WriteError::ReleaseStarted { at, index: None });
        }
        if let Some(live) = &live {
            self.keep_modes(&[(None, live, &draft)]).await?;
        }
        let regrouping = Regrouping::hold(
            &self.deps.db,
            &self.deps.redis,
            &self.deps.keys,
            &[(id, draft.clone())],
        )
        .await?;
        let upserted = repo::upsert(&self.deps.db, id, &draft, &regrouping.kept).await;
        regrouping.let_go(&self.deps.redis).await;
        match upserted? {
            Upserted::Created => Ok(Put::Created(self.spread_rules(id).await?)),
            Upserted::Updated => Ok(Put::Updated(self.spread_rules(id).await?)),
            Upserted::BucketsFixed { buckets } => Ok(Put::BucketsFixed { buckets }),
        }
    }

    /// Creates or updates many items (each id once): what happened to each, in the order
    /// given. Nothing is written when one would change a released tranche.
    pub async fn put_many(
        &self,
        drafts: &[(ItemId, ItemDraft)],
    ) -> Result<Vec<(ItemId, Upserted)>, WriteError> {
        let ids: Vec<ItemId> = drafts.iter().map(|(id, _)| *id).collect();
        let live: HashMap<ItemId, Item> = repo::get_many(&self.deps.db, &ids)
            .await?
            .into_iter()
            .map(|item| (item.id, item))
            .collect();
        for (index, (id, draft)) in drafts.iter().enumerate() {
            if let Some(at) = live
                .get(id)
                .and_then(|item| released_changed(item, &draft.release))
            {
                return Err(WriteError::ReleaseStarted {
                    at,
                    index: Some(index),
                });
            }
        }
        let writes: Vec<(Option<usize>, &Item, &ItemDraft)> = drafts
            .iter()
            .enumerate()
            .filter_map(|(index, (id, draft))| Some((Some(index), live.get(id)?, draft)))
            .collect();
        self.keep_modes(&writes).await?;
        let regrouping =
            Regrouping::hold(&self.deps.db, &self.deps.redis, &self.deps.keys, drafts).await?;
        let done = repo::upsert_many(&self.deps.db, drafts, &regrouping.kept).await;
        regrouping.let_go(&self.deps.redis).await;
        let done = done?;

        // The rules grab.lua checks (window, per-user limit, waves), into Redis for the
        // items that existed and are not retired (a PUT does not change the pause; new
        // items have nothing in Redis yet; see `spread_rules` for retired ones).
        let mut updated: HashSet<ItemId> = done
            .iter()
            .filter(|(_, outcome)| *outcome == Upserted::Updated)
            .map(|(id, _)| *id)
            .collect();
        let listed: Vec<ItemId> = updated.iter().copied().collect();
        for id in repo::retired_among(&self.deps.db, &listed).await? {
            updated.remove(&id);
        }
        if !updated.is_empty() {
            stock::load_rules_set(&self.deps.redis).await?;
        }
        let mut grouped = Grouped::new(&self.deps.redis);
        for (id, draft) in drafts.iter().filter(|(id, _)| updated.contains(id)) {
            for bucket in BucketId::all(*id, draft.buckets) {
                stock::sync_draft_in(grouped.group(), &self.deps.keys.bucket(bucket), draft);
            }
        }
        // Every written item's draw (or none) in the draw pass's schedule.
        let stored: HashSet<ItemId> = done
            .iter()
            .filter(|(_, outcome)| matches!(outcome, Upserted::Created | Upserted::Updated))
            .map(|(id, _)| *id)
            .collect();
        for (id, draft) in drafts.iter().filter(|(id, _)| stored.contains(id)) {
            super::draw_schedule::note_in(grouped.group(), &self.deps.keys, *id, draft.draw_at);
        }
        grouped.run(&self.deps.redis).await?;
        self.catalog.announce_all().await;
        Ok(done)
    }

    /// Refuses the first of `writes` (each with its place in a bulk call, the live item
    /// and the draft) that would change what is final of an item's mode, price or draw:
    /// once a draw is under way, its mode and `draw_at` (entries taken after, with the seed
    /// public, could be chosen to win); once an item was loaded, its mode — a sale's
    /// buyers entered into a draw could win a second unit, a draw's entrants would lose
    /// their units to the fastest — and its price, which the payment of every order is
    /// judged against (a price changed under them made the orders taken before owe a
    /// charge back, `amount_mismatch`, and time out). Loaded is told as `buckets` is
    /// (`super::regroup`): `loaded_at`, orders in MySQL, or anything of it in Redis.
    async fn keep_modes(
        &self,
        writes: &[(Option<usize>, &Item, &ItemDraft)],
    ) -> Result<(), WriteError> {
        let now = crate::clock::now();
        // Items whose mode or price the write changes: refused if loaded, each with the
        // refusal it gets.
        let mut switching: Vec<(&Item, WriteError)> = Vec::new();
        for (index, live, next) in writes {
            self.keep_queue(*index, live, next).await?;
            if let Some(field) = draw_made_changed(live, next, now) {
                return Err(WriteError::DrawFixed {
                    field,
                    index: *index,
                });
            }
            let refusal = if live.draw_at.is_some() != next.draw_at.is_some() {
                WriteError::ModeFixed { index: *index }
            } else if live.price_cents != next.price_cents {
                WriteError::PriceFixed {
                    price_cents: live.price_cents,
                    index: *index,
                }
            } else {
                continue;
            };
            if live.loaded_at.is_some() {
                return Err(refusal);
            }
            switching.push((live, refusal));
        }
        if switching.is_empty() {
            return Ok(());
        }
        let ids: Vec<ItemId> = switching.iter().map(|(live, _)| live.id).collect();
        let mut held: HashSet<ItemId> =
            crate::orders::repo::items_having_orders(&self.deps.db, &ids)
                .await?
                .into_iter()
                .collect();
        let buckets: Vec<(ItemId, u8)> = switching
            .iter()
            .map(|(live, _)| (live.id, live.buckets))
            .collect();
        held.extend(super::regroup::in_redis(&self.deps.redis, &self.deps.keys, &buckets).await?);
        match switching
            .into_iter()
            .find(|(live, _)| held.contains(&live.id))
        {
            Some((_, refusal)) => Err(refusal),
            None => Ok(()),
        }
    }

    /// Refuses a write that would reorder those waiting in the item's queue: removing it,
    /// or moving `start_at`, once anyone took a place.
    async fn keep_queue(
        &self,
        index: Option<usize>,
        live: &Item,
        next: &ItemDraft,
    ) -> Result<(), WriteError> {
        if live.queue.0.is_none() {
            return Ok(());
        }
        let field = if next.queue.0.is_none() {
            "queue"
        } else if next.start_at.timestamp_millis() != live.start_at.timestamp_millis() {
            // (To the millisecond, as MySQL keeps it.)
            "start_at"
        } else {
            return Ok(());
        };
        let mut conn = self.deps.redis.bulk().await?;
        let line = self.deps.keys.queue(live.id).line;
        let joined: u64 = crate::store::redis_timed(redis::AsyncCommands::zcard(&mut conn, line))
            .await
            .map_err(StoreError::from)?;
        if joined > 0 {
            return Err(WriteError::QueueFixed { field, index });
        }
        Ok(())
    }

    /// Pauses or resumes the item's sale: the flag alone into Redis. Not the record's other
    /// rules — it takes no lock, and a `PUT` raising a wave holds the more of its old and
    /// new plans in Redis while MySQL still has the old one: writing that over the raise let
    /// buyers take the units the new plan holds back, and the stock then held back more
    /// than it listed ([`ItemWriter::hold_waves`]).
    pub async fn set_paused(&self, id: ItemId, paused: bool) -> Result<(), WriteError> {
        if !repo::set_paused(&self.deps.db, id, paused).await? {
            return Err(WriteError::NotFound);
        }
        let item = repo::get(&self.deps.db, id)
            .await?
            .ok_or(WriteError::NotFound)?;
        // A retired sale's state is gone or going: see `spread_rules`.
        if item.retired_at.is_none() {
            let mut conn = self.deps.redis.bulk().await?;
            for bucket in item.bucket_ids() {
                stock::sync_paused(&mut conn, &self.deps.keys.bucket(bucket), paused).await?;
            }
        }
        self.refresh_everywhere(id).await;
        Ok(())
    }

    /// After the MySQL record changed: copies what `grab.lua` checks (window, pause) to
    /// Redis and has every instance's catalogue reload the item. Returns the item as
    /// recorded.
    ///
    /// A retired sale's state in Redis is gone, or going (a retirement that recorded it
    /// deletes it next, whatever the meta says): its rules are not written there, which
    /// would recreate a meta of rules alone, or let a moved window sell from a state about
    /// to be deleted. A forced warm-up loads it again, rules included. (Read after the
    /// write: a write that moved the sale's end before the retirement recorded it keeps it
    /// from being retired.)
    async fn spread_rules(&self, id: ItemId) -> Result<Item, WriteError> {
        let item = repo::get(&self.deps.db, id)
            .await?
            .ok_or(WriteError::NotFound)?;
        let mut conn = self.deps.redis.bulk().await?;
        if item.retired_at.is_none() {
            for bucket in item.bucket_ids() {
                stock::sync_rules(&mut conn, &self.deps.keys.bucket(bucket), &item).await?;
            }
        }
        let mut pipe = redis::pipe();
        super::draw_schedule::note_in(&mut pipe, &self.deps.keys, id, item.draw_at);
        crate::store::redis_timed(pipe.query_async::<()>(&mut conn)).await?;
        self.refresh_everywhere(id).await;
        Ok(item)
    }

    /// This instance at once, the others through the item-events channel.
    async fn refresh_everywhere(&self, id: ItemId) {
        self.catalog.forget_unknown();
        if let Err(e) = self.catalog.announce(id).await {
            tracing::warn!(error = %e, "could not announce an item change; other instances catch up within a second");
        }
        if let Err(e) = self.catalog.refresh_item(id).await {
            tracing::warn!(error = %crate::error::cause_chain(&e), "item catalogue refresh failed");
        }
    }
}

/// What [`ItemWriter::hold_waves`] took: the items' warm-up locks, and the items whose
/// buckets hold the more of their old and new plans in Redis.
#[derive(Default)]
struct WavesHeld {
    locks: Vec<RedisLock>,
    raised: Vec<ItemId>,
}

impl WavesHeld {
    /// Once the write is done (or refused): the record's plan into every bucket of the
    /// items raised (it holds back no more than what was raised) that are not retired (see
    /// [`ItemWriter::spread_rules`]: `waves_raise.lua` wrote nothing there), then the locks
    /// let go.
    /// A Redis that does not answer leaves those buckets holding the more of both plans —
    /// never fewer units than the record holds back — until the next write of the item.
    async fn settle(self, deps: &Deps) {
        if !self.raised.is_empty() {
            let written = async {
                let items = repo::get_many(&deps.db, &self.raised).await?;
                let mut conn = deps.redis.bulk().await?;
                for item in items.iter().filter(|item| item.retired_at.is_none()) {
                    for bucket in item.bucket_ids() {
                        stock::sync_rules(&mut conn, &deps.keys.bucket(bucket), item).await?;
                    }
                }
                Ok::<(), StoreError>(())
            };
            if let Err(e) = written.await {
                tracing::warn!(items = ?self.raised, error = %crate::error::cause_chain(&e), "could not write the items' waves back from their records; their buckets hold back the more of the old and the new plan until the item is written again");
            }
        }
        if let Err(e) = RedisLock::release_many(&deps.redis, self.locks).await {
            tracing::warn!(error = %e, "could not release warm-up locks; they expire by themselves");
        }
    }
}
