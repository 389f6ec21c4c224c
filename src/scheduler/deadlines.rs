//! Working the delay queue: at each order's pay deadline it is cancelled if still unpaid
//! and its unit goes back on sale; at each reminder stage an `order.remind` event goes out
//! for an order still unpaid.
//!
//! An unpaid order's way out: [`handle`] → `Scheduler::time_out` (`scheduler/mod.rs`) →
//! `orders::ending::cancel_overdue` (the `ending` record, MySQL, the unit back under the
//! row's lock) → `orders::repo::set_overdue_cancelled` (the `UPDATE`). The compensation
//! scan (`compensate.rs`) and a reconciliation (`orders/reconcile.rs`) take the same way.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::background::{Schedule, repeat};
use crate::broker::{Event, Outbound, publish};
use crate::domain::BucketId;
use crate::marks::{self, Work};
use crate::orders::repo::{self, OrderStatus};
use crate::store::StoreError;

use super::Scheduler;
use crate::delay_queue::{self as delay, Claimed, Task};

/// Tasks taken per claim.
const CLAIM_LIMIT: usize = 500;
/// A task that cannot be done yet (a deadline MySQL's clock has not reached, a broker
/// that is down) is tried again after this long.
const RETRY_AFTER: Duration = Duration::from_millis(500);
/// How long a pass waits for the broker to take its reminders. Cancels wait behind them
/// (the next claim comes after), and a reminder can come late where a cancel cannot: a
/// broker node gone silent once held every pass for the full confirm timeout.
const REMIND_WITHIN: Duration = Duration::from_secs(1);

pub const REMIND: &str = "order.remind";

/// Polls every `SECKILL_SCHEDULER_POLL_MS`, and at once when a keyspace notification
/// says something falls due.
pub async fn run(scheduler: Scheduler, wake: Arc<Notify>, shutdown: CancellationToken) {
    let schedule = Schedule {
        every: Duration::from_millis(scheduler.deps.settings.scheduler_poll_ms),
        wake: Some(&wake),
        at_start: false,
    };
    // A failed pass's tasks stay leased and come back when the lease runs out.
    repeat("delay queue pass", schedule, &shutdown, || pass(&scheduler)).await;
}

/// Takes and handles the due tasks of the buckets marked for it (`src/marks.rs`); each
/// is looked at again when its next task falls due or its lease runs out.
pub async fn pass(scheduler: &Scheduler) -> Result<(), StoreError> {
    let (redis, keys) = (&scheduler.deps.redis, &scheduler.deps.keys);
    let lease = Duration::from_millis(scheduler.deps.settings.scheduler_lease_ms);
    marks::work_through(redis, keys, Work::Deadlines, lease, |stocks| async move {
        for stock in &stocks {
            work_bucket(scheduler, *stock).await?;
        }
        let queues = |stock| vec![keys.due(stock), keys.leased(stock)];
        Ok::<_, StoreError>(marks::earliest(redis, &stocks, queues, Duration::ZERO).await?)
    })
    .await
}

/// Claims and handles the bucket's due tasks, a batch at a time.
async fn work_bucket(scheduler: &Scheduler, stock: BucketId) -> Result<(), StoreError> {
    loop {
        let claimed = {
            let mut conn = scheduler.deps.redis.bulk().await?;
            delay::claim(
                &mut conn,
                &scheduler.deps.keys,
                stock,
                scheduler.deps.settings.scheduler_lease_ms,
                CLAIM_LIMIT,
            )
            .await?
        };
        let full = claimed.tasks.len() == CLAIM_LIMIT;
        handle(scheduler, stock, claimed).await?;
        if !full {
            return Ok(());
        }
    }
}

