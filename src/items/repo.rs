//! Items in MySQL: the record of what is on sale.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::QueryBuilder;

use crate::domain::{BucketId, ItemId, OrderPlaced, OrderSn, UserId};
use crate::store::{Db, DbError, mysql_begin, mysql_timed, retrying_deadlocks};

use super::waves::Waves;
use crate::items::queue_plan::QueueSetting;

/// An item as MySQL records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Item {
    #[sqlx(try_from = "u64")]
    pub id: ItemId,
    pub shop_id: u64,
    pub name: String,
    pub total: u32,
    pub price_cents: u64,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub pay_timeout_s: u32,
    /// Redis buckets the units are spread over (1: not split).
    pub buckets: u8,
    /// Live orders one buyer may hold (1: one unit per buyer).
    pub per_user: u8,
    /// Tranches released after `start_at` (empty: every unit on sale from `start_at`).
    #[sqlx(rename = "release_plan", try_from = "Option<String>")]
    pub release: Waves,
    /// A draw's time: entries until then, winners drawn at it (`None`: first come, first
    /// served). See `src/items/draw.rs`.
    pub draw_at: Option<DateTime<Utc>>,
    /// The draw's secret seed (hex): never sent with the item; public once drawn.
    #[serde(skip)]
    pub draw_seed: Option<String>,
    /// When the first round of winners was complete (the seed is public from then on).
    pub drawn_at: Option<DateTime<Utc>>,
    /// The highest rank given a unit so far.
    pub draw_cutoff: Option<u64>,
    /// The waiting room in front of the sale (`src/queue/`), if it has one.
    #[sqlx(rename = "queue_plan", try_from = "Option<String>")]
    #[schema(value_type = Option<crate::items::queue_plan::QueuePlan>)]
    pub queue: QueueSetting,
    /// The seed that orders the pre-queue (hex): never sent with the item before
    /// `start_at`, public from then.
    #[serde(skip)]
    pub queue_seed: Option<String>,
    pub paused: bool,
    /// When a warm-up last loaded the units into Redis (`None`: never).
    pub loaded_at: Option<DateTime<Utc>>,
    /// When the ended sale was retired from Redis (`None`: not yet): MySQL alone answers
    /// for it since (see `src/items/retire.rs`).
    pub retired_at: Option<DateTime<Utc>>,
    /// Units left unsold when it was retired.
    pub unsold: Option<u32>,
}

impl Item {
    /// Every bucket of the item.
    pub fn bucket_ids(&self) -> impl Iterator<Item = BucketId> + Clone + use<> {
        BucketId::all(self.id, self.buckets)
    }

    /// Whether the item is split over several buckets.
    pub fn split(&self) -> bool {
        self.buckets > 1
    }

    /// A fresh order of this item for `user`, won in `bucket` at `now_ms`: a new order
    /// number, the pay deadline the item gives, no slot yet (`grab.lua` says which it
    /// holds).
    pub fn order_for(&self, bucket: BucketId, user: UserId, now_ms: i64) -> OrderPlaced {
        OrderPlaced {
            order_sn: OrderSn::generate(bucket, self.split()),
            item_id: self.id,
            user_id: user,
            created_at_ms: now_ms,
            pay_deadline_ms: now_ms + i64::from(self.pay_timeout_s) * 1000,
            slot: 0,
        }
    }

    /// Whether buyers can buy now by the record (window open, not paused).
    pub fn on_sale_at(&self, now: DateTime<Utc>) -> bool {
        !self.paused && self.start_at <= now && now < self.end_at
    }
}

/// What an operator sends to create or update an item (already validated).
#[derive(Clone, Debug)]
pub struct ItemDraft {
    pub name: String,
    pub shop_id: u64,
    pub total: u32,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub price_cents: u64,
    pub pay_timeout_s: u32,
    pub buckets: u8,
    pub per_user: u8,
    pub release: Waves,
    pub draw_at: Option<DateTime<Utc>>,
    /// A fresh seed for a draw; an item that has one keeps it.
    pub draw_seed: Option<String>,
    pub queue: QueueSetting,
    /// A fresh seed for a waiting room; an item that has one keeps it.
    pub queue_seed: Option<String>,
}

