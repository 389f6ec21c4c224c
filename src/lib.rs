//! seckill: a flash-sale HTTP API server.
//!
//! A purchase is one Lua script in Redis (stock, buyer, outbox, atomically), then a `202`;
//! RabbitMQ carries the order to MySQL, and a relay makes sure it gets there. A scheduler
//! cancels orders left unpaid and gives their units back. See
//! `docs/architecture.md` for the design and `docs/contract.md` for the contract it keeps.

pub(crate) mod app;
pub(crate) mod auth;
pub(crate) mod background;
pub(crate) mod breaker;
pub(crate) mod broker;
pub mod cli;
pub(crate) mod clock;
pub mod config;
pub(crate) mod delay_queue;
pub(crate) mod deps;
pub mod domain;
pub(crate) mod draw;
pub(crate) mod error;
pub(crate) mod health;
pub(crate) mod http;
pub(crate) mod invariants;
pub(crate) mod items;
pub(crate) mod keys;
pub(crate) mod lock;
pub(crate) mod lua;
pub(crate) mod marks;
pub(crate) mod orders;
pub(crate) mod outbox;
pub(crate) mod payments;
pub(crate) mod purchase;
pub(crate) mod queue;
pub(crate) mod rehearsal;
pub(crate) mod scheduler;
pub(crate) mod shops;
pub(crate) mod signals;
pub(crate) mod state;
pub(crate) mod store;
pub(crate) mod telemetry;
pub mod testing;
pub(crate) mod warmup;

pub use app::Server;
pub use config::{Role, Settings};
