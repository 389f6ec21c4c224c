//! An item's live stock in Redis, as operators and the catalogue read it.

use chrono::{DateTime, Utc};

use crate::domain::BucketId;
use crate::keys::{ItemKeys, Keys};
use crate::lua::{RULES_SET, RULES_SET_CODE, WAVES_RAISE};
use crate::store::{Grouped, RedisConns, RedisError, redis_timed};
use crate::telemetry::ItemLevels;

use super::repo::{Item, ItemDraft};
use super::transfer::on_their_way;
use super::waves::{Holds, Waves};

/// The Redis side of an item at one instant (read in one MULTI).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StockSnapshot {
    pub loaded: bool,
    /// When the units were loaded (ms since the epoch), by the warm-up's own clock.
    pub loaded_at_ms: Option<i64>,
    /// Units on sale: listed, or on their way to another bucket ([`Self::moving`]).
    pub remaining: u64,
    /// Units lent to another bucket that have not arrived there, counted in `remaining`:
    /// on no list until the transfer is settled (`src/items/transfer.rs`).
    pub moving: u64,
    /// Units sold and not given back.
    pub sold: u64,
    /// Won units whose order is not in MySQL yet.
    pub pending: u64,
    /// Held back by a warm-up replacing the units (`fenced`), or left so by one that was
    /// cut off: nothing sells until a warm-up completes.
    pub reloading: bool,
}

/// A sale retired from Redis, as MySQL recorded it (`None`: not retired): the units it
/// left unsold, and `held` (the orders paid or unpaid) as sold.
pub fn retired(item: &Item, held: u64) -> Option<StockSnapshot> {
    item.retired_at?;
    Some(StockSnapshot {
        loaded: false,
        loaded_at_ms: None,
        remaining: u64::from(item.unsold.unwrap_or(0)),
        moving: 0,
        sold: held,
        pending: 0,
        reloading: false,
    })
}

/// One bucket, and its loans (transfer id → `home|unit|ms`), which [`bucket_snapshots`]
/// counts: its `remaining` here is the units listed.
///
/// What is sold is the bucket's `total` (its units, sold or on sale; a loan moves one
/// from the lender's to the receiver's) less the units listed: every sale takes a unit
/// off the list and every release puts one back, so no script counts sales apart — a
/// counter would cost each won grab a write (issue 26).
async fn snapshot<C>(
    conn: &mut C,
    keys: &ItemKeys,
) -> Result<(StockSnapshot, Vec<(String, String)>), RedisError>
where
    C: redis::aio::ConnectionLike + Send,
{
    type Read = (
        (Option<i64>, Option<u64>, Option<String>),
        u64,
        Vec<(String, String)>,
        u64,
    );
    let ((loaded, total, fenced), listed, loans, pending): Read = redis_timed(
        redis::pipe()
            .atomic()
            .cmd("HMGET")
            .arg(&keys.meta)
            .arg("loaded")
            .arg("total")
            .arg("fenced")
            .llen(&keys.tokens)
            .hgetall(&keys.lent)
            .hlen(&keys.pending)
            .query_async(conn),
    )
    .await?;
    let snapshot = StockSnapshot {
        loaded: loaded.is_some(),
        loaded_at_ms: loaded,
        remaining: listed,
        moving: 0,
        sold: total.map_or(0, |total| total.saturating_sub(listed)),
        pending,
        reloading: fenced.is_some(),
    };
    Ok((snapshot, loans))
}

/// A whole item over its buckets, summed: `loaded` only when every bucket is (a bucket
/// whose master lost its data makes the item one to rebuild), `loaded_at_ms` the earliest.
/// Each bucket is read at its own instant. A unit lent between two buckets counts in its
/// lender's loans until the home bucket decides the transfer `in`, on the home list from
/// then: once, in whatever state a transfer was cut off (a read while a purchase moves
/// the unit may still find it on both sides, or neither).
pub async fn item_snapshot<C>(
    conn: &mut C,
    keys: &Keys,
    stocks: impl Iterator<Item = BucketId>,
) -> Result<StockSnapshot, RedisError>
where
    C: redis::aio::ConnectionLike + Send,
{
    Ok(sum(&bucket_snapshots(conn, keys, stocks).await?))
}

/// Each bucket, in the order given.
pub async fn bucket_snapshots<C>(
    conn: &mut C,
    keys: &Keys,
    stocks: impl Iterator<Item = BucketId>,
) -> Result<Vec<StockSnapshot>, RedisError>
where
    C: redis::aio::ConnectionLike + Send,
{
    let mut each = Vec::new();
    for stock in stocks {
        let (mut one, loans) = snapshot(conn, &keys.bucket(stock)).await?;
        one.moving = on_their_way(conn, keys, stock, &loans).await?;
        one.remaining += one.moving;
        each.push(one);
    }
    Ok(each)
}

