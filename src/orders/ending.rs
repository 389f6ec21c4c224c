//! Ending orders — by their owner, at their pay deadline, at the end of a sale — and giving
//! their units back to the sale.
//!
//! First the cancel is recorded as begun (the item's `ending` set in Redis, timed by
//! Redis's clock), then MySQL decides (a conditional `UPDATE … WHERE status = 'unpaid'`),
//! then `release.lua` returns the unit and clears the record. The release is idempotent
//! and keyed on the buyer record, so it is safe to run again for any cancelled order: a
//! request cut off between MySQL and Redis, or a process that died there, leaves its
//! record behind, and the scheduler's [`finish_cut_off`] sweep returns the unit within
//! seconds — rather than at the order's deadline or the end of the sale. A record whose
//! order is still unpaid stays (its `UPDATE` may yet commit, late) and is looked at again.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use crate::domain::{BucketId, OrderSn, UserId};
use crate::items::catalog;
use crate::keys::Keys;
use crate::lua::{ENDING_BEGIN, ENDING_DUE, ENDING_KEEP, FORGET, RELEASE};
use crate::marks::{self, Work};
use crate::store::{Db, RedisConns, RedisError, StoreError, redis_timed};

use super::repo::{self, CancelReason, OrderRow, OrderStatus};

/// Orders per `release.lua` call (each brings two keys and two arguments).
const RELEASE_CHUNK: usize = 500;

/// An order whose unit should go back: who held it and its number.
#[derive(Clone, Debug)]
pub struct Held {
    /// The bucket holding the order's records.
    pub bucket: BucketId,
    pub user: UserId,
    pub order_sn: String,
}

impl From<&OrderRow> for Held {
    fn from(row: &OrderRow) -> Self {
        Self {
            bucket: row.order_sn.bucket(),
            user: row.user(),
            order_sn: row.order_sn.to_string(),
        }
    }
}

/// Gives the units of these ended orders back (those whose buyer record still names them),
/// then tells every instance about each item that got units back, so "sold out" clears
/// everywhere. Returns the order numbers whose unit came back.
pub async fn release(
    redis: &RedisConns,
    keys: &Keys,
    orders: &[Held],
) -> Result<Vec<String>, RedisError> {
    let mut by_bucket: BTreeMap<BucketId, Vec<&Held>> = BTreeMap::new();
    for order in orders {
        by_bucket.entry(order.bucket).or_default().push(order);
    }
    let mut released = Vec::new();
    let mut back_items = BTreeSet::new();
    let mut conn = redis.bulk().await?;
    for (bucket, orders) in by_bucket {
        let item_keys = keys.bucket(bucket);
        let before = released.len();
        for chunk in orders.chunks(RELEASE_CHUNK) {
            let mut call = RELEASE.key(&item_keys.meta);
            call.key(&item_keys.tokens).key(keys.ending(bucket));
            for order in chunk {
                call.key(item_keys.buyer_orders(order.user))
                    .arg(order.user.get())
                    .arg(&order.order_sn);
            }
            let back: Vec<String> = redis_timed(call.invoke_async(&mut conn)).await?;
            released.extend(back);
        }
        if released.len() > before {
            tracing::info!(%bucket, units = released.len() - before, "units back on sale");
            back_items.insert(bucket.item);
        }
    }
    for item in back_items {
        if let Err(e) = catalog::announce_change(&mut conn, keys, item).await {
            tracing::warn!(%item, error = %e, "could not announce returned units; instances see them within a second anyway");
        }
    }
    Ok(released)
}

/// Gives back the units of those of these orders that MySQL has holding none — read with
/// their rows locked, and given back before the locks go: a late payment reviving an order
/// takes its unit while holding the row's lock and before MySQL says `paid`, so a plain
/// read would see `cancelled` and give that unit back a second time; and a cancel's own
/// `ending` record does not protect its release, since a repeated cancel may release the
/// unit first (removing the record) and a late payment revive the order before it. Every
/// release of a cancel goes through here. Returns the order numbers whose unit came back.
pub async fn release_if_ended(
    db: &Db,
    redis: &RedisConns,
    keys: &Keys,
    orders: &[Held],
) -> Result<Vec<String>, StoreError> {
    if orders.is_empty() {
        return Ok(Vec::new());
    }
    let sns: Vec<&str> = orders.iter().map(|o| o.order_sn.as_str()).collect();
    let mut tx = crate::store::mysql_begin(db).await?;
    let ended: HashSet<String> = repo::lock_many(&mut tx, &sns, repo::Wait::Yes)
        .await?
        .into_iter()
        .filter(|row| !row.status.holds_unit())
        .map(|row| row.order_sn.to_string())
        .collect();
    let ended: Vec<Held> = orders
        .iter()
        .filter(|o| ended.contains(&o.order_sn))
        .cloned()
        .collect();
    let back = release(redis, keys, &ended).await?;
    crate::store::mysql_timed(tx.commit()).await?;
    Ok(back)
}

