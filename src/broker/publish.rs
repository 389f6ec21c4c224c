//! Publishing orders with confirms: the only way a message leaves this server.

use std::time::Duration;

use futures::future::join_all;
use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Channel, Confirmation};

use super::Topology;
use super::topology::ORDER_PLACED;
use crate::domain::OrderSn;

/// How long to wait for the broker's confirms of one batch before treating the batch as
/// not delivered (the outbox still holds it; the relay tries again).
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// One order on its way to the broker: its number and its JSON as `grab.lua` stored it.
#[derive(Clone, Debug)]
pub struct Outgoing {
    pub order_sn: OrderSn,
    pub payload: String,
}

/// Publishes a batch (pipelined: every message is sent before any confirm is awaited) and
/// tells, message by message, whether the broker confirmed it.
pub async fn publish_confirmed(
    channel: &Channel,
    topology: &Topology,
    orders: &[Outgoing],
) -> Vec<bool> {
    let mut confirms = Vec::with_capacity(orders.len());
    for order in orders {
        let properties = BasicProperties::default()
            // Persistent: the broker writes it to disk before it confirms.
            .with_delivery_mode(2)
            .with_content_type("application/json".into())
            .with_message_id(order.order_sn.as_str().into());
        let sent = channel
            .basic_publish(
                topology.orders_exchange.as_str().into(),
                ORDER_PLACED.into(),
                // Mandatory: a message no queue takes comes back instead of vanishing.
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                order.payload.as_bytes(),
                properties,
            )
            .await;
        match sent {
            Ok(confirm) => confirms.push(Some(confirm)),
            // The channel is broken: the rest would fail the same way.
            Err(e) => {
                tracing::debug!(error = %e, "publish failed");
                break;
            }
        }
    }
    confirms.resize_with(orders.len(), || None);
    join_all(confirms.into_iter().map(|confirm| async move {
        let confirm = confirm?;
        match tokio::time::timeout(CONFIRM_TIMEOUT, confirm).await {
            // Acked and not returned. A returned mandatory message is *also* acked
            // (`Ack(Some(returned))`): unroutable, so not delivered.
            Ok(Ok(Confirmation::Ack(None))) => Some(()),
            _ => None,
        }
    }))
    .await
    .into_iter()
    .map(|r| r.is_some())
    .collect()
}
