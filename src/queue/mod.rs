//! The waiting room in front of a sale (`"queue": {…}` on an item, `crate::items::queue_plan`;
//! docs/sale-shapes.md, "A waiting room"): buyers take a place in a line ([`line`]), a scheduler lets them in
//! in the line's order, never more than the stock could still honour ([`admit`]), and
//! each one let in buys with a pass checked in memory ([`pass`]). Before `start_at` the
//! line is a pre-queue ordered by the draw's rank under a seed committed to in advance;
//! after it, arrivals queue in Redis's order. Buyers see where they stand ([`view`]),
//! by a read or a Server-Sent Events stream fed by one watch per item and instance
//! ([`watch`]). The HTTP surface: [`api`] (buyers) and [`admin`] (operators).

pub mod admin;
pub mod admit;
pub mod api;
pub mod line;
pub mod pass;
pub mod view;
pub mod watch;

use crate::keys::Keys;
use crate::store::RedisConns;

/// What the waiting room's handlers share: the signing keys and the streams' watches.
pub struct Waiting {
    pub signer: pass::Signer,
    pub watches: watch::Watches,
}

impl Waiting {
    pub fn new(jwt_secret: &str, redis: &RedisConns, keys: &Keys) -> Self {
        Self {
            signer: pass::Signer::new(jwt_secret),
            watches: watch::Watches::new(redis.clone(), keys.clone()),
        }
    }
}