/// What [`cancel_overdue`] did.
#[derive(Debug, Default)]
pub struct Cancelled {
    /// Orders this call moved from `unpaid` to `cancelled`.
    pub cancelled: u64,
    /// Units that came back (including those of orders cancelled earlier whose release
    /// had not happened).
    pub released: u64,
    /// Orders still unpaid: paid in the meantime is not among them, but a deadline not yet
    /// passed by MySQL's clock is (try again shortly).
    pub still_unpaid: Vec<String>,
    /// Order numbers MySQL does not have.
    pub missing: Vec<String>,
}

/// When each bucket recorded the cancels begun, by its Redis server's clock (ms).
#[derive(Debug, Default)]
pub struct Begun(BTreeMap<BucketId, i64>);

impl Begun {
    /// A change of one bucket's orders recorded in its `ending` at `ms` by another script
    /// (`lua/revive.lua`).
    pub fn at(bucket: BucketId, ms: i64) -> Self {
        Self(BTreeMap::from([(bucket, ms)]))
    }
}

/// Records that these orders are about to be cancelled, before MySQL is asked: if the
/// caller is cut off after MySQL said yes, [`finish_cut_off`] returns their units.
pub async fn begin(redis: &RedisConns, keys: &Keys, sns: &[&OrderSn]) -> Result<Begun, RedisError> {
    let mut by_bucket: BTreeMap<BucketId, Vec<&str>> = BTreeMap::new();
    for sn in sns {
        by_bucket.entry(sn.bucket()).or_default().push(sn.as_str());
    }
    let mut begun = Begun::default();
    if by_bucket.is_empty() {
        return Ok(begun);
    }
    let mut conn = redis.bulk().await?;
    for (bucket, members) in &by_bucket {
        let at: i64 = redis_timed(
            ENDING_BEGIN
                .key(keys.ending(*bucket))
                .arg(members)
                .invoke_async(&mut conn),
        )
        .await?;
        begun.0.insert(*bucket, at);
    }
    marks::mark(&mut conn, keys, Work::CutOff, by_bucket.into_keys()).await?;
    Ok(begun)
}

/// These cancels ended without a unit to return (the order was paid, still unpaid, or
/// unknown): their records go — unless written again since `begun` (another cancel of
/// the same order, under way).
pub async fn abandon(
    redis: &RedisConns,
    keys: &Keys,
    sns: &[&str],
    begun: &Begun,
) -> Result<(), RedisError> {
    let mut by_bucket: BTreeMap<BucketId, Vec<&str>> = BTreeMap::new();
    for sn in sns {
        if let Some(parsed) = OrderSn::parse(sn) {
            by_bucket.entry(parsed.bucket()).or_default().push(sn);
        }
    }
    for (bucket, sns) in by_bucket {
        if let Some(at) = begun.0.get(&bucket) {
            forget(redis, keys, bucket, *at, &sns).await?;
        }
    }
    Ok(())
}

/// Cancels those of these orders that are unpaid past their deadline, then gives back the
/// unit of every one of them that is cancelled now.
pub async fn cancel_overdue(
    db: &Db,
    redis: &RedisConns,
    keys: &Keys,
    sns: &[&str],
    reason: CancelReason,
) -> Result<Cancelled, StoreError> {
    let parsed: Vec<OrderSn> = sns.iter().filter_map(|sn| OrderSn::parse(sn)).collect();
    let begun = begin(redis, keys, &parsed.iter().collect::<Vec<_>>()).await?;
    let cancelled = repo::set_overdue_cancelled(db, sns, reason).await?;
    let rows = repo::find_many(db, sns).await?;
    let mut outcome = Cancelled {
        cancelled,
        ..Default::default()
    };
    let found: HashSet<&str> = rows.iter().map(|r| r.order_sn.as_str()).collect();
    outcome.missing = sns
        .iter()
        .filter(|sn| !found.contains(**sn))
        .map(|sn| (*sn).to_owned())
        .collect();
    let mut ended = Vec::new();
    let mut moot: Vec<&str> = outcome.missing.iter().map(String::as_str).collect();
    for row in &rows {
        match row.status {
            OrderStatus::Unpaid => {
                outcome.still_unpaid.push(row.order_sn.to_string());
                moot.push(row.order_sn.as_str());
            }
            OrderStatus::Paid => moot.push(row.order_sn.as_str()),
            // Cancelled, or its payment owed back or returned: its unit goes back.
            OrderStatus::Cancelled | OrderStatus::RefundDue | OrderStatus::Refunded => {
                ended.push(Held::from(row))
            }
        }
    }
    // Under the rows' locks: a repeated cancel may have given a unit back already, and a
    // late payment taken one again since (`release_if_ended`).
    outcome.released = release_if_ended(db, redis, keys, &ended).await?.len() as u64;
    abandon(redis, keys, &moot, &begun).await?;
    Ok(outcome)
}