/// What [`upsert`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upserted {
    Created,
    Updated,
    /// Nothing: `buckets` differs, and the item has units, buyer records or orders in the
    /// buckets it has (or a warm-up of it is running).
    BucketsFixed {
        buckets: u8,
    },
}

const COLUMNS: &str = "id, shop_id, name, total, price_cents, start_at, end_at, pay_timeout_s, buckets, per_user, release_plan, draw_at, draw_seed, drawn_at, draw_cutoff, queue_plan, queue_seed, paused, loaded_at, retired_at, unsold";

/// Items written per transaction by [`upsert_many`].
const UPSERT_CHUNK: usize = 500;

pub async fn get(db: &Db, id: ItemId) -> Result<Option<Item>, DbError> {
    let sql = format!("SELECT {COLUMNS} FROM items WHERE id = ?");
    mysql_timed(
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(id.get())
            .fetch_optional(db),
    )
    .await
}

/// These items (those that exist), in one query.
pub async fn get_many(db: &Db, ids: &[ItemId]) -> Result<Vec<Item>, DbError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut query = QueryBuilder::new(format!("SELECT {COLUMNS} FROM items WHERE id IN ("));
    let mut list = query.separated(", ");
    for id in ids {
        list.push_bind(id.get());
    }
    query.push(")");
    mysql_timed(query.build_query_as().fetch_all(db)).await
}

/// Items whose sale ended less than `ended_within` ago or has not ended: what the catalogue of
/// every instance keeps fresh. With `changed_since`, only those changed since then.
/// Returns them and MySQL's clock at the read (for the next `changed_since`).
pub async fn recent(
    db: &Db,
    changed_since: Option<DateTime<Utc>>,
    ended_within: std::time::Duration,
) -> Result<(Vec<Item>, DateTime<Utc>), DbError> {
    let mut tx = mysql_begin(db).await?;
    let (now,): (DateTime<Utc>,) =
        mysql_timed(sqlx::query_as("SELECT UTC_TIMESTAMP(3)").fetch_one(&mut *tx)).await?;
    let within = ended_within.as_secs();
    let items = match changed_since {
        None => {
            let sql = format!(
                "SELECT {COLUMNS} FROM items WHERE end_at > UTC_TIMESTAMP(3) - INTERVAL ? SECOND"
            );
            mysql_timed(
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .bind(within)
                    .fetch_all(&mut *tx),
            )
            .await?
        }
        Some(since) => {
            let sql = format!(
                "SELECT {COLUMNS} FROM items
                 WHERE updated_at >= ? AND end_at > UTC_TIMESTAMP(3) - INTERVAL ? SECOND"
            );
            mysql_timed(
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .bind(since)
                    .bind(within)
                    .fetch_all(&mut *tx),
            )
            .await?
        }
    };
    mysql_timed(tx.commit()).await?;
    Ok((items, now))
}

/// Creates or updates an item, creating its shop (open, no hours) when it is new.
pub async fn upsert(
    db: &Db,
    id: ItemId,
    draft: &ItemDraft,
    kept: &HashSet<ItemId>,
) -> Result<Upserted, DbError> {
    let done = upsert_many(db, &[(id, draft.clone())], kept).await?;
    Ok(done
        .first()
        .map_or(Upserted::Updated, |(_, outcome)| *outcome))
}

