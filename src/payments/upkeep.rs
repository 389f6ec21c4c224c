//! The scheduler's part of payments, once a second: events held for orders that were
//! still on their way to MySQL are applied once the orders are there, and the events the
//! outbox holds (`order.refund_due`) are sent, each deleted once RabbitMQ confirmed it.

use std::time::Duration;

use crate::broker::{Event, Outbound, publish};
use crate::deps::Deps;

use super::apply::{self, PaymentError, REFUND_DUE};
use super::repo;

/// How often the step runs.
pub const EVERY: Duration = Duration::from_secs(1);
/// Outbox events sent per step at most.
const SENT_PER_STEP: u32 = 500;
/// How long a step waits for RabbitMQ's confirms (the events stay for the next step).
const CONFIRM_WITHIN: Duration = Duration::from_secs(5);

/// One step: held events applied, the outbox sent.
pub async fn step(deps: &Deps) -> Result<(), PaymentError> {
    // The outbox is sent whatever became of the held events.
    let held = apply::apply_held(deps).await;
    if let Ok(settled) = &held
        && *settled > 0
    {
        tracing::info!(settled, "held payment events settled");
    }
    send_outbox(deps).await?;
    held.map(|_| ())
}

/// Sends what the outbox holds; a message the broker did not confirm stays for the next
/// step, under the same message id (listeners drop a repeat by it).
async fn send_outbox(deps: &Deps) -> Result<(), PaymentError> {
    let queued = repo::queued(&deps.db, SENT_PER_STEP).await?;
    if queued.is_empty() {
        return Ok(());
    }
    let Some(channel) = deps.broker.publish_channel() else {
        return Ok(());
    };
    // Only this server's own topics are written there.
    let events: Vec<(u64, Event)> = queued
        .into_iter()
        .filter(|q| q.routing_key == REFUND_DUE)
        .map(|q| {
            let event = Event {
                routing_key: REFUND_DUE,
                message_id: q.message_id,
                body: q.body.into_bytes(),
            };
            (q.id, event)
        })
        .collect();
    let outbound: Vec<Outbound> = events.iter().map(|(_, e)| Outbound::Event(e)).collect();
    let confirmed = tokio::time::timeout(
        CONFIRM_WITHIN,
        publish(&channel, deps.broker.topology(), &outbound),
    )
    .await
    .unwrap_or_default();
    let sent: Vec<u64> = events
        .iter()
        .zip(confirmed)
        .filter(|(_, ok)| *ok)
        .map(|((id, _), _)| *id)
        .collect();
    repo::sent(&deps.db, &sent).await?;
    if !sent.is_empty() {
        tracing::info!(events = sent.len(), "outbox events sent");
    }
    Ok(())
}
