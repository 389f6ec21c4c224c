//! Listening to the events a test's server sends other services (`order.remind`,
//! `order.refund_due`) on its topic exchange.

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ExchangeKind};

use super::{TestEnv, amqp_url};

/// A queue of the test's own (`{namespace}.{name}`, gone with its connection) bound to
/// the events exchange with `binding`, declared before the server sends anything: the
/// connection (keep it), a channel to read with, and the queue's name.
pub async fn listen_for_events(
    env: &TestEnv,
    name: &str,
    binding: &str,
) -> (Connection, Channel, String) {
    let conn = Connection::connect(&amqp_url(), Default::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let topology = env.topology();
    channel
        .exchange_declare(
            topology.events_exchange.as_str().into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let queue = format!("{}.{name}", env.settings.namespace);
    let exclusive = QueueDeclareOptions {
        exclusive: true,
        ..Default::default()
    };
    channel
        .queue_declare(queue.as_str().into(), exclusive, FieldTable::default())
        .await
        .unwrap();
    channel
        .queue_bind(
            queue.as_str().into(),
            topology.events_exchange.as_str().into(),
            binding.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    (conn, channel, queue)
}