/// Creates or updates many items (in id order, [`UPSERT_CHUNK`] per transaction),
/// creating their shops. Returns what happened to each, in id order. An item keeps its
/// bucket count once it was loaded, has orders, or is among `kept` (the caller found its
/// state in Redis: `super::regroup`).
///
/// Operators' scripts write items in parallel, often of one new shop: shop rows are locked
/// first, then item rows, each in id order, so two writers always take their locks in one
/// order; READ COMMITTED keeps the look-up of an item not there yet from locking the gap
/// around it (under REPEATABLE READ two such look-ups lock one gap and each then waits for
/// the other's insert: a deadlock); and a deadlock's victim is anyway run again.
pub async fn upsert_many(
    db: &Db,
    drafts: &[(ItemId, ItemDraft)],
    kept: &HashSet<ItemId>,
) -> Result<Vec<(ItemId, Upserted)>, DbError> {
    let mut sorted: Vec<&(ItemId, ItemDraft)> = drafts.iter().collect();
    sorted.sort_by_key(|(id, _)| *id);
    sorted.dedup_by_key(|(id, _)| *id);
    let mut done = Vec::with_capacity(sorted.len());
    for chunk in sorted.chunks(UPSERT_CHUNK) {
        done.extend(retrying_deadlocks("item upsert", || upsert_chunk(db, chunk, kept)).await?);
    }
    Ok(done)
}

async fn upsert_chunk(
    db: &Db,
    chunk: &[&(ItemId, ItemDraft)],
    kept: &HashSet<ItemId>,
) -> Result<Vec<(ItemId, Upserted)>, DbError> {
    let mut conn = mysql_timed(db.acquire()).await?;
    // Without SESSION: for this connection's next transaction only.
    mysql_timed(sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED").execute(&mut *conn))
        .await?;
    let mut tx = mysql_timed(sqlx::Connection::begin(&mut *conn)).await?;

    let mut shops: Vec<u64> = chunk.iter().map(|(_, d)| d.shop_id).collect();
    shops.sort_unstable();
    shops.dedup();
    let mut insert_shops = QueryBuilder::new("INSERT INTO shops (id) ");
    insert_shops.push_values(&shops, |mut row, shop| {
        row.push_bind(*shop);
    });
    insert_shops.push(" ON DUPLICATE KEY UPDATE id = id");
    mysql_timed(insert_shops.build().execute(&mut *tx)).await?;

    // Whether each existed, read under the row locks that the upsert takes anyway (the
    // driver's affected-rows count does not tell an unchanged row from a new one).
    let mut look = QueryBuilder::new("SELECT id, buckets, loaded_at FROM items WHERE id IN (");
    let mut ids = look.separated(", ");
    for (id, _) in chunk {
        ids.push_bind(id.get());
    }
    look.push(") ORDER BY id FOR UPDATE");
    let existing: Vec<(u64, u8, Option<DateTime<Utc>>)> =
        mysql_timed(look.build_query_as().fetch_all(&mut *tx)).await?;
    let existing: std::collections::HashMap<u64, (u8, bool)> = existing
        .into_iter()
        .map(|(id, buckets, loaded_at)| (id, (buckets, loaded_at.is_some())))
        .collect();
    // Orders of items whose buckets would change: their records live in those buckets.
    let regrouped: Vec<ItemId> = chunk
        .iter()
        .filter(|(id, draft)| {
            existing
                .get(&id.get())
                .is_some_and(|(buckets, _)| *buckets != draft.buckets)
        })
        .map(|(id, _)| *id)
        .collect();
    let with_orders: HashSet<ItemId> =
        crate::orders::repo::items_having_orders(&mut *tx, &regrouped)
            .await?
            .into_iter()
            .collect();

    let outcomes: Vec<(ItemId, Upserted)> = chunk
        .iter()
        .map(|(id, draft)| {
            let outcome = match existing.get(&id.get()) {
                Some((buckets, loaded))
                    if *buckets != draft.buckets
                        && (*loaded || kept.contains(id) || with_orders.contains(id)) =>
                {
                    Upserted::BucketsFixed { buckets: *buckets }
                }
                Some(_) => Upserted::Updated,
                None => Upserted::Created,
            };
            (*id, outcome)
        })
        .collect();
    let writes: Vec<&(ItemId, ItemDraft)> = chunk
        .iter()
        .zip(&outcomes)
        .filter(|(_, (_, outcome))| !matches!(outcome, Upserted::BucketsFixed { .. }))
        .map(|(entry, _)| *entry)
        .collect();
    if !writes.is_empty() {
        mysql_timed(upsert_items(&writes).build().execute(&mut *tx)).await?;
    }
    mysql_timed(tx.commit()).await?;
    Ok(outcomes)
}

/// One multi-row upsert of these items.
fn upsert_items(writes: &[&(ItemId, ItemDraft)]) -> QueryBuilder<sqlx::MySql> {
    let mut insert = QueryBuilder::new(
        "INSERT INTO items (id, shop_id, name, total, price_cents, start_at, end_at, pay_timeout_s, buckets, per_user, release_plan, draw_at, draw_seed, queue_plan, queue_seed) ",
    );
    insert.push_values(writes, |mut row, (id, draft)| {
        row.push_bind(id.get())
            .push_bind(draft.shop_id)
            .push_bind(&draft.name)
            .push_bind(draft.total)
            .push_bind(draft.price_cents)
            .push_bind(draft.start_at)
            .push_bind(draft.end_at)
            .push_bind(draft.pay_timeout_s)
            .push_bind(draft.buckets)
            .push_bind(draft.per_user)
            .push_bind(draft.release.to_column())
            .push_bind(draft.draw_at)
            .push_bind(&draft.draw_seed)
            .push_bind(draft.queue.to_column())
            .push_bind(&draft.queue_seed);
    });
    insert.push(
        " ON DUPLICATE KEY UPDATE
           -- First, while end_at and pay_timeout_s still hold the old values: a sale
           -- whose end moved is reconciled again at its new end.
           reconciled_at = IF(end_at <=> VALUES(end_at) AND pay_timeout_s <=> VALUES(pay_timeout_s),
                              reconciled_at, NULL),
           shop_id = VALUES(shop_id), name = VALUES(name),
           total = VALUES(total), price_cents = VALUES(price_cents),
           start_at = VALUES(start_at), end_at = VALUES(end_at),
           pay_timeout_s = VALUES(pay_timeout_s), buckets = VALUES(buckets),
           per_user = VALUES(per_user), release_plan = VALUES(release_plan),
           draw_at = VALUES(draw_at), draw_seed = COALESCE(draw_seed, VALUES(draw_seed)),
           queue_plan = VALUES(queue_plan),
           queue_seed = COALESCE(queue_seed, VALUES(queue_seed))",
    );
    insert
}

/// Items with a waiting room whose sale has not ended more than `ended_within` ago and
/// is not retired: what the admission pass steps.
pub async fn queued(db: &Db, ended_within: std::time::Duration) -> Result<Vec<Item>, DbError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM items
          WHERE queue_plan IS NOT NULL AND retired_at IS NULL
            AND end_at > UTC_TIMESTAMP(3) - INTERVAL ? SECOND"
    );
    mysql_timed(
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(ended_within.as_secs())
            .fetch_all(db),
    )
    .await
}

