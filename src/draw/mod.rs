//! Draws (`"mode": "draw"`): between `start_at` and `draw_at` a press is an entry
//! (`crate::purchase::entry`); at `draw_at` the scheduler (`crate::scheduler`'s draw pass)
//! gives the units to the entries of lowest rank ([`award`]), and passes a cancelled or timed-out winner's unit to the next
//! entry by rank until `end_at`; a buyer asks how they fared at `my-entry` ([`api`]).
//! The ranks and the seed that fixes them in advance: [`rank`]; which draws are coming is
//! kept with the items that name them (`crate::items::draw_schedule`).

pub mod api;
pub mod award;
pub mod entry;
pub mod rank;
