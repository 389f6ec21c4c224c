//! Loading an item's units into Redis before its sale (the endpoints in [`admin`] and
//! `seckill warmup`), and rebuilding them after Redis lost them: `total − held` units into
//! a side list, swapped in by `lua/swap.lua` unless the item changed meanwhile. It sits
//! above items and orders, since it counts the orders holding units. What it answers:
//! docs/contract.md §8, "Warm-up"; why a rebuild waits: docs/operations.md, "Recovering a
//! Redis that lost data".

pub mod admin;
mod fresh;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::AsyncCommands;
use serde::Serialize;

use crate::broker::Broker;
use crate::delay_queue::Plan;
use crate::domain::{BucketId, ItemId, OrderPlaced, OrderSn, UserId};
use crate::keys::Keys;
use crate::keys::{ItemKeys, LoadingKeys};
use crate::lock::RedisLock;
use crate::lua::SWAP;
use crate::marks::{self, Work};
use crate::orders::repo as orders;
use crate::queue;
use crate::store::{Db, DbError, Grouped, RedisConn, RedisConns, RedisError, redis_timed};

use crate::items::repo::{self, Item};
use crate::items::stock::{self, StockSnapshot};
use crate::items::transfer;

/// Units per RPUSH, and RPUSHes per round trip.
const BATCH: u64 = 1_000;
const BATCHES_PER_TRIP: u64 = 20;
/// Longest a warm-up may hold its item's lock: the operators' budget for bulk work.
pub(super) const LOCK_FOR: Duration = Duration::from_secs(130);
/// A run's side list is garbage after this long (its run died before the swap).
const SIDE_LIST_TTL: Duration = Duration::from_secs(600);
/// A won order can still be in an API instance's publisher this long after the sale
/// stopped (its batch waits for a connection, then for its confirms), plus the time every
/// instance takes to see the pause.
const PUBLISHERS_DONE_AFTER: Duration =
    crate::outbox::publisher::HOLDS_AT_MOST.saturating_add(Duration::from_secs(2));
/// Once RabbitMQ's queue was seen empty, every order published before is in a consumer's
/// hands, which commit it within this long while MySQL answers.
const CONSUMERS_DONE_AFTER: Duration =
    Duration::from_secs(crate::orders::consumer::HOLDS_AT_MOST.as_secs() + 1);
/// How long a rebuild looks for an empty order queue before refusing.
const QUEUE_EMPTY_WITHIN: Duration = Duration::from_secs(5);
/// The meta fields `swap.lua` guards: a change of any of them since the warm-up read them
/// (a pause, a resume, a new window) aborts the swap. Sales and releases need no guard:
/// they wait while the item is fenced, and the fence is up before the read.
pub(super) const GUARDED: [&str; 4] = ["loaded", "paused", "start_ms", "end_ms"];
/// How far a host's clock may be from Redis's at a wave's time, for a load's count of the
/// units waves still hold back.
const WAVE_CLOCK_MARGIN: chrono::Duration = chrono::Duration::seconds(2);
/// A Redis that started this close before a load (its uptime is in whole seconds) counts
/// as having restarted after it.
const RESTART_SLACK_MS: i64 = 2_000;

/// What a warm-up works with.
pub struct Warmup<'a> {
    pub db: &'a Db,
    pub redis: &'a RedisConns,
    /// Tells whether orders still wait in RabbitMQ (for a rebuild).
    pub broker: &'a Broker,
    pub keys: &'a Keys,
    /// The deadlines and reminders a rebuild schedules again for unpaid orders.
    pub plan: &'a Plan,
}

/// Where a warm-up is, for a progress display.
#[derive(Clone, Debug)]
pub enum Progress {
    /// Waiting, before loading anything: why.
    Waiting(String),
    /// Units pushed so far, of how many.
    Loading { done: u64, of: u64 },
}

