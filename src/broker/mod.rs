//! RabbitMQ: names and declarations, a connection that heals itself, and publishing with
//! confirms.
//!
//! The server never needs the broker to answer a purchase (orders wait in the Redis outbox),
//! so it starts without one and keeps trying to connect in the background.

mod link;
mod publish;
mod topology;

pub use self::link::{Broker, CLOSE_WITHIN, Gone, Opened};
pub use self::publish::{
    CONFIRM_TIMEOUT, DeadLetter, Event, Outbound, Outgoing, publish, publish_orders,
};
pub use self::topology::Topology;