/// Which of these items are retired (their sale's state gone from Redis, or going).
pub async fn retired_among(db: &Db, ids: &[ItemId]) -> Result<Vec<ItemId>, DbError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut query =
        QueryBuilder::new("SELECT id FROM items WHERE retired_at IS NOT NULL AND id IN (");
    let mut list = query.separated(", ");
    for id in ids {
        list.push_bind(id.get());
    }
    query.push(")");
    let ids: Vec<u64> = mysql_timed(query.build_query_scalar().fetch_all(db)).await?;
    Ok(ids.into_iter().filter_map(ItemId::new).collect())
}

/// Returns false when there is no such item. A pause keeps the moment it began (a
/// repeated pause does not move it); a resume clears it.
pub async fn set_paused(db: &Db, id: ItemId, paused: bool) -> Result<bool, DbError> {
    let found = mysql_timed(
        sqlx::query("SELECT 1 FROM items WHERE id = ?")
            .bind(id.get())
            .fetch_optional(db),
    )
    .await?;
    if found.is_none() {
        return Ok(false);
    }
    mysql_timed(
        sqlx::query(
            "UPDATE items SET
               paused_at = IF(?, IF(paused, COALESCE(paused_at, UTC_TIMESTAMP(3)), UTC_TIMESTAMP(3)), NULL),
               paused = ?
             WHERE id = ?",
        )
        .bind(paused)
        .bind(paused)
        .bind(id.get())
        .execute(db),
    )
    .await?;
    Ok(true)
}

