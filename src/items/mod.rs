//! Items on sale: their record in MySQL, their stock in Redis, every instance's in-memory
//! catalogue, units lent between buckets, retiring an ended sale from Redis, writing
//! items (`write`) and which draws are coming (`draw_schedule`), and the HTTP endpoints of
//! operators and storefronts. (Loading units into Redis: `crate::warmup`.)

pub mod admin;
pub mod api;
pub mod body;
pub mod bulk;
pub mod catalog;
pub mod draw_schedule;
pub mod queue_plan;
pub mod regroup;
pub mod repo;
pub mod retire;
pub mod stock;
pub mod transfer;
pub mod waves;
pub mod write;
