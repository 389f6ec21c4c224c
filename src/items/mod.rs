//! Items on sale: their record in MySQL, their stock in Redis, every instance's in-memory
//! catalogue, warm-up, and the HTTP endpoints of operators and storefronts.

pub mod admin;
pub mod api;
pub mod bulk;
pub mod catalog;
pub mod fresh;
pub mod repo;
pub mod stock;
pub mod transfer;
pub mod warmup;
