//! The draw pass: every second, each draw whose time has come and whose sale is on gets a
//! round of `crate::draw::award` — the first gives every unit by rank, the later ones pass
//! on the units winners gave back — under a lock so that one scheduler draws an item at a
//! time (two at once would still give nobody twice: see that module).
//!
//! Which draws are due comes from Redis (`crate::items::draw_schedule`); MySQL is asked only
//! about those, when one appears and every [`READ_EVERY`] while they last — not on a
//! timer for every item: a query a second from every scheduler took MySQL connections
//! from buyers when MySQL was slow (`protection::a_flood_of_unknown_ids_…` failed).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::background::{Schedule, repeat};
use crate::domain::ItemId;
use crate::draw::award::{Round, draw};
use crate::items::catalog;
use crate::items::draw_schedule as schedule;
use crate::items::repo::{self, Item};
use crate::lock::RedisLock;
use crate::store::StoreError;

use super::Scheduler;

const EVERY: Duration = Duration::from_secs(1);
/// How often the due draws' records are read again (a pause, a new end, a warm-up).
const READ_EVERY: Duration = Duration::from_secs(10);
/// How long one scheduler holds an item's draw (a longer round is safe all the same).
const LOCK_FOR: Duration = Duration::from_secs(30);

pub async fn run(scheduler: Scheduler, shutdown: CancellationToken) {
    let scheduler = &scheduler;
    let known = Mutex::new(Known::default());
    repeat("drawing winners", Schedule::every(EVERY), &shutdown, || {
        pass(scheduler, &known)
    })
    .await;
}

/// The due draws' records, as last read from MySQL (and as this scheduler's rounds moved
/// them on since).
#[derive(Default)]
struct Known {
    items: HashMap<ItemId, Item>,
    read_at: Option<Instant>,
}

async fn pass(scheduler: &Scheduler, known: &Mutex<Known>) -> Result<(), StoreError> {
    let (redis, keys) = (&scheduler.deps.redis, &scheduler.deps.keys);
    let now = crate::clock::now();
    let due = {
        let mut conn = redis.bulk().await?;
        schedule::due(&mut conn, keys, now).await?
    };
    let mut known = known.lock().await;
    known.items.retain(|id, _| due.contains(id));
    let unknown = due.iter().any(|id| !known.items.contains_key(id));
    if unknown || known.read_at.is_some_and(|at| at.elapsed() >= READ_EVERY) {
        let items = repo::get_many(&scheduler.deps.db, &due).await?;
        let (on, over): (Vec<Item>, Vec<Item>) = items
            .into_iter()
            .partition(|item| rounds_to_come(item, now));
        let mut gone: Vec<ItemId> = over.iter().map(|item| item.id).collect();
        gone.extend(
            due.iter()
                .filter(|id| !on.iter().any(|i| i.id == **id))
                .copied(),
        );
        let mut conn = redis.bulk().await?;
        schedule::forget(&mut conn, keys, &gone).await?;
        known.items = on.into_iter().map(|item| (item.id, item)).collect();
        known.read_at = Some(Instant::now());
    }
    for item in known
        .items
        .values_mut()
        .filter(|item| item.loaded_at.is_some())
    {
        let Some(lock) = RedisLock::try_take(redis, keys.draw_lock(item.id), LOCK_FOR).await?
        else {
            continue;
        };
        let round = draw(redis, keys, item).await;
        lock.let_go(redis).await;
        match round {
            Ok(Some(round)) => record(scheduler, item, round).await?,
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(item = %item.id, error = %crate::error::cause_chain(&e), "draw: round cut off; the next pass resumes it");
            }
        }
    }
    Ok(())
}

/// Whether the item's draw has rounds to come: until its sale ends, and after it while a
/// loaded draw's first round is not done (a draw at `end_at`, the default, is drawn then).
fn rounds_to_come(item: &Item, now: DateTime<Utc>) -> bool {
    let first_to_come = item.drawn_at.is_none() && item.loaded_at.is_some();
    item.draw_at.is_some() && item.retired_at.is_none() && (item.end_at > now || first_to_come)
}

/// A round that gave units, or completed the first: into MySQL (the seed goes public with
/// the first complete round), every instance told, and the item as this pass knows it
/// moved on.
async fn record(scheduler: &Scheduler, item: &mut Item, round: Round) -> Result<(), StoreError> {
    let first_done = round.complete && item.drawn_at.is_none();
    if round.given == 0 && !first_done {
        return Ok(());
    }
    item.draw_cutoff = round.cutoff.or(item.draw_cutoff);
    if first_done {
        item.drawn_at = Some(crate::clock::now());
    }
    tracing::info!(item = %item.id, given = round.given, cutoff = ?round.cutoff, "draw: units given by rank");
    repo::record_draw(&scheduler.deps.db, item.id, round.cutoff, round.complete).await?;
    let mut conn = scheduler.deps.redis.bulk().await?;
    if let Err(e) = catalog::announce_change(&mut conn, &scheduler.deps.keys, item.id).await {
        tracing::warn!(item = %item.id, error = %e, "could not announce a draw; instances see it within a second anyway");
    }
    Ok(())
}
