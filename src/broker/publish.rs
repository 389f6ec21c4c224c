//! Publishing to RabbitMQ: one typed message ([`Outbound`]) and one [`publish`], the only
//! way a message leaves this server.

use std::time::Duration;

use futures::future::join_all;
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, PublisherConfirm};

use super::Topology;
use super::link::CLOSE_WITHIN;
use super::topology::ORDER_PLACED;
use crate::domain::OrderSn;

/// How long to wait for the broker's confirms of one batch before treating the batch as
/// not delivered (the outbox still holds it; the relay tries again).
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// One order on its way to the broker: its number, its JSON as `grab.lua` stored it, and
/// when it was won (ms: its outbox entry's score until the broker confirms it).
#[derive(Clone, Debug)]
pub struct Outgoing {
    pub order_sn: OrderSn,
    pub payload: String,
    pub won_at_ms: i64,
}

/// Orders carried by one AMQP message. One persistent, confirmed message per order costs
/// the broker more CPU than everything else on the purchase path together (measured: with
/// it, the path ran at 0.4 of its speed without a broker). Much of the broker's cost is
/// per message, whatever it holds: 500 orders (about 70 KB) cost it about a quarter less
/// per order than 100 at a sale's pace (docs/benchmarks.md). The consumer batches by
/// bytes, not messages, so a fuller message does not make a bigger transaction.
pub const ORDERS_PER_MESSAGE: usize = 500;

/// An event for other services (reminders, …) on the topic exchange `{namespace}.events`.
#[derive(Clone, Debug)]
pub struct Event {
    /// Also the topic: `order.remind`, …
    pub routing_key: &'static str,
    /// The same for every send of one event, so a listener can drop a repeat.
    pub message_id: String,
    pub body: Vec<u8>,
}

/// A message set aside for a human, with why.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    pub body: Vec<u8>,
    /// Why it could not be handled: in the `x-seckill-reason` header.
    pub reason: String,
}

/// Everything that leaves this server for RabbitMQ.
#[derive(Clone, Copy, Debug)]
pub enum Outbound<'a> {
    /// Up to [`ORDERS_PER_MESSAGE`] won orders as one JSON array: persistent, and
    /// mandatory (a message no queue takes comes back instead of vanishing).
    Orders(&'a [Outgoing]),
    /// An event for other services: persistent, not mandatory (an event nobody listens
    /// to yet is not an error).
    Event(&'a Event),
    /// A message set aside for a human, with why, to the dead-letter exchange.
    DeadLetter(&'a DeadLetter),
    /// A hint to every instance that a shop changed: not persistent and not waited for
    /// (a lost one costs at most the shops cache's one second).
    ShopChanged(u64),
}

impl Outbound<'_> {
    fn message<'t>(&self, topology: &'t Topology) -> Message<'t> {
        match self {
            Outbound::Orders(orders) => Message {
                exchange: &topology.orders_exchange,
                routing_key: ORDER_PLACED,
                mandatory: true,
                body: json_array(orders),
                properties: persistent_json(),
            },
            Outbound::Event(event) => Message {
                exchange: &topology.events_exchange,
                routing_key: event.routing_key,
                mandatory: false,
                body: event.body.clone(),
                properties: persistent_json().with_message_id(event.message_id.as_str().into()),
            },
            Outbound::DeadLetter(letter) => {
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
            }
            Outbound::ShopChanged(shop) => Message {
                exchange: &topology.shops_exchange,
                routing_key: "",
                mandatory: false,
                body: shop.to_string().into_bytes(),
                properties: BasicProperties::default(),
            },
        }
    }

    /// Whether the sender waits for the broker to confirm it.
    fn awaits_confirm(&self) -> bool {
        !matches!(self, Outbound::ShopChanged(_))
    }
}

/// Publishes messages — every one sent before any confirm is awaited — and tells, message
/// by message, whether the broker took it (confirmed within [`CONFIRM_TIMEOUT`], and not
/// returned). After a send fails the channel is broken: the rest are not sent and count
/// as not taken. The one way a message leaves this server.
pub async fn publish(
    channel: &Channel,
    topology: &Topology,
    outbound: &[Outbound<'_>],
) -> Vec<bool> {
    let mut confirms = Vec::with_capacity(outbound.len());
    for item in outbound {
        let message = item.message(topology);
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
            Ok(confirm) => confirms.push(Sent::Confirm(confirm, item.awaits_confirm())),
            Err(e) => {
                tracing::debug!(error = %e, exchange = message.exchange, "publish failed");
                break;
            }
        }
    }
    confirms.resize_with(outbound.len(), || Sent::Not);
    let (taken, trouble) = await_confirms(confirms).await;
    if let Some(trouble) = trouble {
        // A quorum queue's publisher state lives in the channel: one that registered
        // while the queue's leader was being replaced (a node had just died) was seen to
        // nack every later publish, for minutes, while other channels published fine. A
        // nack is never routine here (no queue has a length limit), so the channel goes:
        // the link then reconnects, and the next publish registers afresh. No answer at
        // all is a node gone silent (its host cut off, its socket still open): the link
        // moves on to the next node rather than wait for the heartbeat to notice.
        tracing::warn!("the broker {trouble}: opening a new publishing channel");
        // Not waited for: a silent node never answers the close either, and the caller
        // (an order batch, a deadline pass) has waited long enough. Closing marks the
        // channel at once, which the link's supervisor sees.
        let channel = channel.clone();
        tokio::spawn(async move {
            let closing = channel.close(200, "reopening".into());
            let _ = tokio::time::timeout(CLOSE_WITHIN, closing).await;
        });
    }
    taken
}

