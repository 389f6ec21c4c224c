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
    let confirmed = publish_pipelined(
        channel,
        messages.iter().map(|orders| Message {
            exchange: &topology.orders_exchange,
            routing_key: ORDER_PLACED,
            // Mandatory: a message no queue takes comes back instead of vanishing.
            mandatory: true,
            body: json_array(orders),
            properties: persistent_json(),
        }),
    )
    .await;
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
    publish_pipelined(
        channel,
        events.iter().map(|event| Message {
            exchange: &topology.events_exchange,
            routing_key: event.routing_key,
            mandatory: false,
            body: event.body.clone(),
            properties: persistent_json().with_message_id(event.message_id.as_str().into()),
        }),
    )
    .await
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
    let confirmed = publish_pipelined(
        channel,
        letters.iter().map(|letter| {
            let mut headers = FieldTable::default();
            headers.insert(
                ShortString::from("x-seckill-reason"),
                AMQPValue::LongString(letter.reason.as_str().into()),
            );
            Message {
                exchange: &topology.dead_exchange,
                routing_key: "",
                mandatory: false,
                body: letter.body.clone(),
                properties: persistent_json().with_headers(headers),
            }
        }),
    )
    .await;
    confirmed.into_iter().all(|ok| ok)
}

/// One AMQP message to send.
struct Message<'a> {
    exchange: &'a str,
    routing_key: &'a str,
    mandatory: bool,
    body: Vec<u8>,
    properties: BasicProperties,
}

/// Persistent (the broker writes it to disk before it confirms), JSON.
fn persistent_json() -> BasicProperties {
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
}

/// Sends every message before awaiting any confirm, and tells, message by message,
/// whether the broker confirmed it (within [`CONFIRM_TIMEOUT`]). After a send fails the
/// channel is broken: the rest are not sent and count as not confirmed.
async fn publish_pipelined<'a>(
    channel: &Channel,
    messages: impl ExactSizeIterator<Item = Message<'a>>,
) -> Vec<bool> {
    let count = messages.len();
    let mut confirms = Vec::with_capacity(count);
    for message in messages {
        let sent = channel
            .basic_publish(
                message.exchange.into(),
                message.routing_key.into(),
                BasicPublishOptions {
                    mandatory: message.mandatory,
                    ..Default::default()
                },
                &message.body,
                message.properties,
            )
            .await;
        match sent {
            Ok(confirm) => confirms.push(Some(confirm)),
            Err(e) => {
                tracing::debug!(error = %e, exchange = message.exchange, "publish failed");
                break;
            }
        }
    }
    confirms.resize_with(count, || None);
    await_confirms(confirms).await
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
    use crate::domain::{ItemId, OrderPlaced, Stock};

    #[test]
    fn a_message_is_a_json_array_of_the_stored_orders() {
        let orders: Vec<Outgoing> = (1..=3)
            .map(|user| {
                let order = OrderPlaced {
                    order_sn: OrderSn::generate(Stock::whole(ItemId::new(5).unwrap()), false),
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