/// A cancel begun this long ago (by Redis's clock) has finished or was cut off: its
/// request's budget and a scheduler's store calls are long over.
pub const CUT_OFF_AFTER: Duration = Duration::from_secs(5);
/// Records looked at per bucket and sweep.
const SWEEP_BATCH: usize = 500;

/// Finishes cancels of these buckets that were cut off between MySQL and Redis: for every
/// record older than [`CUT_OFF_AFTER`], an order MySQL has cancelled gets its unit back,
/// one still unpaid is looked at again later, any other record is dropped. Returns how
/// many units came back.
pub async fn finish_cut_off(
    db: &Db,
    redis: &RedisConns,
    keys: &Keys,
    buckets: &[BucketId],
) -> Result<u64, StoreError> {
    let mut released = 0;
    for bucket in buckets {
        let mut due: Vec<String> = {
            let mut conn = redis.bulk().await?;
            redis_timed(
                ENDING_DUE
                    .key(keys.ending(*bucket))
                    .arg(CUT_OFF_AFTER.as_millis() as u64)
                    .arg(SWEEP_BATCH)
                    .invoke_async(&mut conn),
            )
            .await?
        };
        let cutoff = match due.first().map(|c| c.parse::<i64>()) {
            Some(Ok(cutoff)) => cutoff,
            _ => continue,
        };
        let sns = due.split_off(1);
        if !sns.is_empty() {
            match finish_records(db, redis, keys, *bucket, cutoff, &sns).await {
                Ok(back) => released += back,
                // One bucket's rows busy (or MySQL slow): the others go on.
                Err(e) => {
                    tracing::debug!(%bucket, error = %crate::error::cause_chain(&e), "cut-off records not finished; next pass");
                }
            }
        }
    }
    Ok(released)
}

/// One bucket's cut-off records: units back for those MySQL cancelled, those still unpaid
/// kept for another look, the rest dropped — as MySQL says under the rows' locks, held
/// until Redis has done its part: a payment event holds an order's lock from before its
/// Redis step (a unit taken for a late payment, one going back for a refund) until its
/// commit, so a locked read never sees a change of state that is still on its way.
async fn finish_records(
    db: &Db,
    redis: &RedisConns,
    keys: &Keys,
    bucket: BucketId,
    cutoff: i64,
    sns: &[String],
) -> Result<u64, StoreError> {
    let refs: Vec<&str> = sns.iter().map(String::as_str).collect();
    let mut tx = crate::store::mysql_begin(db).await?;
    // Not waiting for a row a payment or cancel holds: the batch is looked at again next
    // pass, a second later.
    let rows = repo::lock_many(&mut tx, &refs, repo::Wait::No).await?;
    let status: HashMap<&str, OrderStatus> = rows
        .iter()
        .map(|r| (r.order_sn.as_str(), r.status))
        .collect();
    // Cancelled, or its payment owed back or refunded: no unit held.
    let ended: Vec<Held> = rows
        .iter()
        .filter(|r| !r.status.holds_unit())
        .map(Held::from)
        .collect();
    let back = release(redis, keys, &ended).await?.len() as u64;
    if back > 0 {
        tracing::warn!(%bucket, units = back, "finished cancels that were cut off between MySQL and Redis");
    }
    // Unpaid: its cancel may still commit (late), so it is looked at again. Paid or
    // unknown: nothing to return. Either only if not written again since.
    let (unpaid, moot): (Vec<&str>, Vec<&str>) = refs
        .iter()
        .copied()
        .filter(|sn| status.get(sn).is_none_or(|s| s.holds_unit()))
        .partition(|sn| status.get(sn) == Some(&OrderStatus::Unpaid));
    forget(redis, keys, bucket, cutoff, &moot).await?;
    if !unpaid.is_empty() {
        let mut conn = redis.bulk().await?;
        redis_timed(
            ENDING_KEEP
                .key(keys.ending(bucket))
                .arg(cutoff)
                .arg(&unpaid)
                .invoke_async::<i64>(&mut conn),
        )
        .await?;
    }
    crate::store::mysql_timed(tx.commit()).await?;
    Ok(back)
}

/// Drops these records of a bucket's cancels begun, unless written again after `cutoff`.
async fn forget(
    redis: &RedisConns,
    keys: &Keys,
    bucket: BucketId,
    cutoff: i64,
    sns: &[&str],
) -> Result<(), RedisError> {
    if sns.is_empty() {
        return Ok(());
    }
    let mut conn = redis.bulk().await?;
    redis_timed(
        FORGET
            .key(keys.ending(bucket))
            .arg(cutoff)
            .arg(sns)
            .invoke_async::<i64>(&mut conn),
    )
    .await?;
    Ok(())
}
