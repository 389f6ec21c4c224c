//! The safety sweep: walks the items index a thousand buckets a second and marks for each
//! kind of background work the buckets that hold some without a mark — lost with a
//! process that died between writing the work and marking it (`src/marks.rs`). It also
//! repairs the pending orders of the buckets it visits ([`Relay::sweep_pending`]),
//! forgets confirms noted after their order was written ([`Relay::prune_confirmed`]), and
//! packs again what `grab.lua` checks of their meta ([`repack_rules`]).
//!
//! Its cost per second is bounded whatever the catalogue; a lost mark is found within one
//! trip round the index (100 s at 100,000 buckets; every second below 1,000).
//!
//! The index and the marks are single keys with no hash tag: on a cluster they live on
//! one master, and a failover that lost its last writes (or a loss of its data) takes
//! them with it. So each trip begins by putting back into the index every bucket of the
//! items MySQL says are loaded and not yet reconciled (adding a member already there
//! changes nothing); the trip then marks their work again.

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

pub async fn run(scheduler: Scheduler, relay: Relay, shutdown: CancellationToken) {
    let cursor = AtomicU64::new(0);
    let (scheduler, relay, cursor) = (&scheduler, &relay, &cursor);
    repeat(
        "safety sweep",
        Schedule::every(EVERY),
        &shutdown,
        || async move {
            let next = visit(scheduler, relay, cursor.load(Ordering::Relaxed)).await?;
            cursor.store(next, Ordering::Relaxed);
            Ok::<_, StoreError>(())
        },
    )
    .await;
}

/// One step of the walk round the index, from `cursor`; returns the next cursor.
async fn visit(scheduler: &Scheduler, relay: &Relay, cursor: u64) -> Result<u64, StoreError> {
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
    // Which of them carry each kind of mark already.
    let mut grouped = Grouped::new(redis);
    for work in Work::ALL {
        grouped
            .group()
            .cmd("ZMSCORE")
            .arg(work.key(keys))
            .arg(&members);
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
            .zip(&held)
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
    drop(conn);
    repack_rules(redis, keys, &stocks).await?;
    for (stock, holding) in stocks.iter().zip(&held) {
        if holding.pending > 0 {
            relay.sweep_pending(*stock).await?;
        }
        if holding.confirmed > holding.pending {
            relay.prune_confirmed(*stock).await?;
        }
    }
    Ok(next)
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
