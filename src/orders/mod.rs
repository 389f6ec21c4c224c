//! Orders: their rows in MySQL, the consumer that writes them, the owner's view and
//! actions (pay, cancel: `owner.rs`, served by `api.rs`), ending orders with their units given back, and reconciling a
//! sale's orders with its Redis state.

pub mod admin;
pub mod api;
pub mod consumer;
pub mod ending;
pub mod owner;
pub mod placed;
pub mod reconcile;
pub mod repo;
pub mod stats;
