//! End-of-sale reconciliation: orders MySQL lost are written back from what Redis holds,
//! units held by orders that can no longer be paid come back, buyer records that no live
//! order backs are cleared, and Redis is checked against MySQL
//! (docs/contract.md, invariant 4). It runs by itself once a sale's end plus its pay timeout has
//! passed, and by hand through `POST /admin/items/{id}/reconcile`. It only ends orders
//! that are over and returns units through `release.lua`; a disagreement it cannot explain
//! is reported loudly, never papered over.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use crate::domain::{BucketId, ItemId, OrderPlaced, OrderSn, UserId};
use crate::items::repo::Item;
use crate::items::stock;
use crate::keys::Keys;
use crate::lock::RedisLock;
use crate::orders::ending::{self, Held};
use crate::orders::placed;
use crate::orders::repo::{self, CancelReason, OrderStatus, StatusCounts};
use crate::store::{Db, RedisConns, StoreError, mysql_timed, redis_timed};
use crate::telemetry::Meters;

/// Longest a reconciliation may hold its item's lock (it is released when done).
const LOCK_FOR: Duration = Duration::from_secs(120);
/// Overdue orders cancelled per round.
const BATCH: u32 = 1_000;
/// Orders looked up in MySQL per query.
const LOOKUP_CHUNK: usize = 1_000;
/// A first disagreement is checked again after this long: a cancel between its MySQL
/// update and its release looks like one for an instant.
const RECHECK_AFTER: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("a reconciliation of this item is already running")]
    Busy,
    #[error(transparent)]
    Store(#[from] StoreError),
}

crate::store::from_either_store!(ReconcileError);

/// What a reconciliation did and found.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Report {
    pub item_id: ItemId,
    /// Unpaid orders past their deadline that it cancelled.
    pub cancelled: u64,
    /// Units that came back on sale (from those and from earlier cancels not yet returned).
    pub released: u64,
    /// Buyer records no live order backed, cleared (their units came back too).
    pub stale_buyers: u64,
    /// Orders Redis holds as won, no longer pending, that MySQL had no row of (a failover
    /// to an asynchronous replica that had not received them): written back as `unpaid`
    /// from the buyer record (user, order number, place) and the number's time.
    pub written_back: u64,
    pub total: u64,
    pub remaining: u64,
    pub sold: u64,
    pub pending: u64,
    pub orders: StatusCounts,
    /// Whether the item's units are in Redis (a sale never warmed up has none).
    pub loaded: bool,
    /// remaining + pending + unpaid + paid = total, and `sold` (Redis's `total` less its
    /// listed units) = pending + unpaid + paid;
    /// for an item never loaded: no order holds a unit.
    pub consistent: bool,
}

pub async fn reconcile(
    db: &Db,
    redis: &RedisConns,
    keys: &Keys,
    meters: &Meters,
    item: ItemId,
) -> Result<Report, ReconcileError> {
    let Some(lock) = RedisLock::try_take(redis, keys.reconcile_lock(item), LOCK_FOR).await? else {
        return Err(ReconcileError::Busy);
    };
    let result = run(db, redis, keys, meters, item).await;
    lock.let_go(redis).await;
    result
}