/// Buckets' snapshots as one item's ([`item_snapshot`]).
pub fn sum(buckets: &[StockSnapshot]) -> StockSnapshot {
    let mut sum = StockSnapshot {
        loaded: true,
        loaded_at_ms: None,
        remaining: 0,
        moving: 0,
        sold: 0,
        pending: 0,
        reloading: false,
    };
    for one in buckets {
        sum.loaded &= one.loaded;
        sum.loaded_at_ms = match (sum.loaded_at_ms, one.loaded_at_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        sum.remaining += one.remaining;
        sum.moving += one.moving;
        sum.sold += one.sold;
        sum.pending += one.pending;
        sum.reloading |= one.reloading;
    }
    if !sum.loaded {
        sum.loaded_at_ms = None;
    }
    sum
}

/// Asks, in `pipe`, whether a bucket holds anything in Redis: a load (`loaded`) or a
/// reload's fence in its meta, units, pending orders, an outbox, loans, deadlines or buyer
/// records. (A sale window or pause copied to the meta is nothing.) Two answers, which
/// [`holds`] reads.
pub fn ask_held(pipe: &mut redis::Pipeline, keys: &ItemKeys) {
    pipe.cmd("HMGET")
        .arg(&keys.meta)
        .arg("loaded")
        .arg("fenced")
        .cmd("EXISTS")
        .arg(&keys.tokens)
        .arg(&keys.pending)
        .arg(&keys.outbox)
        .arg(&keys.lent)
        .arg(&keys.due)
        .arg(keys.buyer_order_shards());
}

/// [`ask_held`]'s first answer: the meta's `loaded` and `fenced`.
pub type Marks = (Option<String>, Option<String>);

/// [`ask_held`]'s answers: the meta's marks, and how many of the keys exist.
pub fn holds((loaded, fenced): &Marks, keys: u64) -> bool {
    loaded.is_some() || fenced.is_some() || keys > 0
}

/// What the catalogue refresh reads of each item.
#[derive(Clone, Copy, Debug, Default)]
pub struct LiveState {
    pub loaded: bool,
    pub levels: ItemLevels,
}

/// The live state of many buckets (one round trip on one server), for the catalogue
/// refresh.
pub async fn live_states<'a>(
    redis: &RedisConns,
    items: impl Iterator<Item = &'a ItemKeys>,
) -> Result<Vec<LiveState>, RedisError> {
    let mut grouped = Grouped::new(redis);
    for keys in items {
        grouped
            .group()
            .hexists(&keys.meta, "loaded")
            .llen(&keys.tokens)
            .hlen(&keys.lent)
            .zcard(&keys.outbox)
            .hlen(&keys.pending)
            .zcard(&keys.due);
    }
    let states: Vec<(bool, u64, u64, u64, u64, u64)> = grouped.query(redis).await?;
    Ok(states
        .into_iter()
        .map(
            |(loaded, listed, lent, outbox, pending, delayed)| LiveState {
                loaded,
                levels: ItemLevels {
                    remaining: listed + lent,
                    outbox,
                    pending,
                    delayed,
                },
            },
        )
        .collect())
}

/// Copies what `grab.lua` checks from the MySQL record into a bucket's meta hash after a
/// write of the item: the sale window, the per-user limit, the bucket's share of the waves
/// and a draw's time — not the pause, which only a pause or a resume writes
/// ([`sync_paused`]): one landing between this write's read of the record and its write
/// here would be undone. Harmless before a warm-up (`grab.lua` first checks `loaded`).
pub async fn sync_rules<C>(conn: &mut C, keys: &ItemKeys, item: &Item) -> Result<(), RedisError>
where
    C: redis::aio::ConnectionLike + Send + Sync,
{
    set_meta(conn, keys, &Rules::of(item).meta(keys.bucket.index)).await
}

/// Writes a bucket's pause flag alone (a pause or a resume): the other rules in its meta
/// may be a write's under way that MySQL does not hold yet — a wave raised and held back
/// in Redis before its record is written (`super::write`) — and the record's would undo it.
pub async fn sync_paused<C>(conn: &mut C, keys: &ItemKeys, paused: bool) -> Result<(), RedisError>
where
    C: redis::aio::ConnectionLike + Send + Sync,
{
    set_meta(conn, keys, &[("paused", i64::from(paused).to_string())]).await
}