/// Why a publishing channel is given up.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Trouble {
    Nacked,
    Silent,
}

impl std::fmt::Display for Trouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Trouble::Nacked => write!(f, "refused a message (nack)"),
            Trouble::Silent => write!(f, "confirmed nothing within {CONFIRM_TIMEOUT:?}"),
        }
    }
}

/// Publishes orders, [`ORDERS_PER_MESSAGE`] to a message, and tells, order by order,
/// whether the broker took it.
pub async fn publish_orders(
    channel: &Channel,
    topology: &Topology,
    orders: &[Outgoing],
) -> Vec<bool> {
    let messages: Vec<Outbound> = orders
        .chunks(ORDERS_PER_MESSAGE)
        .map(Outbound::Orders)
        .collect();
    let taken = publish(channel, topology, &messages).await;
    orders
        .chunks(ORDERS_PER_MESSAGE)
        .zip(taken)
        .flat_map(|(message, ok)| std::iter::repeat_n(ok, message.len()))
        .collect()
}

/// One AMQP message to send.
struct Message<'a> {
    exchange: &'a str,
    routing_key: &'a str,
    mandatory: bool,
    body: Vec<u8>,
    properties: BasicProperties,
}

/// A publish as sent: its confirm, and whether to wait for it; or never sent.
enum Sent {
    Confirm(PublisherConfirm, bool),
    Not,
}

/// Persistent (the broker writes it to disk before it confirms), JSON.
fn persistent_json() -> BasicProperties {
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
}

/// Waits for each publish's confirm where one is awaited (up to [`CONFIRM_TIMEOUT`]):
/// whether each was taken, and whether the broker nacked any or left one unanswered.
async fn await_confirms(sent: Vec<Sent>) -> (Vec<bool>, Option<Trouble>) {
    let outcomes = join_all(sent.into_iter().map(|sent| async move {
        match sent {
            Sent::Not => Ok(false),
            Sent::Confirm(_, false) => Ok(true),
            // Acked and not returned. A returned mandatory message is *also* acked
            // (`Ack(Some(returned))`): unroutable, so not delivered.
            Sent::Confirm(confirm, true) => {
                match tokio::time::timeout(CONFIRM_TIMEOUT, confirm).await {
                    Ok(Ok(Confirmation::Ack(None))) => Ok(true),
                    // Said, since the relay would otherwise just try again, unseen.
                    Ok(Ok(Confirmation::Ack(Some(returned)))) => {
                        tracing::warn!(reply = %returned.reply_text, "the broker returned a message: no queue took it");
                        Ok(false)
                    }
                    Ok(Ok(Confirmation::Nack(_))) => Err(Trouble::Nacked),
                    Err(_) => Err(Trouble::Silent),
                    Ok(Ok(Confirmation::NotRequested)) | Ok(Err(_)) => Ok(false),
                }
            }
        }
    }))
    .await;
    let trouble = outcomes.iter().find_map(|o| o.err());
    (
        outcomes.into_iter().map(|o| o == Ok(true)).collect(),
        trouble,
    )
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
    use crate::domain::{BucketId, ItemId, OrderPlaced};

    #[test]
    fn a_message_is_a_json_array_of_the_stored_orders() {
        let orders: Vec<Outgoing> = (1..=3)
            .map(|user| {
                let order = OrderPlaced {
                    order_sn: OrderSn::generate(BucketId::whole(ItemId::new(5).unwrap()), false),
                    item_id: ItemId::new(5).unwrap(),
                    user_id: crate::domain::UserId::new(user),
                    created_at_ms: 1,
                    pay_deadline_ms: 2,
                    slot: 0,
                };
                Outgoing {
                    payload: serde_json::to_string(&order).unwrap(),
                    order_sn: order.order_sn,
                    won_at_ms: order.created_at_ms,
                }
            })
            .collect();
        let back: Vec<OrderPlaced> = serde_json::from_slice(&json_array(&orders)).unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!(back[2].order_sn, orders[2].order_sn);
        assert_eq!(json_array(&[]), b"[]");
    }
}