/// What a warm-up needs to know beyond the definition: since when no purchase can have
/// won, and whether any order of the item ever reached MySQL.
#[derive(Clone, Copy, Debug)]
pub struct SaleHistory {
    /// When the current pause began (`None`: not paused, or paused before this was kept).
    pub paused_at: Option<DateTime<Utc>>,
    /// The record's last change (a moved window, a pause).
    pub updated_at: DateTime<Utc>,
    pub has_orders: bool,
}

pub async fn history(db: &Db, id: ItemId) -> Result<SaleHistory, DbError> {
    let (paused_at, updated_at, has_orders): (Option<DateTime<Utc>>, DateTime<Utc>, bool) =
        mysql_timed(
            sqlx::query_as(
                "SELECT paused_at, updated_at,
                        EXISTS (SELECT 1 FROM orders WHERE orders.item_id = items.id)
                 FROM items WHERE id = ?",
            )
            .bind(id.get())
            .fetch_one(db),
        )
        .await?;
    Ok(SaleHistory {
        paused_at,
        updated_at,
        has_orders,
    })
}

/// Records that a warm-up loaded these items (without counting as a change of their
/// records), in one statement. An item retired before is a live sale again.
pub async fn mark_loaded(db: &Db, ids: &[ItemId]) -> Result<(), DbError> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut query = QueryBuilder::new(
        "UPDATE items SET loaded_at = UTC_TIMESTAMP(3),
                retired_at = NULL, unsold = NULL, redis_cleared_at = NULL,
                updated_at = IF(retired_at IS NULL, updated_at, UTC_TIMESTAMP(3))
          WHERE id IN (",
    );
    let mut list = query.separated(", ");
    for id in ids {
        list.push_bind(id.get());
    }
    query.push(")");
    mysql_timed(query.build().execute(db)).await?;
    Ok(())
}

/// Items loaded into Redis and not yet reconciled after their sale: those whose buckets
/// the items index must list (the safety sweep puts back any it lost).
pub async fn loaded_and_open(db: &Db) -> Result<Vec<(ItemId, u8)>, DbError> {
    let rows: Vec<(u64, u8)> = mysql_timed(
        sqlx::query_as(
            "SELECT id, buckets FROM items WHERE loaded_at IS NOT NULL AND reconciled_at IS NULL",
        )
        .fetch_all(db),
    )
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(id, buckets)| Some((ItemId::new(id)?, buckets)))
        .collect())
}

/// Items whose sale ended at least their pay timeout ago and that were not reconciled yet.
pub async fn due_for_reconcile(db: &Db) -> Result<Vec<ItemId>, DbError> {
    let ids: Vec<u64> = mysql_timed(
        sqlx::query_scalar(
            "SELECT id FROM items
             WHERE reconciled_at IS NULL AND end_at <= UTC_TIMESTAMP(3)
               AND end_at + INTERVAL pay_timeout_s SECOND <= UTC_TIMESTAMP(3)",
        )
        .fetch_all(db),
    )
    .await?;
    Ok(ids.into_iter().filter_map(ItemId::new).collect())
}

pub async fn mark_reconciled(db: &Db, id: ItemId) -> Result<(), DbError> {
    mysql_timed(
        sqlx::query("UPDATE items SET reconciled_at = UTC_TIMESTAMP(3) WHERE id = ?")
            .bind(id.get())
            .execute(db),
    )
    .await?;
    Ok(())
}