async fn run(
    db: &Db,
    redis: &RedisConns,
    keys: &Keys,
    meters: &Meters,
    item: ItemId,
) -> Result<Report, ReconcileError> {
    let record = crate::items::repo::get(db, item).await?;
    let total = u64::from(record.as_ref().map_or(0, |i| i.total));
    if let Some(record) = record.as_ref().filter(|r| r.retired_at.is_some()) {
        // Retired from Redis: every order was final by then, nothing is left to return.
        return check(db, redis, keys, item, Some(record), &[], total).await;
    }
    // 1. Buyer records, in every bucket, whose order is neither pending nor live in MySQL:
    // written back when MySQL has no row at all, stale when its row is cancelled.
    let buckets: Vec<BucketId> = match &record {
        Some(record) => record.bucket_ids().collect(),
        None => vec![BucketId::whole(item)],
    };
    let (mut stale, mut lost) = (Vec::new(), Vec::new());
    for bucket in &buckets {
        let found = unbacked(db, redis, keys, *bucket).await?;
        stale.extend(found.stale);
        lost.extend(found.lost);
    }
    let written_back = match &record {
        Some(record) => write_back(db, record, &lost).await?,
        None => 0,
    };

    // 2. Unpaid orders past their deadline (those written back among them): cancelled,
    // units back.
    let (mut cancelled, mut released) = (0, 0);
    loop {
        let overdue = repo::overdue_unpaid(db, item, Duration::ZERO, BATCH).await?;
        let sns: Vec<&str> = overdue.iter().map(|o| o.order_sn.as_str()).collect();
        let outcome =
            ending::cancel_overdue(db, redis, keys, &sns, CancelReason::Reconcile).await?;
        cancelled += outcome.cancelled;
        meters.cancelled("reconcile", outcome.cancelled);
        released += outcome.released;
        // Fewer than asked for, or none of them could be cancelled (paid meanwhile).
        if overdue.len() < BATCH as usize || outcome.cancelled == 0 {
            break;
        }
    }

    // 3. Stale buyer records: their units back.
    let stale_buyers = ending::release_if_ended(db, redis, keys, &stale)
        .await?
        .len() as u64;

    // 4. Redis against MySQL, twice before crying wolf.
    let mut report = check(db, redis, keys, item, None, &buckets, total).await?;
    if !report.consistent {
        tokio::time::sleep(RECHECK_AFTER).await;
        report = check(db, redis, keys, item, None, &buckets, total).await?;
    }
    if !report.consistent {
        meters.reconcile_mismatch(item);
        tracing::error!(
            %item,
            total,
            remaining = report.remaining,
            sold = report.sold,
            pending = report.pending,
            unpaid = report.orders.unpaid,
            paid = report.orders.paid,
            "reconciliation: Redis and MySQL disagree on the item's stock; not overwritten, look into it"
        );
    }
    Ok(Report {
        cancelled,
        released,
        stale_buyers,
        written_back,
        ..report
    })
}

/// Redis against MySQL; for a sale `retired` from Redis, what MySQL recorded of it.
async fn check(
    db: &Db,
    redis: &RedisConns,
    keys: &Keys,
    item: ItemId,
    retired: Option<&Item>,
    buckets: &[BucketId],
    total: u64,
) -> Result<Report, ReconcileError> {
    let orders = repo::count_by_status(db, item).await?;
    let snapshot = match retired.and_then(|r| stock::retired(r, orders.unpaid + orders.paid)) {
        Some(snapshot) => snapshot,
        None => {
            let mut conn = redis.bulk().await?;
            stock::item_snapshot(&mut conn, keys, buckets.iter().copied()).await?
        }
    };
    let held = snapshot.pending + orders.unpaid + orders.paid;
    Ok(Report {
        item_id: item,
        cancelled: 0,
        released: 0,
        stale_buyers: 0,
        written_back: 0,
        total,
        remaining: snapshot.remaining,
        sold: snapshot.sold,
        pending: snapshot.pending,
        orders,
        loaded: snapshot.loaded,
        consistent: if snapshot.loaded {
            snapshot.remaining + held == total && snapshot.sold == held
        } else if retired.is_some() {
            snapshot.remaining + held == total
        } else {
            held == 0
        },
    })
}

/// A bucket's buyer records that no live order backs.
struct Unbacked {
    /// Their order's row is cancelled: the unit was never given back.
    stale: Vec<Held>,
    /// MySQL has no row of their order at all.
    lost: Vec<Lost>,
}

/// An order a buyer record holds that MySQL has no row of.
struct Lost {
    user: UserId,
    order_sn: String,
    slot: u8,
}

