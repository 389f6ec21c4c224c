//! The retention pass: retires ended sales from Redis once their reconciliation is
//! `SECKILL_SALE_RETENTION_S` old (`src/items/retire.rs` says how), so Redis, the items
//! index and every scheduler pass hold only the sales that can still change.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::background::{Schedule, repeat};
use crate::items::retire::{Retirement, retire};
use crate::store::StoreError;

use super::Scheduler;

const EVERY: Duration = Duration::from_secs(2);
/// Items looked at per pass: a backlog (the first start after an upgrade, or a long
/// outage) drains a few hundred items a second without crowding out the other passes.
const PER_PASS: u32 = 200;

pub async fn run(scheduler: Scheduler, shutdown: CancellationToken) {
    let scheduler = &scheduler;
    repeat(
        "retiring ended sales",
        Schedule::every(EVERY),
        &shutdown,
        || pass(scheduler),
    )
    .await;
}

/// Retires the sales due; an item that cannot go yet is tried again next pass.
async fn pass(scheduler: &Scheduler) -> Result<(), StoreError> {
    let retention = Duration::from_secs(scheduler.deps.settings.sale_retention_s);
    let due =
        crate::items::repo::due_for_retirement(&scheduler.deps.db, retention, PER_PASS).await?;
    let mut retired = 0;
    for &id in &due {
        match retire(
            &scheduler.deps.db,
            &scheduler.deps.redis,
            &scheduler.deps.keys,
            id,
            retention,
        )
        .await?
        {
            Retirement::Done => retired += 1,
            Retirement::Busy | Retirement::NotDue => {}
            Retirement::InFlight(what) => {
                tracing::info!(item = %id, waiting_for = what, "sale not retired yet: something of it is still on its way");
            }
        }
    }
    if retired > 0 {
        scheduler.deps.meters.sales_retired(retired);
        tracing::info!(sales = retired, "ended sales retired from Redis");
    }
    Ok(())
}