/// When an item's Redis state is to go: reconciled at least `retention` (the bound
/// number of seconds) ago and not retired yet, or retired with some of its state not yet
/// cleared (a retirement cut off halfway).
const DUE_FOR_RETIREMENT: &str = "redis_cleared_at IS NULL AND reconciled_at IS NOT NULL
     AND (retired_at IS NOT NULL OR reconciled_at <= UTC_TIMESTAMP(3) - INTERVAL ? SECOND)";

/// Items whose Redis state is to go (at most `limit`), longest reconciled first.
pub async fn due_for_retirement(
    db: &Db,
    retention: std::time::Duration,
    limit: u32,
) -> Result<Vec<ItemId>, DbError> {
    let sql =
        format!("SELECT id FROM items WHERE {DUE_FOR_RETIREMENT} ORDER BY reconciled_at LIMIT ?");
    let ids: Vec<u64> = mysql_timed(
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(retention.as_secs())
            .bind(limit)
            .fetch_all(db),
    )
    .await?;
    Ok(ids.into_iter().filter_map(ItemId::new).collect())
}

/// The item, if its row says now that its Redis state is to go (see
/// [`due_for_retirement`]).
pub async fn due_to_retire(
    db: &Db,
    id: ItemId,
    retention: std::time::Duration,
) -> Result<Option<Item>, DbError> {
    let sql = format!("SELECT {COLUMNS} FROM items WHERE id = ? AND {DUE_FOR_RETIREMENT}");
    mysql_timed(
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(id.get())
            .bind(retention.as_secs())
            .fetch_optional(db),
    )
    .await
}

/// Records how far a draw got: every entry ranked at or below `cutoff` was given a unit.
/// `complete`: the first round is done (units or entries ran out), so the seed goes
/// public. Counts as a change of the item, so every catalogue learns it.
pub async fn record_draw(
    db: &Db,
    id: ItemId,
    cutoff: Option<u64>,
    complete: bool,
) -> Result<(), DbError> {
    mysql_timed(
        sqlx::query(
            "UPDATE items SET draw_cutoff = IF(? IS NULL, draw_cutoff, GREATEST(COALESCE(draw_cutoff, 0), ?)),
                    drawn_at = IF(?, COALESCE(drawn_at, UTC_TIMESTAMP(3)), drawn_at)
              WHERE id = ?",
        )
        .bind(cutoff)
        .bind(cutoff)
        .bind(complete)
        .bind(id.get())
        .execute(db),
    )
    .await?;
    Ok(())
}

/// Records that the sale is retired, with the units it left unsold: from now on its
/// Redis state is not read. Only while the row still says what `item` (read under the
/// retirement's locks) said: not retired, not cleared, reconciled at least `retention`
/// ago, loaded when it was. `false`: it no longer does — a `PUT` moved the sale's end
/// (which resets its reconciliation), a warm-up loaded it again, another scheduler retired
/// it — and nothing was recorded. Counts as a change of the item, so every catalogue
/// learns it.
pub async fn mark_retired(
    db: &Db,
    item: &Item,
    unsold: u32,
    retention: std::time::Duration,
) -> Result<bool, DbError> {
    let done = mysql_timed(
        sqlx::query(
            "UPDATE items SET retired_at = UTC_TIMESTAMP(3), unsold = ?
              WHERE id = ? AND retired_at IS NULL AND redis_cleared_at IS NULL
                AND reconciled_at <= UTC_TIMESTAMP(3) - INTERVAL ? SECOND
                AND loaded_at <=> ?",
        )
        .bind(unsold)
        .bind(item.id.get())
        .bind(retention.as_secs())
        .bind(item.loaded_at)
        .execute(db),
    )
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Records that nothing of the retired sale is left in Redis.
pub async fn mark_cleared(db: &Db, id: ItemId) -> Result<(), DbError> {
    mysql_timed(
        sqlx::query(
            "UPDATE items SET redis_cleared_at = UTC_TIMESTAMP(3), updated_at = updated_at
              WHERE id = ? AND retired_at IS NOT NULL",
        )
        .bind(id.get())
        .execute(db),
    )
    .await?;
    Ok(())
}
