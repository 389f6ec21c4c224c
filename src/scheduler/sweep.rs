//! The safety sweep: walks the items index a thousand buckets a second and marks for each
//! kind of background work the buckets that hold some without a mark — lost with a
//! process that died between writing the work and marking it (`src/marks.rs`). It also
//! repairs the pending orders of the buckets it visits ([`Relay::sweep_pending`]),
//! forgets confirms noted after their order was written ([`Relay::prune_confirmed`]), and
//! packs again what `grab.lua` checks of their meta ([`repack_rules`]).
//!
//! Its cost per second is bounded whatever the catalogue; a lost mark is found within one
//! trip round the index (100 s at 100,000 buckets; every second below 1,000). So is its
//! walk of pending orders, whatever piles up there while the consumer is down: about
//! [`PENDING_PER_VISIT`] entries a visit, shared by the buckets visited, each bucket's
//! walk going on where the last visit left it.
//!
//! The index and the marks are single keys with no hash tag: on a cluster they live on
//! one master, and a failover that lost its last writes (or a loss of its data) takes
//! them with it. So each trip begins by putting back into the index every bucket of the
//! items MySQL says are loaded and not yet reconciled (adding a member already there
//! changes nothing); the trip then marks their work again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

use crate::background::{Schedule, repeat};
use crate::domain::BucketId;
use crate::items::stock;
use crate::keys::Keys;
use crate::marks::{self, Work};
use crate::outbox::relay::Relay;

use crate::store::{Grouped, RedisConns, StoreError, redis_timed};

use super::Scheduler;

const EVERY: Duration = Duration::from_secs(1);
/// Buckets asked per visit (SSCAN's COUNT: a hint, Redis may answer more or fewer).
const PER_VISIT: usize = 1_000;
/// Pending orders read per visit, about: shared by the buckets that hold some, each
/// getting at least a page. At 100,000 pending (a consumer down for a minute of a big
/// sale) reading them all every second took a tenth of a core in Redis and more in the
/// scheduler, for repairs that wait seconds anyway.
const PENDING_PER_VISIT: usize = 10_000;
/// Least pending orders a bucket gets read per visit: one HSCAN page.
const PENDING_PAGE: usize = 1_000;

/// Where each bucket's walk of its pending orders goes on (an HSCAN cursor); a bucket
/// whose walk ended is not in it.
type PendingWalks = Mutex<HashMap<BucketId, u64>>;

pub async fn run(scheduler: Scheduler, relay: Relay, shutdown: CancellationToken) {
    let cursor = AtomicU64::new(0);
    let walks = PendingWalks::default();
    let (scheduler, relay, cursor, walks) = (&scheduler, &relay, &cursor, &walks);
    repeat(
        "safety sweep",
        Schedule::every(EVERY),
        &shutdown,
        || async move {
            let next = visit(scheduler, relay, cursor.load(Ordering::Relaxed), walks).await?;
            cursor.store(next, Ordering::Relaxed);
            Ok::<_, StoreError>(())
        },
    )
    .await;
}

/// One step of the walk round the index, from `cursor`; returns the next cursor.
async fn visit(
    scheduler: &Scheduler,
    relay: &Relay,
    cursor: u64,
    walks: &PendingWalks,
) -> Result<u64, StoreError> {
    let (redis, keys) = (&scheduler.deps.redis, &scheduler.deps.keys);
    if cursor == 0 {
        repair_index(scheduler).await?;
    }
    let (next, members): (u64, Vec<String>) = {
        let mut conn = redis.bulk().await?;
        redis_timed(
            redis::cmd("SSCAN")
                .arg(keys.items_index())
                .arg(cursor)
                .arg("COUNT")
                .arg(PER_VISIT)
                .query_async(&mut conn),
        )
        .await?
    };
    let stocks: Vec<BucketId> = members.iter().filter_map(|m| BucketId::parse(m)).collect();
    if stocks.is_empty() {
        return Ok(next);
    }
    let held = marks::holdings(redis, keys, &stocks).await?;
    mark_unmarked(redis, keys, &members, &stocks, &held).await?;
    repack_rules(redis, keys, &stocks).await?;
    let with_pending = held.iter().filter(|h| h.pending > 0).count();
    let share = (PENDING_PER_VISIT / with_pending.max(1)).max(PENDING_PAGE);
    for (stock, holding) in stocks.iter().zip(&held) {
        if holding.pending > 0 {
            let from = lock(walks).get(stock).copied().unwrap_or(0);
            let next = relay.sweep_pending(*stock, from, share).await?;
            let mut walks = lock(walks);
            match next {
                0 => walks.remove(stock),
                next => walks.insert(*stock, next),
            };
        } else {
            // Emptied mid-walk (the consumer caught up): its next walk starts afresh.
            lock(walks).remove(stock);
        }
        if holding.confirmed > holding.pending {
            relay.prune_confirmed(*stock).await?;
        }
    }
    Ok(next)
}