async fn handle(
    scheduler: &Scheduler,
    stock: BucketId,
    claimed: Claimed,
) -> Result<(), StoreError> {
    let (mut done, mut later) = (Vec::new(), Vec::new());
    let (mut cancels, mut reminders) = (Vec::new(), Vec::new());
    for task in claimed.tasks {
        match task {
            Ok(Task::Cancel(sn)) => cancels.push(sn),
            Ok(Task::Remind { percent, order_sn }) => reminders.push((percent, order_sn)),
            Err(member) => {
                tracing::error!(%stock, entry = member, "delay queue entry is not a task; dropped");
                done.push(member);
            }
        }
    }

    if !cancels.is_empty() {
        let sns: Vec<&str> = cancels.iter().map(|sn| sn.as_str()).collect();
        let outcome = scheduler.time_out(&sns).await?;
        if outcome.cancelled > 0 || outcome.released > 0 {
            tracing::info!(%stock, cancelled = outcome.cancelled, released = outcome.released, "unpaid orders timed out");
        }
        if !outcome.missing.is_empty() {
            tracing::warn!(%stock, orders = ?outcome.missing, "deadline of orders MySQL does not have; dropped");
        }
        let still: HashSet<&str> = outcome.still_unpaid.iter().map(String::as_str).collect();
        for sn in &cancels {
            let member = Task::Cancel(sn.clone()).member();
            if still.contains(sn.as_str()) {
                later.push(member);
            } else {
                done.push(member);
            }
        }
    }

    if !reminders.is_empty() {
        let (sent, unsent) = remind(scheduler, &reminders).await?;
        done.extend(sent);
        later.extend(unsent);
    }

    let retry_at = crate::clock::now().timestamp_millis() + RETRY_AFTER.as_millis() as i64;
    let mut conn = scheduler.deps.redis.bulk().await?;
    let lease = claimed.lease_end_ms;
    let mine = delay::finish(&mut conn, &scheduler.deps.keys, stock, lease, &done, None).await?
        + delay::finish(
            &mut conn,
            &scheduler.deps.keys,
            stock,
            lease,
            &later,
            Some(retry_at),
        )
        .await?;
    let handled = (done.len() + later.len()) as u64;
    if mine < handled {
        // Our lease ran out while we worked: another scheduler took those tasks over and
        // keeps them (it does them again; every step is idempotent).
        tracing::warn!(%stock, overran = handled - mine, "delay queue: tasks taken over by another scheduler after this one's lease ran out");
    }
    Ok(())
}

/// Publishes the reminders of orders still unpaid. Returns the members done (sent, or no
/// longer needed) and those to try again (the broker did not take them).
async fn remind(
    scheduler: &Scheduler,
    reminders: &[(u8, crate::domain::OrderSn)],
) -> Result<(Vec<String>, Vec<String>), StoreError> {
    let sns: Vec<&str> = reminders.iter().map(|(_, sn)| sn.as_str()).collect();
    let rows = repo::find_many(&scheduler.deps.db, &sns).await?;
    let unpaid: std::collections::HashMap<&str, &repo::OrderRow> = rows
        .iter()
        .filter(|r| r.status == OrderStatus::Unpaid)
        .map(|r| (r.order_sn.as_str(), r))
        .collect();
    let mut done = Vec::new();
    let mut to_send = Vec::new();
    for (percent, sn) in reminders {
        let member = Task::Remind {
            percent: *percent,
            order_sn: sn.clone(),
        }
        .member();
        match unpaid.get(sn.as_str()) {
            Some(row) => to_send.push((member, reminder_event(row, *percent))),
            // Paid, cancelled or unknown: nobody needs reminding.
            None => done.push(member),
        }
    }
    if to_send.is_empty() {
        return Ok((done, Vec::new()));
    }
    let events: Vec<Event> = to_send.iter().map(|(_, e)| e.clone()).collect();
    let unsent = vec![false; events.len()];
    let confirmed = match scheduler.deps.broker.publish_channel() {
        Some(channel) => {
            let events: Vec<Outbound> = events.iter().map(Outbound::Event).collect();
            let publishing = publish(&channel, scheduler.deps.broker.topology(), &events);
            // Not taken in time: sent again later, under the same message id.
            tokio::time::timeout(REMIND_WITHIN, publishing)
                .await
                .unwrap_or(unsent)
        }
        None => unsent,
    };
    let mut later = Vec::new();
    for ((member, _), ok) in to_send.into_iter().zip(&confirmed) {
        if *ok {
            done.push(member);
        } else {
            later.push(member);
        }
    }
    let sent = confirmed.iter().filter(|ok| **ok).count();
    tracing::info!(sent, unsent = later.len(), "order_remind");
    Ok((done, later))
}

fn reminder_event(row: &repo::OrderRow, percent: u8) -> Event {
    let body = json!({
        "event": REMIND,
        "order_sn": row.order_sn,
        "item_id": row.item_id,
        "user_id": row.user(),
        "stage_percent": percent,
        "pay_deadline": row.pay_deadline,
    });
    Event {
        routing_key: REMIND,
        message_id: format!("{}:remind:{percent}", row.order_sn),
        body: body.to_string().into_bytes(),
    }
}
