//! The test harness, one file per tool: where the shared services are (`shared`), each
//! test's private world on them (`env`) and what it asks of its servers (`env_calls`),
//! the events it sends other services (`events`), items (`items`), servers in-process (`server`) and as child processes (`process`),
//! private Redis and MariaDB servers (`private`), a RabbitMQ node (`private_rabbit`) and
//! a Redis Cluster (`private_cluster`), a TCP proxy to break lines with (`proxy`), nginx
//! (`nginx`), and waiting for a condition (`wait`).

mod env;
mod env_calls;
mod events;
mod galera;
mod hosts;
mod items;
mod nginx;
mod private;
mod private_cluster;
mod private_rabbit;
mod process;
mod proxy;
mod server;
mod shared;
mod wait;

pub use env::*;
pub use events::*;
pub use galera::*;
pub use hosts::*;
pub use nginx::*;
pub use private::*;
pub use private_cluster::*;
pub use private_rabbit::*;
pub use process::*;
pub use proxy::*;
pub use server::*;
pub use shared::*;
pub use wait::*;
