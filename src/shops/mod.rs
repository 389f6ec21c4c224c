//! Shops: opening hours in the shop's time zone, operators' overrides, and whether a shop
//! is open now (a closed shop sells nothing).

pub mod admin;
pub mod api;
pub mod cache;
pub mod changes;
pub mod hours;
pub mod repair;
pub mod repo;
