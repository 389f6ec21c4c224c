//! Writing items: records into MySQL (one, or many 500 per transaction), and what
//! `grab.lua` checks (window, pause, per-user limit, waves) copied to Redis, the draw pass's
//! schedule and every instance's catalogue. `admin.rs` and `bulk.rs` are its HTTP surface.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};

use crate::deps::Deps;
use crate::domain::{BucketId, ItemId};
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
    #[error(transparent)]
    Store(#[from] StoreError),
}

crate::store::from_either_store!(WriteError);

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
    /// and the draft) that would change what is final of an item's mode or draw: once a
    /// draw is under way, its mode and `draw_at` (entries taken after, with the seed
    /// public, could be chosen to win); once an item was loaded, its mode — a sale's
    /// buyers entered into a draw could win a second unit, a draw's entrants would lose
    /// their units to the fastest. Loaded is told as `buckets` is (`super::regroup`):
    /// `loaded_at`, orders in MySQL, or anything of it in Redis.
    async fn keep_modes(
        &self,
        writes: &[(Option<usize>, &Item, &ItemDraft)],
    ) -> Result<(), WriteError> {
        let now = crate::clock::now();
        let mut switching: Vec<(Option<usize>, &Item)> = Vec::new();
        for (index, live, next) in writes {
            if let Some(field) = draw_made_changed(live, next, now) {
                return Err(WriteError::DrawFixed {
                    field,
                    index: *index,
                });
            }
            if live.draw_at.is_some() != next.draw_at.is_some() {
                if live.loaded_at.is_some() {
                    return Err(WriteError::ModeFixed { index: *index });
                }
                switching.push((*index, live));
            }
        }
        if switching.is_empty() {
            return Ok(());
        }
        let ids: Vec<ItemId> = switching.iter().map(|(_, live)| live.id).collect();
        let mut held: HashSet<ItemId> =
            crate::orders::repo::items_having_orders(&self.deps.db, &ids)
                .await?
                .into_iter()
                .collect();
        let buckets: Vec<(ItemId, u8)> = switching
            .iter()
            .map(|(_, live)| (live.id, live.buckets))
            .collect();
        held.extend(super::regroup::in_redis(&self.deps.redis, &self.deps.keys, &buckets).await?);
        match switching.iter().find(|(_, live)| held.contains(&live.id)) {
            Some((index, _)) => Err(WriteError::ModeFixed { index: *index }),
            None => Ok(()),
        }
    }

    /// Pauses or resumes the item's sale.
    pub async fn set_paused(&self, id: ItemId, paused: bool) -> Result<(), WriteError> {
        if !repo::set_paused(&self.deps.db, id, paused).await? {
            return Err(WriteError::NotFound);
        }
        self.spread_rules(id).await?;
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
