//! seckill: a flash-sale HTTP API server.
//!
//! A purchase is one Lua script in Redis (stock, buyer, outbox, atomically), then a `202`;
//! RabbitMQ carries the order to MySQL, and a relay makes sure it gets there. A scheduler
//! cancels orders left unpaid and gives their units back. See
//! `docs/architecture.md` for the design and `docs/contract.md` for the contract it keeps.

pub mod app;
pub mod auth;
pub mod background;
pub mod breaker;
pub mod broker;
pub mod clock;
pub mod config;
pub mod delay_queue;
pub mod deps;
pub mod domain;
pub mod draw;
pub mod error;
pub mod health;
pub mod http;
pub mod invariants;
pub mod items;
pub mod keys;
pub mod lock;
pub mod lua;
pub mod marks;
pub mod orders;
pub mod outbox;
pub mod purchase;
pub mod rehearsal;
pub mod scheduler;
pub mod shops;
pub mod signals;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod warmup;

pub use app::Server;
pub use config::{Role, Settings};
pub use state::AppState;
