//! The draw pass: every second, each draw whose time has come and whose sale is on gets a
//! round of `crate::draw::award` — the first gives every unit by rank, the later ones pass
//! on the units winners gave back — under a lock so that one scheduler draws an item at a
//! time (two at once would still give nobody twice: see that module).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::background::{Schedule, repeat};
use crate::draw::award::{Round, draw};
use crate::items::catalog;
use crate::items::repo::{self, Item};
use crate::store::{RedisLock, StoreError};

use super::Scheduler;

const EVERY: Duration = Duration::from_secs(1);
/// How long one scheduler holds an item's draw (a longer round is safe all the same).
const LOCK_FOR: Duration = Duration::from_secs(30);

pub async fn run(scheduler: Scheduler, shutdown: CancellationToken) {
    let scheduler = &scheduler;
    repeat("drawing winners", Schedule::every(EVERY), &shutdown, || {
        pass(scheduler)
    })
    .await;
}

async fn pass(scheduler: &Scheduler) -> Result<(), StoreError> {
    for item in repo::draws_due(&scheduler.db).await? {
        let Some(lock) = RedisLock::try_take(
            &scheduler.redis,
            scheduler.keys.draw_lock(item.id),
            LOCK_FOR,
        )
        .await?
        else {
            continue;
        };
        let round = draw(&scheduler.redis, &scheduler.keys, &item).await;
        lock.let_go(&scheduler.redis).await;
        match round {
            Ok(Some(round)) => record(scheduler, &item, round).await?,
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(item = %item.id, error = %crate::error::cause_chain(&e), "draw: round cut off; the next pass resumes it");
            }
        }
    }
    Ok(())
}

/// A round that gave units, or completed the first: into MySQL (the seed goes public with
/// the first complete round), and every instance told.
async fn record(scheduler: &Scheduler, item: &Item, round: Round) -> Result<(), StoreError> {
    let first_done = round.complete && item.drawn_at.is_none();
    if round.given == 0 && !first_done {
        return Ok(());
    }
    tracing::info!(item = %item.id, given = round.given, cutoff = ?round.cutoff, "draw: units given by rank");
    repo::record_draw(&scheduler.db, item.id, round.cutoff, round.complete).await?;
    let mut conn = scheduler.redis.bulk().await?;
    if let Err(e) = catalog::announce_change(&mut conn, &scheduler.keys, item.id).await {
        tracing::warn!(item = %item.id, error = %e, "could not announce a draw; instances see it within a second anyway");
    }
    Ok(())
}
