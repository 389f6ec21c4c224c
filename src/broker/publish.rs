//! Publishing orders with confirms: the only way a message leaves this server.

use std::time::Duration;

use futures::future::join_all;
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, PublisherConfirm};

use super::Topology;
use super::topology::ORDER_PLACED;
use crate::domain::OrderSn;

/// How long to wait for the broker's confirms of one batch before treating the batch as
/// not delivered (the outbox still holds it; the relay tries again).
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// One order on its way to the broker: its number and its JSON as `grab.lua` stored it.
#[derive(Clone, Debug)]
pub struct Outgoing {
    pub order_sn: OrderSn,
    pub payload: String,
}

/// Orders carried by one AMQP message. One persistent, confirmed message per order costs
/// the broker more CPU than everything else on the purchase path together (measured: with
/// it, the path ran at 0.4 of its speed without a broker); a hundred per message makes the
/// broker's share small while a message stays well under 100 KB.
pub const ORDERS_PER_MESSAGE: usize = 100;

/// Publishes orders (pipelined: every message is sent before any confirm is awaited), up
/// to [`ORDERS_PER_MESSAGE`] per message as a JSON array, and tells, order by order,
/// whether the broker confirmed it.
pub async fn publish_confirmed(
    channel: &Channel,
    topology: &Topology,
    orders: &[Outgoing],
) -> Vec<bool> {
    let messages: Vec<&[Outgoing]> = orders.chunks(ORDERS_PER_MESSAGE).collect();
    let mut confirms = Vec::with_capacity(messages.len());
    for message in &messages {
        let properties = BasicProperties::default()
            // Persistent: the broker writes it to disk before it confirms.
            .with_delivery_mode(2)
            .with_content_type("application/json".into());
        let sent = channel
            .basic_publish(
                topology.orders_exchange.as_str().into(),
                ORDER_PLACED.into(),
                // Mandatory: a message no queue takes comes back instead of vanishing.
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                &json_array(message),
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
    confirms.resize_with(messages.len(), || None);
    let confirmed = await_confirms(confirms).await;
    messages
        .iter()
        .zip(confirmed)
        .flat_map(|(message, ok)| std::iter::repeat_n(ok, message.len()))
        .collect()
}

/// An event for other services (reminders, …) on the topic exchange `{namespace}.events`.
#[derive(Clone, Debug)]
pub struct Event {
    /// Also the topic: `order.remind`, …
    pub routing_key: &'static str,
    /// The same for every send of one event, so a listener can drop a repeat.
    pub message_id: String,
    pub body: Vec<u8>,
}

/// Publishes events (pipelined, persistent, confirmed) and tells which the broker took.
/// Not mandatory: an event nobody listens to yet is not an error.
pub async fn publish_events(channel: &Channel, topology: &Topology, events: &[Event]) -> Vec<bool> {
    let mut confirms = Vec::with_capacity(events.len());
    for event in events {
        let properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into())
            .with_message_id(event.message_id.as_str().into());
        let sent = channel
            .basic_publish(
                topology.events_exchange.as_str().into(),
                event.routing_key.into(),
                BasicPublishOptions::default(),
                &event.body,
                properties,
            )
            .await;
        match sent {
            Ok(confirm) => confirms.push(Some(confirm)),
            Err(e) => {
                tracing::debug!(error = %e, "event publish failed");
                break;
            }
        }
    }
    confirms.resize_with(events.len(), || None);
    await_confirms(confirms).await
}

/// A message set aside for a human, with why.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    pub body: Vec<u8>,
    /// Why it could not be handled: in the `x-seckill-reason` header.
    pub reason: String,
}

/// Publishes dead letters to the dead-letter exchange (persistent, confirmed) and tells
/// whether the broker took all of them.
pub async fn publish_dead_letters(
    channel: &Channel,
    topology: &Topology,
    letters: &[DeadLetter],
) -> bool {
    let mut confirms = Vec::with_capacity(letters.len());
    for letter in letters {
        let mut headers = FieldTable::default();
        headers.insert(
            ShortString::from("x-seckill-reason"),
            AMQPValue::LongString(letter.reason.as_str().into()),
        );
        let properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into())
            .with_headers(headers);
        let sent = channel
            .basic_publish(
                topology.dead_exchange.as_str().into(),
                "".into(),
                BasicPublishOptions::default(),
                &letter.body,
                properties,
            )
            .await;
        match sent {
            Ok(confirm) => confirms.push(Some(confirm)),
            Err(e) => {
                tracing::debug!(error = %e, "dead-letter publish failed");
                break;
            }
        }
    }
    confirms.resize_with(letters.len(), || None);
    await_confirms(confirms).await.into_iter().all(|ok| ok)
}

/// Waits for each publish's confirm (up to [`CONFIRM_TIMEOUT`]); `None`: never sent.
async fn await_confirms(confirms: Vec<Option<PublisherConfirm>>) -> Vec<bool> {
    join_all(confirms.into_iter().map(|confirm| async move {
        let Some(confirm) = confirm else {
            return false;
        };
        // Acked and not returned. A returned mandatory message is *also* acked
        // (`Ack(Some(returned))`): unroutable, so not delivered.
        matches!(
            tokio::time::timeout(CONFIRM_TIMEOUT, confirm).await,
            Ok(Ok(Confirmation::Ack(None)))
        )
    }))
    .await
}

/// The orders' JSON, as `grab.lua` stored it, joined into one array (nothing re-encoded).
fn json_array(orders: &[Outgoing]) -> Vec<u8> {
    let mut body =
        Vec::with_capacity(orders.iter().map(|o| o.payload.len() + 1).sum::<usize>() + 2);
    body.push(b'[');
    for (i, order) in orders.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(order.payload.as_bytes());
    }
    body.push(b']');
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ItemId, OrderPlaced};

    #[test]
    fn a_message_is_a_json_array_of_the_stored_orders() {
        let orders: Vec<Outgoing> = (1..=3)
            .map(|user| {
                let order = OrderPlaced {
                    order_sn: OrderSn::generate(ItemId::new(5).unwrap()),
                    item_id: ItemId::new(5).unwrap(),
                    user_id: crate::domain::UserId::new(user),
                    created_at_ms: 1,
                    pay_deadline_ms: 2,
                };
                Outgoing {
                    payload: serde_json::to_string(&order).unwrap(),
                    order_sn: order.order_sn,
                }
            })
            .collect();
        let back: Vec<OrderPlaced> = serde_json::from_slice(&json_array(&orders)).unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!(back[2].order_sn, orders[2].order_sn);
        assert_eq!(json_array(&[]), b"[]");
    }
}
