//! Exchanges and queues, all named after the namespace so deployments and tests sharing a
//! broker never see each other's messages.

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, ExchangeKind};

use crate::config::QueueType;

/// Deliveries of one message, on a quorum queue, before it is dead-lettered by the broker
/// itself (a message that keeps a consumer from finishing, say by crashing it).
const DELIVERY_LIMIT: i64 = 10;

#[derive(Clone, Debug)]
pub struct Topology {
    /// Direct exchange the server publishes won orders to.
    pub orders_exchange: String,
    /// Durable queue the consumer reads.
    pub orders_queue: String,
    /// Fanout exchange rejected (unparseable) messages are dead-lettered to.
    pub dead_exchange: String,
    /// Where dead letters wait for a human.
    pub dead_queue: String,
    /// Topic exchange of events for other services (`order.remind`); they bind their own
    /// queues to it.
    pub events_exchange: String,
    /// Fanout exchange on which a shop change is announced; every API instance binds a
    /// queue of its own.
    pub shops_exchange: String,
    /// What kind of queue the orders and their dead letters wait in.
    pub queue_type: QueueType,
}

pub const ORDER_PLACED: &str = "order.placed";

impl Topology {
    pub fn new(namespace: &str) -> Self {
        Self {
            orders_exchange: format!("{namespace}.orders"),
            orders_queue: format!("{namespace}.orders"),
            dead_exchange: format!("{namespace}.orders.dead"),
            dead_queue: format!("{namespace}.orders.dead"),
            events_exchange: format!("{namespace}.events"),
            shops_exchange: format!("{namespace}.shops"),
            queue_type: QueueType::Classic,
        }
    }

    /// The same names, with orders in queues of this kind.
    pub fn with_queue_type(self, queue_type: QueueType) -> Self {
        Self { queue_type, ..self }
    }

    /// Arguments every durable queue of ours is declared with.
    fn queue_args(&self) -> FieldTable {
        let mut args = FieldTable::default();
        if self.queue_type == QueueType::Quorum {
            args.insert(
                ShortString::from("x-queue-type"),
                AMQPValue::LongString("quorum".into()),
            );
        }
        args
    }

    /// Declares everything (idempotent; run on every connect).
    pub async fn declare(&self, channel: &Channel) -> lapin::Result<()> {
        let exchanges = [
            (&self.orders_exchange, ExchangeKind::Direct),
            (&self.dead_exchange, ExchangeKind::Fanout),
            (&self.events_exchange, ExchangeKind::Topic),
            (&self.shops_exchange, ExchangeKind::Fanout),
        ];
        for (name, kind) in exchanges {
            channel
                .exchange_declare(
                    name.as_str().into(),
                    kind,
                    ExchangeDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await?;
        }
        self.declare_bound(
            channel,
            &self.dead_queue,
            self.queue_args(),
            &self.dead_exchange,
            "",
        )
        .await?;
        self.declare_bound(
            channel,
            &self.orders_queue,
            self.orders_queue_args(),
            &self.orders_exchange,
            ORDER_PLACED,
        )
        .await
    }

    /// A durable queue, bound to `exchange` with `routing_key`.
    async fn declare_bound(
        &self,
        channel: &Channel,
        queue: &str,
        args: FieldTable,
        exchange: &str,
        routing_key: &str,
    ) -> lapin::Result<()> {
        let durable = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel.queue_declare(queue.into(), durable, args).await?;
        channel
            .queue_bind(
                queue.into(),
                exchange.into(),
                routing_key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
    }

    /// The order queue's arguments: a message the consumer rejects goes to the dead-letter
    /// exchange instead of being redelivered forever.
    fn orders_queue_args(&self) -> FieldTable {
        let mut args = self.queue_args();
        args.insert(
            ShortString::from("x-dead-letter-exchange"),
            AMQPValue::LongString(self.dead_exchange.as_str().into()),
        );
        if self.queue_type == QueueType::Quorum {
            // A message delivered this often without an ack dead-letters by itself, and
            // dead-lettering is confirmed (at least once) rather than fire-and-forget,
            // which quorum queues allow only when a full queue refuses new publishes.
            args.insert(
                ShortString::from("x-delivery-limit"),
                AMQPValue::LongLongInt(DELIVERY_LIMIT),
            );
            args.insert(
                ShortString::from("x-dead-letter-strategy"),
                AMQPValue::LongString("at-least-once".into()),
            );
            args.insert(
                ShortString::from("x-overflow"),
                AMQPValue::LongString("reject-publish".into()),
            );
        }
        args
    }
}