/// Writes `fields` of a bucket's meta and packs what `grab.lua` checks of it
/// (`lua/rules_set.lua`).
async fn set_meta<C>(
    conn: &mut C,
    keys: &ItemKeys,
    fields: &[(&str, String)],
) -> Result<(), RedisError>
where
    C: redis::aio::ConnectionLike + Send + Sync,
{
    let mut call = RULES_SET.key(&keys.meta);
    for (field, value) in fields {
        call.arg(*field).arg(value);
    }
    redis_timed(call.invoke_async::<()>(conn)).await
}

/// What [`raise_waves`] did in a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Raised {
    /// Written (or nothing to write: the bucket sells nothing).
    Written,
    /// Nothing written: the new field would hold `held` units back now, and the bucket's
    /// list has only `listed`.
    Short { held: u64, listed: u64 },
}

/// Writes a bucket's `waves` (`holds`, holding at least as much back at every instant as
/// the field it replaces) only if its listed units cover what it holds back now, in one
/// step (`lua/waves_raise.lua`).
pub async fn raise_waves<C>(
    conn: &mut C,
    keys: &ItemKeys,
    holds: &Holds,
) -> Result<Raised, RedisError>
where
    C: redis::aio::ConnectionLike + Send + Sync,
{
    let answer: Vec<u64> = redis_timed(
        WAVES_RAISE
            .key(&keys.meta)
            .key(&keys.tokens)
            .arg(holds.to_string())
            .invoke_async(conn),
    )
    .await?;
    match answer[..] {
        [1] => Ok(Raised::Written),
        [0, held, listed] => Ok(Raised::Short { held, listed }),
        _ => Err(RedisError::Unexpected(format!(
            "waves_raise.lua answered {answer:?}"
        ))),
    }
}

/// The same for a draft, into a pipeline (a bulk `PUT` of items that exist; the pause is
/// not the draft's to change). Load [`RULES_SET`] on the connection first
/// ([`load_rules_set`]).
pub fn sync_draft_in(pipe: &mut redis::Pipeline, keys: &ItemKeys, draft: &ItemDraft) {
    set_meta_in(pipe, keys, &Rules::of_draft(draft).meta(keys.bucket.index));
}

/// Writes `fields` of a bucket's meta and packs what `grab.lua` checks of it, into a
/// pipeline (`lua/rules_set.lua`; no fields: only packs again). A plain `HSET` of a field
/// `grab.lua` checks would leave its packed copy stale. Load [`RULES_SET`] on the
/// connection first ([`load_rules_set`]).
pub fn set_meta_in(pipe: &mut redis::Pipeline, keys: &ItemKeys, fields: &[(&str, String)]) {
    pipe.cmd("EVALSHA")
        .arg(RULES_SET.get_hash())
        .arg(1)
        .arg(&keys.meta);
    for (field, value) in fields {
        pipe.arg(*field).arg(value);
    }
    pipe.ignore();
}

/// Loads `lua/rules_set.lua` into Redis's script cache (on every master of a cluster), for
/// pipelines of [`set_meta_in`]: a Redis that restarted has forgotten it.
pub async fn load_rules_set(redis: &RedisConns) -> Result<(), RedisError> {
    redis.load_script(RULES_SET_CODE).await
}

/// What the scripts check of an item, but the pause (see `lua/grab.lua`).
pub struct Rules<'a> {
    start_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
    per_user: u8,
    waves: &'a Waves,
    draw_at: Option<DateTime<Utc>>,
    buckets: u8,
}

impl<'a> Rules<'a> {
    pub fn of(item: &'a Item) -> Self {
        Self {
            start_at: item.start_at,
            end_at: item.end_at,
            per_user: item.per_user,
            waves: &item.release,
            draw_at: item.draw_at,
            buckets: item.buckets,
        }
    }

    fn of_draft(draft: &'a ItemDraft) -> Self {
        Self {
            start_at: draft.start_at,
            end_at: draft.end_at,
            per_user: draft.per_user,
            waves: &draft.release,
            draw_at: draft.draw_at,
            buckets: draft.buckets,
        }
    }

    /// One bucket's meta fields (an empty `waves` or `draw_ms`: none).
    pub fn meta(&self, bucket: u8) -> Vec<(&'static str, String)> {
        vec![
            ("start_ms", self.start_at.timestamp_millis().to_string()),
            ("end_ms", self.end_at.timestamp_millis().to_string()),
            ("per_user", self.per_user.to_string()),
            ("waves", self.waves.meta_field(self.buckets, bucket)),
            (
                "draw_ms",
                self.draw_at
                    .map(|at| at.timestamp_millis().to_string())
                    .unwrap_or_default(),
            ),
        ]
    }
}