/// What a warm-up loaded, read back from Redis.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct WarmupReport {
    pub item_id: ItemId,
    pub total: u32,
    /// Units already held by orders (not loaded again).
    pub held: u64,
    /// Units on sale, read back from Redis as each bucket's swap left it.
    pub remaining: u64,
    /// Units counted as sold in Redis, read back likewise (equal to `held`).
    pub sold: u64,
    /// Whether Redis had lost the item's state (or may have) and it was rebuilt from
    /// MySQL after the orders in flight had landed.
    pub rebuilt: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum WarmupError {
    #[error("no such item")]
    NotFound,
    #[error("another warm-up of this item is running; try again when it is done")]
    Busy,
    #[error(
        "item already loaded ({remaining} units remaining); force a reload with ?force=true (HTTP) or --force (command line)"
    )]
    AlreadyLoaded { remaining: u64 },
    #[error("the sale is live: pause the item before reloading it")]
    LiveSale,
    #[error("orders may still be on their way to MySQL: {0}")]
    InFlight(String),
    #[error(
        "`total`: at least {} ({held} units held by orders, {unreleased} held back for waves still to come, {reserved} reserved by the waiting room's live passes), not {total}: raise it, or wait for the passes to run out",
        held + unreleased + reserved
    )]
    OverHeld {
        held: u64,
        unreleased: u64,
        reserved: u64,
        total: u32,
    },
    #[error(
        "the item changed during the warm-up (a pause, a resume, a new window, or another warm-up); purchases of it wait until a warm-up completes: run it again"
    )]
    Raced,
    #[error("read back {found} units instead of {expected}")]
    Verify { expected: u64, found: u64 },
    #[error(transparent)]
    Redis(#[from] RedisError),
    #[error(transparent)]
    Database(#[from] DbError),
}

impl Warmup<'_> {
    /// Loads (or rebuilds) the item's units. `progress` hears where it is.
    pub async fn run(
        &self,
        id: ItemId,
        force: bool,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<WarmupReport, WarmupError> {
        if repo::get(self.db, id).await?.is_none() {
            return Err(WarmupError::NotFound);
        }
        let lock = RedisLock::try_take(self.redis, self.keys.warmup_lock(id), LOCK_FOR)
            .await?
            .ok_or(WarmupError::Busy)?;
        let result = self.load(id, force, progress).await;
        lock.let_go(self.redis).await;
        result
    }

    async fn load(
        &self,
        id: ItemId,
        force: bool,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<WarmupReport, WarmupError> {
        let item = repo::get(self.db, id).await?.ok_or(WarmupError::NotFound)?;
        let first_look = {
            let mut conn = self.redis.bulk().await?;
            stock::item_snapshot(&mut conn, self.keys, item.bucket_ids()).await?
        };
        if first_look.loaded && !force {
            // A load whose last steps were cut off (the index, the record) is finished
            // here, so that asking again repairs it.
            self.index(&item).await?;
            if item.loaded_at.is_none() {
                repo::mark_loaded(self.db, &[id]).await?;
            }
            return Err(WarmupError::AlreadyLoaded {
                remaining: first_look.remaining,
            });
        }
        let rebuild = self.must_rebuild(&item, &first_look).await?;
        if (first_look.loaded || rebuild) && item.on_sale_at(crate::clock::now()) {
            return Err(WarmupError::LiveSale);
        }
        if rebuild {
            self.wait_for_orders_in_flight(&item, progress).await?;
        }

        // Into the index first: the sweeps must visit a bucket from the moment it holds
        // anything (an empty one costs them nothing).
        self.index(&item).await?;
        let mut conn = self.redis.bulk().await?;
        let report = self.load_and_swap(&mut conn, id, rebuild, progress).await?;
        repo::mark_loaded(self.db, &[id]).await?;
        crate::items::catalog::announce_change(&mut conn, self.keys, id).await?;
        Ok(report)
    }

    /// Lists the item's buckets in the items index, which the relay and the scheduler's
    /// sweeps walk.
    async fn index(&self, item: &Item) -> Result<(), WarmupError> {
        let members: Vec<String> = item.bucket_ids().map(|s| s.to_string()).collect();
        // Two keys of two slots: a group each (one pipeline on one server).
        let mut grouped = Grouped::new(self.redis);
        grouped
            .group()
            .sadd(self.keys.items_index(), members)
            .ignore();
        crate::items::draw_schedule::note_in(grouped.group(), self.keys, item.id, item.draw_at);
        grouped.run(self.redis).await?;
        Ok(())
    }

    /// Whether Redis lost (or may have lost) orders it held: the item was loaded before
    /// but Redis has no trace of it (in any of its buckets), or a bucket is served by
    /// another Redis server than the one that took its load — a failover promoted a
    /// replica (which may lack the last writes, `WAIT` or not) or the server restarted
    /// (which may lose them, depending on its persistence). Loads from before servers
    /// were recorded are judged by the server's uptime.
    async fn must_rebuild(&self, item: &Item, now: &StockSnapshot) -> Result<bool, WarmupError> {
        match now.loaded_at_ms {
            Some(loaded_ms) => {
                for bucket in item.bucket_ids() {
                    let keys = self.keys.bucket(bucket);
                    let server = self.redis.server_info_of(&keys.meta).await?;
                    let run_id: Option<String> = server.get("run_id");
                    let loaded_on: Option<String> = {
                        let mut conn = self.redis.bulk().await?;
                        redis_timed(conn.hget(&keys.meta, "loaded_on")).await?
                    };
                    let elsewhere = match loaded_on {
                        Some(loaded_on) => run_id.is_none_or(|now| now != loaded_on),
                        None => started_ms(&server)? + RESTART_SLACK_MS > loaded_ms,
                    };
                    if elsewhere {
                        tracing::warn!(%bucket, "the Redis server serving this bucket is not the one that took its load (a failover or a restart): rebuilding from MySQL");
                        return Ok(true);
                    }
                }
                Ok(false)
            }
            None => {
                Ok(item.loaded_at.is_some() || repo::history(self.db, item.id).await?.has_orders)
            }
        }
    }

    /// Returns once no order won before the sale stopped can still be outside both MySQL
    /// and Redis's `pending` hash.
    async fn wait_for_orders_in_flight(
        &self,
        item: &Item,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<(), WarmupError> {
        let stopped = self.stopped_at(item).await?;
        let publishers_done = stopped + PUBLISHERS_DONE_AFTER;
        if let Ok(wait) = (publishers_done - crate::clock::now()).to_std() {
            progress(Progress::Waiting(format!(
                "waiting {:.0} s for orders in the servers' publishers",
                wait.as_secs_f64().ceil()
            )));
            tokio::time::sleep(wait).await;
        }
        progress(Progress::Waiting(
            "waiting for RabbitMQ's order queue to be empty".into(),
        ));
        let give_up = tokio::time::Instant::now() + QUEUE_EMPTY_WITHIN;
        loop {
            let depth = self.broker.queue_depth().await;
            if depth == Some(0) {
                break;
            }
            if tokio::time::Instant::now() >= give_up {
                return Err(WarmupError::InFlight(match depth {
                    Some(n) => format!(
                        "{n} messages wait in RabbitMQ's order queue (is a consumer running?); try again once it is empty"
                    ),
                    None => "RabbitMQ cannot tell how many orders wait in its queue; try again once it answers".into(),
                }));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        progress(Progress::Waiting(format!(
            "waiting {} s for the consumers to commit what they took",
            CONSUMERS_DONE_AFTER.as_secs()
        )));
        tokio::time::sleep(CONSUMERS_DONE_AFTER).await;
        Ok(())
    }

    /// Since when no purchase of the item can have won: its pause, its end, or (for a
    /// sale not open yet) the last change of its record.
    async fn stopped_at(&self, item: &Item) -> Result<DateTime<Utc>, WarmupError> {
        let history = repo::history(self.db, item.id).await?;
        Ok(if item.paused {
            history.paused_at.unwrap_or(history.updated_at)
        } else if crate::clock::now() >= item.end_at {
            item.end_at
        } else {
            history.updated_at
        })
    }

    /// The decisive read, the load into this run's own keys, then `swap.lua`, which puts
    /// them in place only if the item did not change since that read. A split item is
    /// loaded bucket by bucket: its units spread evenly, each holder's record in the
    /// bucket its order lives in. (The swaps of two buckets are two steps: a warm-up cut
    /// off between them leaves an item to load again with `force`, and nothing sells
    /// meanwhile — a reload happens only while the sale is paused or not open.)
    async fn load_and_swap(
        &self,
        conn: &mut RedisConn,
        id: ItemId,
        rebuild: bool,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<WarmupReport, WarmupError> {
        // Read again under the record's current rules: a resume while a rebuild waited
        // is a live sale again.
        let item = repo::get(self.db, id).await?.ok_or(WarmupError::NotFound)?;
        let buckets: Vec<ItemKeys> = item.bucket_ids().map(|s| self.keys.bucket(s)).collect();
        let was_loaded = guarded_fields(conn, &buckets)
            .await?
            .iter()
            .any(|fields| fields[0].is_some());
        if (was_loaded || rebuild) && item.on_sale_at(crate::clock::now()) {
            return Err(WarmupError::LiveSale);
        }
        // Refused before the fence when it can be (a refusal changes nothing); the count
        // under the fence below is the one that decides.
        let reserved = self.reserved(conn, &item).await?;
        to_load(
            &item,
            self.holders(conn, &buckets, id).await?.len() as u64,
            reserved,
        )?;
        // Every bucket held back before the decisive read: from here on nothing sells,
        // lends, gives back or releases in any of them (the scripts check `fenced`), so
        // the holders read below stay the holders until each bucket's swap — even if the
        // sale opens meanwhile. A run cut off before its last swap leaves the rest held
        // back (503) until a warm-up completes, never a half-loaded item on sale.
        let run = ulid::Ulid::new().to_string().to_lowercase();
        fence(self.redis, &buckets, &run).await?;
        let seen = guarded_fields(conn, &buckets).await?;
        // Units on their way between buckets are part of the old stock being replaced:
        // their transfers are decided now, so none can land after the swap.
        let loans = transfer::settle_loans(self.redis, self.keys, item.bucket_ids(), None).await?;
        if loans.waiting > 0 {
            return Err(WarmupError::InFlight(format!(
                "{} transfers between the item's buckets wait for a Redis replica to hold them; try again once the replicas are back",
                loans.waiting
            )));
        }

        // A late payment that took its unit before the fence may not have committed `paid`
        // yet: read the holders once it has. It recorded its order in the bucket's
        // `ending` with the unit, and drops the record only after its commit.
        let mut changing: Vec<String> = Vec::new();
        for bucket in &buckets {
            let ending = self.keys.ending(bucket.bucket);
            let sns: Vec<String> = redis_timed(conn.zrange(&ending, 0, -1)).await?;
            changing.extend(sns);
        }
        orders::await_changes(self.db, &changing).await?;
        let holders = self.holders(conn, &buckets, id).await?;
        // A waiting room lets nobody in from its hold to the last swap (a scheduler's step
        // may have read the stock before the fence): the units its passes reserve, read in
        // the hold's own step, only shrink meanwhile.
        let queue = self.keys.queue(id);
        let reserved = match item.queue.0 {
            Some(_) => queue::line::hold_for_reload(conn, &queue).await?,
            None => 0,
        };
        let fenced = Fenced {
            item: &item,
            buckets: &buckets,
            seen: &seen,
            run: &run,
            holders: &holders,
            reserved,
        };
        let loaded = self.load_fenced(conn, &fenced, rebuild, progress).await;
        if item.queue.0.is_some()
            && let Err(e) = queue::line::free_after_reload(conn, &queue).await
        {
            tracing::warn!(item = %id, error = %e, "could not let the waiting room go on after the reload; it does by itself within two minutes");
        }
        loaded
    }

    /// The load and the swaps of a fenced item: each bucket's share of the units and its
    /// holders' records into side keys, then swapped in, then checked.
    async fn load_fenced(
        &self,
        conn: &mut RedisConn,
        fenced: &Fenced<'_>,
        rebuild: bool,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<WarmupReport, WarmupError> {
        let Fenced {
            item,
            buckets,
            seen,
            run,
            holders,
            reserved,
        } = *fenced;
        let id = item.id;
        let held = holders.len() as u64;
        let to_load = to_load(item, held, reserved)?;

        let shares = BucketId::spread(to_load, buckets.len());
        let mut by_bucket: HashMap<BucketId, Vec<&Holder>> = HashMap::new();
        for holder in holders {
            by_bucket.entry(holder.bucket(id)).or_default().push(holder);
        }
        let mut next_unit = held;
        let mut swapped = Swapped::default();
        for ((bucket, seen), share) in buckets.iter().zip(seen).zip(&shares) {
            let mine = by_bucket.remove(&bucket.bucket).unwrap_or_default();
            let loading = self.keys.loading(bucket.bucket, run);
            let before = next_unit - held;
            let report = |p: Progress| match p {
                Progress::Loading { done, .. } => progress(Progress::Loading {
                    done: before + done,
                    of: to_load,
                }),
                other => progress(other),
            };
            fill_side_list(conn, &loading.tokens, next_unit, *share, &report).await?;
            next_unit += share;
            fill_buyers(conn, &loading, &mine).await?;
            let meta = BucketMeta {
                total: mine.len() as u64 + share,
            };
            let one = swap_in(conn, bucket, &loading, item, seen, run, meta).await?;
            swapped.listed += one.listed;
            swapped.sold += one.sold;
        }

        // As each swap left its bucket (once unfenced, a bucket may sell at once).
        if swapped.listed != to_load || swapped.sold != held {
            return Err(WarmupError::Verify {
                expected: to_load,
                found: swapped.listed,
            });
        }
        if rebuild {
            self.schedule_again(conn, holders, item).await?;
        }
        Ok(WarmupReport {
            item_id: id,
            total: item.total,
            held,
            remaining: swapped.listed,
            sold: swapped.sold,
            rebuilt: rebuild,
        })
    }

    /// After a rebuild: the unpaid orders' deadlines and reminders went with Redis, so they
    /// are due again as they were.
    async fn schedule_again(
        &self,
        conn: &mut RedisConn,
        holders: &[Holder],
        item: &Item,
    ) -> Result<(), WarmupError> {
        let unpaid: Vec<OrderPlaced> = holders.iter().filter_map(Holder::unpaid).collect();
        for chunk in unpaid.chunks(1_000) {
            let mut grouped = Grouped::new(self.redis);
            self.plan.schedule(&mut grouped, self.keys, chunk);
            grouped.run(self.redis).await?;
        }
        marks::mark(conn, self.keys, Work::Deadlines, item.bucket_ids()).await?;
        Ok(())
    }

    /// Every order holding a unit: live in MySQL or pending in Redis.
    /// The units the item's waiting room holds for its live passes (none without one): a
    /// reload must leave at least those unsold, or passes given out could not buy.
    async fn reserved(&self, conn: &mut RedisConn, item: &Item) -> Result<u64, WarmupError> {
        if item.queue.0.is_none() {
            return Ok(0);
        }
        Ok(queue::line::figures(conn, &self.keys.queue(item.id))
            .await?
            .reserved)
    }

    async fn holders(
        &self,
        conn: &mut RedisConn,
        buckets: &[ItemKeys],
        id: ItemId,
    ) -> Result<Vec<Holder>, WarmupError> {
        // Pending first, MySQL second: an order moving from one to the other in between
        // is then seen twice (and counted once), never missed.
        let mut pending: Vec<String> = Vec::new();
        for bucket in buckets {
            let values: Vec<String> = redis_timed(conn.hvals(&bucket.pending)).await?;
            pending.extend(values);
        }
        let mut holders: Vec<Holder> = orders::live_orders(self.db, id)
            .await?
            .into_iter()
            .map(|row| Holder {
                user: UserId::new(row.user_id),
                unpaid: row
                    .unpaid
                    .then(|| OrderSn::parse(&row.order_sn))
                    .flatten()
                    .map(|order_sn| OrderPlaced {
                        order_sn,
                        item_id: id,
                        user_id: UserId::new(row.user_id),
                        created_at_ms: row.created_at.timestamp_millis(),
                        pay_deadline_ms: row.pay_deadline.timestamp_millis(),
                        slot: row.slot,
                    }),
                slot: row.slot,
                order_sn: row.order_sn,
            })
            .collect();
        let in_mysql: HashSet<String> = holders.iter().map(|h| h.order_sn.clone()).collect();
        for json in pending {
            // An unreadable entry cannot be a holder that matters more than the others;
            // the relay reports it.
            if let Ok(order) = serde_json::from_str::<OrderPlaced>(&json)
                && !in_mysql.contains(order.order_sn.as_str())
            {
                holders.push(Holder {
                    user: order.user_id,
                    slot: order.slot,
                    order_sn: order.order_sn.to_string(),
                    unpaid: None,
                });
            }
        }
        Ok(holders)
    }
}

/// An order holding a unit.
struct Holder {
    user: UserId,
    order_sn: String,
    /// Its place in the buyer's record.
    slot: u8,
    /// The order, when it is unpaid in MySQL (its deadline and reminders are due).
    unpaid: Option<OrderPlaced>,
}

impl Holder {
    fn unpaid(&self) -> Option<OrderPlaced> {
        self.unpaid.clone()
    }

    /// The bucket its order lives in (as its number says).
    fn bucket(&self, item: ItemId) -> BucketId {
        OrderSn::parse(&self.order_sn).map_or(BucketId::whole(item), |sn| sn.bucket())
    }
}

/// The units to load beside `held` (the orders holding units): the rest of `total`, which
/// must cover what the item's waves still to come hold back (the load spreads both over
/// the buckets alike, so each bucket's list then covers its share). A wave within
/// [`WAVE_CLOCK_MARGIN`] of its time counts as still to come: Redis's clock, which opens
/// it, may be that far from this host's.
fn to_load(item: &Item, held: u64, reserved: u64) -> Result<u64, WarmupError> {
    let unreleased = item
        .release
        .unreleased(crate::clock::now() - WAVE_CLOCK_MARGIN);
    u64::from(item.total)
        .checked_sub(held)
        .filter(|rest| *rest >= unreleased + reserved)
        .ok_or(WarmupError::OverHeld {
            held,
            unreleased,
            reserved,
            total: item.total,
        })
}

/// When a Redis server started (ms since the epoch, to a second), from its `INFO server`.
fn started_ms(server: &redis::InfoDict) -> Result<i64, WarmupError> {
    let uptime_s: i64 = server
        .get("uptime_in_seconds")
        .ok_or_else(|| RedisError::Unexpected("INFO server has no uptime_in_seconds".into()))?;
    Ok(crate::clock::now().timestamp_millis() - uptime_s * 1000)
}

/// What a bucket's meta says after a load.
pub(super) struct BucketMeta {
    /// Units in the bucket: sold, plus on sale. What is sold is never counted apart: it
    /// is `total` less the units listed (src/items/stock.rs).
    pub total: u64,
}

/// What the load of a fenced item works with (`Warmup::load_fenced`).
struct Fenced<'a> {
    item: &'a Item,
    buckets: &'a [ItemKeys],
    /// Each bucket's guarded meta fields as read under the fence.
    seen: &'a [Vec<Option<String>>],
    run: &'a str,
    holders: &'a [Holder],
    /// Units the waiting room's live passes reserve.
    reserved: u64,
}

/// Holds every bucket back for this run (`fenced` in its meta; a dead run's fence is
/// replaced: the caller holds the item's warm-up lock).
async fn fence(redis: &RedisConns, buckets: &[ItemKeys], run: &str) -> Result<(), RedisError> {
    stock::load_rules_set(redis).await?;
    let mut grouped = Grouped::new(redis);
    for bucket in buckets {
        stock::set_meta_in(grouped.group(), bucket, &[("fenced", run.to_owned())]);
    }
    grouped.run(redis).await
}

/// Each bucket's [`GUARDED`] meta fields as they are now: what its swap is guarded by.
async fn guarded_fields(
    conn: &mut RedisConn,
    buckets: &[ItemKeys],
) -> Result<Vec<Vec<Option<String>>>, RedisError> {
    let mut seen = Vec::with_capacity(buckets.len());
    for bucket in buckets {
        let fields: Vec<Option<String>> = redis_timed(
            redis::cmd("HMGET")
                .arg(&bucket.meta)
                .arg(&GUARDED)
                .query_async(conn),
        )
        .await?;
        seen.push(fields);
    }
    Ok(seen)
}

async fn fill_side_list(
    conn: &mut RedisConn,
    side: &str,
    first_unit: u64,
    to_load: u64,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<(), WarmupError> {
    progress(Progress::Loading {
        done: 0,
        of: to_load,
    });
    let mut done = 0;
    while done < to_load {
        let mut pipe = redis::pipe();
        for _ in 0..BATCHES_PER_TRIP {
            if done >= to_load {
                break;
            }
            let end = (done + BATCH).min(to_load);
            // Unit numbers continue after the held ones, so every unit has its own number.
            let units: Vec<u64> = (first_unit + done + 1..=first_unit + end).collect();
            pipe.rpush(side, units).ignore();
            done = end;
        }
        // A run that dies before its swap leaves nothing behind for long.
        pipe.pexpire(side, SIDE_LIST_TTL.as_millis() as i64)
            .ignore();
        redis_timed(pipe.query_async::<()>(conn)).await?;
        progress(Progress::Loading { done, of: to_load });
    }
    let found: u64 = redis_timed(conn.llen(side)).await?;
    if found != to_load {
        return Err(WarmupError::Verify {
            expected: to_load,
            found,
        });
    }
    Ok(())
}

/// The holders' buyer records, into the run's own copies (pipelined in batches).
async fn fill_buyers(
    conn: &mut RedisConn,
    loading: &LoadingKeys,
    holders: &[&Holder],
) -> Result<(), WarmupError> {
    let records = buyer_records(holders);
    for chunk in records.chunks(BATCH as usize) {
        let mut pipe = redis::pipe();
        for (user, record) in chunk {
            pipe.hset(loading.buyer_orders(*user), user.get(), record)
                .ignore();
        }
        for key in loading.buyer_order_shards() {
            pipe.pexpire(key, SIDE_LIST_TTL.as_millis() as i64).ignore();
        }
        redis_timed(pipe.query_async::<()>(&mut *conn)).await?;
    }
    Ok(())
}

/// Each holder's buyer record as `grab.lua` writes it (`lua/lib/places.lua`): their
/// orders by place, `-` for a free one.
fn buyer_records(holders: &[&Holder]) -> Vec<(UserId, String)> {
    let mut places: HashMap<UserId, Vec<&str>> = HashMap::new();
    for holder in holders {
        let record = places.entry(holder.user).or_default();
        let slot = usize::from(holder.slot);
        if record.len() <= slot {
            record.resize(slot + 1, "-");
        }
        record[slot] = &holder.order_sn;
    }
    places
        .into_iter()
        .map(|(user, record)| (user, record.join(" ")))
        .collect()
}

/// Replaces the live list, the buyer records and the meta in one step (`swap.lua`), and
/// lifts the bucket's fence, unless the meta changed since `seen` was read or another run
/// fenced it since.
async fn swap_in(
    conn: &mut RedisConn,
    item_keys: &ItemKeys,
    loading: &LoadingKeys,
    item: &Item,
    seen: &[Option<String>],
    run: &str,
    after: BucketMeta,
) -> Result<Swapped, WarmupError> {
    let (keys, args) = swap_parts(item_keys, loading, item, seen, run, &after);
    let mut call = SWAP.prepare_invoke();
    for key in keys {
        call.key(key);
    }
    for arg in args {
        call.arg(arg);
    }
    let (outcome, listed, sold): (String, u64, u64) = redis_timed(call.invoke_async(conn)).await?;
    match outcome.as_str() {
        "ok" => Ok(Swapped { listed, sold }),
        _ => Err(WarmupError::Raced),
    }
}

/// What swaps left in their buckets, read in the same step.
#[derive(Default)]
struct Swapped {
    listed: u64,
    sold: u64,
}

/// `swap.lua`'s KEYS and ARGV for a bucket: its live keys and this run's copies, the guarded
/// meta fields as `seen`, the run, and the meta after the load.
fn swap_parts<'k>(
    item_keys: &'k ItemKeys,
    loading: &'k LoadingKeys,
    item: &Item,
    seen: &[Option<String>],
    run: &str,
    after: &BucketMeta,
) -> (Vec<&'k str>, Vec<String>) {
    let mut keys = vec![
        item_keys.meta.as_str(),
        item_keys.tokens.as_str(),
        loading.tokens.as_str(),
    ];
    keys.extend(
        item_keys
            .buyer_order_shards()
            .iter()
            .chain(loading.buyer_order_shards())
            .map(String::as_str),
    );
    let mut args: Vec<String> = seen
        .iter()
        .map(|value| value.clone().unwrap_or_default())
        .collect();
    args.push(run.to_owned());
    for (field, value) in meta_after(item, item_keys.bucket.index, after) {
        args.push(field.to_owned());
        args.push(value);
    }
    (keys, args)
}

/// A bucket's meta fields once loaded: its counts, the item's rules (see `lua/grab.lua`)
/// and a draw's entries closed once it is under way.
pub(super) fn meta_after(
    item: &Item,
    bucket: u8,
    after: &BucketMeta,
) -> Vec<(&'static str, String)> {
    let mut fields = vec![
        ("loaded", crate::clock::now().timestamp_millis().to_string()),
        ("total", after.total.to_string()),
        ("paused", i64::from(item.paused).to_string()),
    ];
    fields.extend(stock::Rules::of(item).meta(bucket));
    // A draw MySQL records as under way keeps its entries closed (`lua/enter.lua`), also
    // in a meta rebuilt after Redis lost it.
    if item.draw_cutoff.is_some() || item.drawn_at.is_some() {
        fields.push(("drawn", "1".to_owned()));
    }
    fields
}
