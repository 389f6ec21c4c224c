//! The admission pass (scheduler role): every [`STEP_EVERY`], each waiting room of a sale
//! not long over takes one step (`lua/queue_step.lua`): passes past their time give their
//! units back, and the next in line are let in — at most `admit_per_s` a second, and
//! never more than the units unsold could honour. Every [`OUTLOOK_EVERY`] it also tells
//! those waiting what the stock holds for them: `sold_out` once no unit can come back
//! (every unit paid for, or the sale over), else, while every unit unsold is taken, when
//! the unpaid orders holding the rest are known.
//!
//! Nobody is let in while no pass could buy: the sale paused or reloading, a breaker set
//! by hand refusing its purchases (the item's or the global one at level 2 or 3), or its
//! shop closed. The passes already out keep their time (a pass is signed with it).
//!
//! Any number of schedulers may run it: a step is one atomic script, so two never let one
//! buyer in twice or out of order, and a scheduler killed mid-step let in all of its step
//! or nothing.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::background::{Schedule, repeat};
use crate::breaker::{self, Level, Scope};
use crate::deps::Deps;
use crate::domain::ItemId;
use crate::items::repo::{self, Item};
use crate::items::stock;
use crate::shops::cache::Shops;
use crate::store::StoreError;
use crate::telemetry::QueueLevels;

use super::line::{self, StepRules};

const STEP_EVERY: Duration = Duration::from_millis(200);
/// How often the queued items are read from MySQL again (a new queue, a change).
const READ_EVERY: Duration = Duration::from_secs(2);
/// How often those waiting are told what the stock holds for them (a MySQL read each).
const OUTLOOK_EVERY: Duration = Duration::from_secs(1);
/// A queue is stepped this long after its sale ended: those still waiting hear
/// `sold_out`, and the passes run out.
const AFTER_END: Duration = Duration::from_secs(3_600);

pub async fn run(deps: Deps, shops: Shops, shutdown: CancellationToken) {
    let pass = tokio::sync::Mutex::new(Pass::default());
    let (deps, shops, pass) = (&deps, &shops, &pass);
    repeat(
        "waiting rooms' admission",
        Schedule::every(STEP_EVERY),
        &shutdown,
        || async move { pass.lock().await.step_all(deps, shops).await },
    )
    .await;
}

/// What the pass keeps between steps.
#[derive(Default)]
struct Pass {
    items: Vec<Item>,
    read_at: Option<Instant>,
    outlook_at: HashMap<ItemId, Instant>,
}

impl Pass {
    async fn step_all(&mut self, deps: &Deps, shops: &Shops) -> Result<(), StoreError> {
        if self.read_at.is_none_or(|at| at.elapsed() >= READ_EVERY) {
            // Should MySQL not answer, the queues known go on stepping: passes run out and
            // units come back whatever MySQL does.
            match repo::queued(&deps.db, AFTER_END).await {
                Ok(items) => {
                    self.items = items;
                    self.read_at = Some(Instant::now());
                    let ids: Vec<ItemId> = self.items.iter().map(|item| item.id).collect();
                    self.outlook_at.retain(|id, _| ids.contains(id));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the queued items; stepping those known")
                }
            }
        }
        // The breakers set by hand (one read a step); unreadable, none holds admission: the
        // purchases' own check still refuses while one is open.
        let breakers = match breaker::store::load_all(&deps.redis, &deps.keys).await {
            Ok(settings) => breaker::store::levels(&settings),
            Err(e) => {
                tracing::debug!(error = %e, "could not read the breakers; admitting as if closed");
                Default::default()
            }
        };
        let now = crate::clock::now();
        for item in &self.items {
            let opens = item.start_at
                - chrono::Duration::seconds(i64::from(
                    item.queue.0.map_or(0, |plan| plan.opens_before_s),
                ));
            if now < opens {
                continue;
            }
            let outlook = self
                .outlook_at
                .get(&item.id)
                .is_none_or(|at| at.elapsed() >= OUTLOOK_EVERY);
            let stopped = [Scope::Global, Scope::Item(item.id)]
                .iter()
                .any(|scope| breakers.get(scope).is_some_and(|l| *l >= Level::Degrade));
            // A shop nobody can tell about counts as open, as on the purchase path.
            let closed = match shops.get(item.shop_id).await {
                Ok(Some(shop)) => !shop.open_at(now),
                Ok(None) | Err(_) => false,
            };
            if let Err(e) = step(deps, item, now, outlook, stopped || closed).await {
                tracing::warn!(item = %item.id, error = %crate::error::cause_chain(&e), "a waiting room's step failed; it runs again");
                continue;
            }
            if outlook {
                self.outlook_at.insert(item.id, Instant::now());
            }
        }
        Ok(())
    }
}

