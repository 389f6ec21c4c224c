//! The compensation scan: unpaid orders in MySQL past their deadline that the delay queue
//! no longer holds (lost with Redis, deleted by hand, never scheduled because a process
//! died at the wrong moment) are cancelled the same way, and their units come back.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::background::{Schedule, repeat};
use crate::domain::ItemId;
use crate::orders::repo::{self, OrderRow};
use crate::store::{Grouped, StoreError};

use super::Scheduler;
use crate::delay_queue::Task;

/// An order is only looked at once its deadline is this far behind, so the delay queue
/// has had its chance.
const GRACE: Duration = Duration::from_secs(2);
const BATCH: u32 = 1_000;

pub async fn run(scheduler: Scheduler, shutdown: CancellationToken) {
    let every = Duration::from_secs(scheduler.deps.settings.compensate_every_s);
    repeat(
        "compensation scan",
        Schedule::every(every),
        &shutdown,
        || scan(&scheduler),
    )
    .await;
}

async fn scan(scheduler: &Scheduler) -> Result<(), StoreError> {
    // Only items that have an overdue unpaid order: one query, not one per item.
    for item in repo::items_with_overdue(&scheduler.deps.db, GRACE).await? {
        scan_item(scheduler, item).await?;
    }
    Ok(())
}

async fn scan_item(scheduler: &Scheduler, item: ItemId) -> Result<(), StoreError> {
    loop {
        let overdue = repo::overdue_unpaid(&scheduler.deps.db, item, GRACE, BATCH).await?;
        let lost = not_queued(scheduler, &overdue).await?;
        if lost.is_empty() {
            return Ok(());
        }
        let sns: Vec<&str> = lost.iter().map(|o| o.order_sn.as_str()).collect();
        let outcome = scheduler.time_out(&sns).await?;
        tracing::warn!(
            %item,
            found = lost.len(),
            cancelled = outcome.cancelled,
            released = outcome.released,
            "compensation scan: cancelled overdue orders the delay queue had lost"
        );
        if overdue.len() < BATCH as usize || outcome.cancelled == 0 {
            return Ok(());
        }
    }
}

/// Those of the orders whose deadline task is neither waiting nor taken.
async fn not_queued<'a>(
    scheduler: &Scheduler,
    orders: &'a [OrderRow],
) -> Result<Vec<&'a OrderRow>, StoreError> {
    if orders.is_empty() {
        return Ok(Vec::new());
    }
    // A group per order: orders of one item may sit in different buckets (slots).
    let mut grouped = Grouped::new(&scheduler.deps.redis);
    for order in orders {
        let member = Task::Cancel(order.order_sn.clone()).member();
        let stock = order.order_sn.bucket();
        grouped
            .group()
            .zscore(scheduler.deps.keys.due(stock), &member)
            .zscore(scheduler.deps.keys.leased(stock), &member);
    }
    let scores: Vec<(Option<f64>, Option<f64>)> = grouped.query(&scheduler.deps.redis).await?;
    Ok(orders
        .iter()
        .zip(scores)
        .filter(|(_, s)| *s == (None, None))
        .map(|(order, _)| order)
        .collect())
}
