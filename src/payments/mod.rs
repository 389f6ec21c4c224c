//! Payments as a shop takes them: an order is paid only when the party that took the money
//! says so, in a signed event (`signature.rs`, `event.rs`), applied once per `event_id`
//! with the rules for late payments, refunds and repeats (`apply.rs`, over `repo.rs` and
//! `lua/revive.lua`); the scheduler applies events held for orders not yet in MySQL and
//! sends the outbox (`upkeep.rs`). `api.rs` is the provider's endpoint, `admin.rs` the
//! operators' list of refunds due; `send.rs` is `seckill pay`, a provider from the command
//! line. The buyer's own `pay` is a checkout
//! (`orders/owner.rs`), except under `SECKILL_PAYMENTS=trust_buyer`.

pub mod admin;
pub mod api;
pub mod apply;
pub mod event;
pub mod repo;
pub mod send;
pub mod signature;
pub mod upkeep;
