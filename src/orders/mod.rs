//! Orders: their rows in MySQL, the consumer that writes them, and the owner's view.

pub mod api;
pub mod consumer;
pub mod repo;
