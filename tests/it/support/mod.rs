//! The test harness, one file per tool: each test's private world on the shared services
//! (`env`), items (`items`), servers in-process (`server`) and as child processes
//! (`process`), private Redis/RabbitMQ/MariaDB servers and clusters (`private`), a TCP
//! proxy to break lines with (`proxy`), nginx (`nginx`), and waiting for a condition
//! (`wait`).

mod env;
mod galera;
mod hosts;
mod items;
mod nginx;
mod private;
mod process;
mod proxy;
mod server;
mod wait;

pub use env::*;
pub use galera::*;
pub use hosts::*;
pub use nginx::*;
pub use private::*;
pub use process::*;
pub use proxy::*;
pub use server::*;
pub use wait::*;