/// Buyer records (user → their orders) of one bucket naming an order not pending in Redis and not
/// unpaid or paid in MySQL: cancelled with its unit never returned, or lost altogether.
async fn unbacked(
    db: &Db,
    redis: &RedisConns,
    keys: &Keys,
    bucket: BucketId,
) -> Result<Unbacked, ReconcileError> {
    let item_keys = keys.bucket(bucket);
    let mut conn = redis.bulk().await?;
    // Buyer records first, then pending, then MySQL: an order moving from pending to MySQL
    // meanwhile is seen in one of the two (the consumer commits before it clears pending).
    let mut records: Vec<Lost> = Vec::new();
    let mut pipe = redis::pipe();
    for key in item_keys.buyer_order_shards() {
        pipe.hgetall(key);
    }
    let maps: Vec<HashMap<u64, String>> = redis_timed(pipe.query_async(&mut conn)).await?;
    // A record holds the user's orders by place (`lua/lib/places.lua`): each is looked at.
    for (user, record) in maps.into_iter().flatten() {
        records.extend(placed::places_in(&record).map(|(slot, sn)| Lost {
            user: UserId::new(user),
            order_sn: sn.to_owned(),
            slot,
        }));
    }
    if records.is_empty() {
        return Ok(Unbacked {
            stale: Vec::new(),
            lost: Vec::new(),
        });
    }
    let pending: Vec<bool> = {
        let mut pipe = redis::pipe();
        for record in &records {
            pipe.hexists(&item_keys.pending, &record.order_sn);
        }
        redis_timed(pipe.query_async(&mut conn)).await?
    };
    drop(conn);
    let not_pending: Vec<Lost> = records
        .into_iter()
        .zip(&pending)
        .filter(|(_, p)| !**p)
        .map(|(record, _)| record)
        .collect();
    let sns: Vec<&str> = not_pending.iter().map(|r| r.order_sn.as_str()).collect();
    let mut rows = HashMap::new();
    for chunk in sns.chunks(LOOKUP_CHUNK) {
        for row in repo::find_many(db, chunk).await? {
            rows.insert(row.order_sn.to_string(), row.status);
        }
    }
    let (mut stale, mut lost) = (Vec::new(), Vec::new());
    for record in not_pending {
        match rows.get(&record.order_sn) {
            None => lost.push(record),
            Some(status) if !status.holds_unit() => stale.push(Held {
                bucket,
                user: record.user,
                order_sn: record.order_sn,
            }),
            Some(_) => {}
        }
    }
    Ok(Unbacked { stale, lost })
}

/// Writes the `lost` orders back as `unpaid`, won at their number's time with the item's
/// pay timeout; how many were written. Loud: it means MySQL lost acknowledged commits.
async fn write_back(db: &Db, item: &Item, lost: &[Lost]) -> Result<u64, ReconcileError> {
    let orders: Vec<OrderPlaced> = lost
        .iter()
        .filter_map(|lost| {
            let order_sn = OrderSn::parse(&lost.order_sn)?;
            let won_at = order_sn.won_at_ms();
            Some(OrderPlaced {
                item_id: order_sn.item(),
                order_sn,
                user_id: lost.user,
                created_at_ms: won_at,
                pay_deadline_ms: won_at + i64::from(item.pay_timeout_s) * 1000,
                slot: lost.slot,
            })
        })
        .collect();
    if orders.is_empty() {
        return Ok(0);
    }
    for chunk in orders.chunks(LOOKUP_CHUNK) {
        mysql_timed(repo::insert_batch(db, chunk, OrderStatus::Unpaid)).await?;
    }
    tracing::error!(
        item = %item.id,
        orders = orders.len(),
        "reconciliation: won orders no longer pending had no row in MySQL (lost commits?); written back as unpaid"
    );
    Ok(orders.len() as u64)
}
