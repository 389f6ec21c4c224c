//! Orders: their rows in MySQL, the consumer that writes them, the owner's view and
//! actions (pay, cancel), and ending orders with their units given back.

pub mod api;
pub mod consumer;
pub mod ending;
pub mod placed;
pub mod repo;