/// Marks each of these buckets (`members` as the index names them) for every kind of work
/// it holds and carries no mark for: a mark lost with its Redis master, or never written
/// by a process that died.
async fn mark_unmarked(
    redis: &RedisConns,
    keys: &Keys,
    members: &[String],
    stocks: &[BucketId],
    held: &[marks::Holding],
) -> Result<(), StoreError> {
    // Which of them carry each kind of mark already.
    let mut grouped = Grouped::new(redis);
    for work in Work::ALL {
        grouped
            .group()
            .cmd("ZMSCORE")
            .arg(work.key(keys))
            .arg(members);
    }
    let marked: Vec<(Vec<Option<f64>>,)> = grouped.query(redis).await?;
    let mut conn = redis.bulk().await?;
    for (work, (scores,)) in Work::ALL.into_iter().zip(marked) {
        let has_mark: std::collections::HashSet<&str> = members
            .iter()
            .zip(scores)
            .filter(|(_, score)| score.is_some())
            .map(|(m, _)| m.as_str())
            .collect();
        let unmarked: Vec<BucketId> = stocks
            .iter()
            .zip(held)
            .filter(|(_, holding)| holding.has(work))
            .map(|(stock, _)| *stock)
            .filter(|stock| !has_mark.contains(stock.to_string().as_str()))
            .collect();
        if !unmarked.is_empty() {
            tracing::info!(
                work = work.name(),
                buckets = unmarked.len(),
                "safety sweep: marked buckets whose work had no mark"
            );
            marks::mark(&mut conn, keys, work, unmarked).await?;
        }
    }
    Ok(())
}

/// The walks' cursors; one left behind by a panic mid-update is as good as any.
fn lock(walks: &PendingWalks) -> std::sync::MutexGuard<'_, HashMap<BucketId, u64>> {
    walks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Packs again what `grab.lua` checks of each bucket's meta (`lua/lib/rules.lua`): a
/// server of a release before the packed form wrote the fields alone, and a pause, a
/// window or a fence it wrote must not stay hidden from the grab behind a stale copy.
/// Writes only what changed.
async fn repack_rules(
    redis: &RedisConns,
    keys: &Keys,
    stocks: &[BucketId],
) -> Result<(), StoreError> {
    stock::load_rules_set(redis).await?;
    let mut grouped = Grouped::new(redis);
    for stock in stocks {
        stock::set_meta_in(grouped.group(), &keys.bucket(*stock), &[]);
    }
    Ok(grouped.run(redis).await?)
}

/// Puts back into the items index the buckets of every item loaded and not reconciled.
async fn repair_index(scheduler: &Scheduler) -> Result<(), StoreError> {
    let items = crate::items::repo::loaded_and_open(&scheduler.deps.db).await?;
    let members: Vec<String> = items
        .into_iter()
        .flat_map(|(id, buckets)| BucketId::all(id, buckets))
        .map(|stock| stock.to_string())
        .collect();
    let index = scheduler.deps.keys.items_index();
    let mut conn = scheduler.deps.redis.bulk().await?;
    for chunk in members.chunks(PER_VISIT) {
        let added: u64 = redis_timed(conn.sadd(&index, chunk)).await?;
        if added > 0 {
            tracing::warn!(
                buckets = added,
                "safety sweep: the items index had lost buckets of loaded items; put back"
            );
        }
    }
    Ok(())
}