/// One step of `item`'s queue, and (`outlook`) what those waiting are told; `refused`:
/// its purchases are refused now (a breaker, its shop's hours), so nobody is let in.
async fn step(
    deps: &Deps,
    item: &Item,
    now: DateTime<Utc>,
    outlook: bool,
    refused: bool,
) -> Result<(), StoreError> {
    let Some(plan) = item.queue.0 else {
        return Ok(());
    };
    let keys = deps.keys.queue(item.id);
    // MySQL's unpaid orders first, Redis's stock after: an order cancelled between the two
    // reads has its unit counted back on sale (or on its way back, in `ending`), never
    // nowhere — which would tell everyone `sold_out` while a unit is coming back.
    let unpaid = match outlook {
        true => Some(crate::orders::repo::unpaid_outlook(&deps.db, item.id).await?),
        false => None,
    };
    let mut conn = deps.redis.bulk().await?;
    // The wins counted first, the stock after: see `lua/queue_step.lua`.
    let before = line::before_stock(&mut conn, &keys).await?;
    let buckets = stock::bucket_snapshots(&mut conn, &deps.keys, item.bucket_ids()).await?;
    let whole = stock::sum(&buckets);
    let now_ms = now.timestamp_millis();
    // Units a purchase could take now: listed, less those waves still to come hold back
    // (a pass for them could not buy before it ran out), less units on their way between
    // buckets (a read may find one on both sides); none before a warm-up loaded them all.
    let available: u64 = if whole.loaded && !whole.reloading {
        item.bucket_ids()
            .zip(&buckets)
            .map(|(bucket, one)| {
                let held = item.release.holds(item.buckets, bucket.index).at(now_ms);
                one.remaining
                    .saturating_sub(one.moving)
                    .saturating_sub(held)
            })
            .sum()
    } else {
        0
    };
    let rules = StepRules {
        start_ms: item.start_at.timestamp_millis(),
        end_ms: item.end_at.timestamp_millis(),
        admit_per_s: plan.admit_per_s,
        pass_ttl_ms: i64::from(plan.pass_ttl_s) * 1000,
        per_user: item.per_user,
        held: item.paused || whole.reloading || refused,
    };
    // Taken before the step, held after it: see `lua/queue_show.lua`.
    let replication = deps.redis.replicas_for(&keys.replicated).await;
    let Some(stepped) = line::step(&mut conn, &keys, rules, available, before).await? else {
        return Ok(());
    };
    if stepped.shown < stepped.cursor {
        show_once_held(&mut conn, &keys, item.id, stepped.cursor, replication).await?;
    }
    if stepped.admitted > 0 {
        deps.meters.queue_admitted(item.id, stepped.admitted);
        tracing::info!(item = %item.id, admitted = stepped.admitted, cursor = stepped.cursor, reserved = stepped.reserved, available, "let in from the waiting room");
    }
    let Some((unpaid, latest)) = unpaid else {
        return Ok(());
    };
    let counted = Counted {
        whole,
        available,
        reserved: stepped.reserved,
        unpaid,
        latest,
    };
    tell_outlook(deps, &mut conn, item, now, &counted).await
}

/// Shows those let in up to `cursor` once the queue's replicas hold the step (taken
/// before it): not held, not shown yet, and nobody more let in until they are.
async fn show_once_held(
    conn: &mut crate::store::RedisConn,
    keys: &crate::keys::QueueKeys,
    item: ItemId,
    cursor: u64,
    replication: Result<crate::store::Replication, crate::store::ShortOfReplicas>,
) -> Result<(), StoreError> {
    let held = match replication {
        Ok(replication) => replication.held().await,
        Err(_) => false,
    };
    if held {
        line::show(conn, keys, cursor).await?;
    } else {
        tracing::warn!(item = %item, cursor, "the queue's replicas do not hold its last admissions yet: their passes wait");
    }
    Ok(())
}

/// What a step counted, for [`tell_outlook`].
struct Counted {
    whole: stock::StockSnapshot,
    /// Units a purchase could take now.
    available: u64,
    /// Units the live passes reserve.
    reserved: u64,
    /// Unpaid orders of the item, and the latest of their deadlines.
    unpaid: u64,
    latest: Option<DateTime<Utc>>,
}

/// Tells those waiting what the stock holds for them — `sold_out` once nothing can come
/// back, else, while every unit unsold is taken, when the orders holding the rest are
/// known — and sets the queue's gauges.
async fn tell_outlook(
    deps: &Deps,
    conn: &mut crate::store::RedisConn,
    item: &Item,
    now: DateTime<Utc>,
    counted: &Counted,
) -> Result<(), StoreError> {
    let Counted {
        whole,
        available,
        reserved,
        unpaid,
        latest,
    } = *counted;
    let keys = deps.keys.queue(item.id);
    let mut ending = 0;
    for bucket in item.bucket_ids() {
        ending += line::ending(conn, &deps.keys, bucket).await?;
    }
    let over = now >= item.end_at;
    // Nothing can come back: no unit listed or on its way, none in an order not paid for,
    // none in a cancel under way.
    let none_back =
        whole.loaded && whole.remaining == 0 && whole.pending == 0 && unpaid == 0 && ending == 0;
    let sold_out = over || none_back;
    // Everything unsold is taken by passes: the rest is in orders that may come back.
    let taken = available <= reserved;
    let known_by = (!sold_out && taken && unpaid + whole.pending > 0).then(|| {
        let pending_by = (whole.pending > 0)
            .then(|| now + chrono::Duration::seconds(i64::from(item.pay_timeout_s)));
        latest.max(pending_by).map(|at| at.timestamp_millis())
    });
    line::set_outlook(conn, &keys, sold_out, known_by.flatten()).await?;
    let figures = line::figures(conn, &keys).await?;
    deps.meters.queue_levels(
        item.id,
        QueueLevels {
            waiting: figures.joined.saturating_sub(figures.admitted),
            reserved,
            available,
        },
    );
    Ok(())
}
