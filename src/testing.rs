//! What the tests (`tests/it`) and the load-test tools (`loadtest/*.rs`) reach inside the
//! server for: keys to read Redis as the server lays it out, scripts to call directly, the
//! order table, the background parts a test drives by hand, and the invariants' judge.
//! Everything else in the crate is `pub(crate)`: an internal rename changes this file, not
//! the tests. Not an API for anyone else; it changes with the server.

pub use crate::app::listen;
pub use crate::auth::Jwt;
pub use crate::broker::{Broker, Topology};
pub use crate::http::error::Conflict;
/// `lend.lua` as a borrowing purchase runs it, for tests that cut a transfer off by hand.
pub use crate::items::transfer::lend;
pub use crate::keys::{ItemKeys, Keys, QueueKeys};
pub use crate::marks::Work;
pub use crate::orders::repo::{HeldOverTime, OrderStatus, held_over_time, insert_batch};
pub use crate::outbox::relay::Relay;
pub use crate::payments::signature::{HEADER as PAYMENT_SIGNATURE, sign as sign_payment};
pub use crate::purchase::grab::grab;
/// A waiting room's admission step and a warm-up's hold of it, as the scheduler and the
/// warm-up run them, for tests that interleave them by hand.
pub use crate::queue::line::{
    BeforeStock, StepRules, free_after_reload, hold_for_reload, step as queue_step,
};
pub use crate::store::{DbError, RedisConns, connect_mysql, migrate};
pub use crate::telemetry::Meters;

/// The scripts, preloaded as the server does, and the ones tests call or watch for.
pub mod lua {
    pub use crate::lua::{
        QUEUE_JOIN, QUEUE_TAKE, QUEUE_WHERE, RECEIVE, RELEASE, RULES_SET, preload,
    };
}

/// The deadline queue's claim and finish, which a test drives to check its lease.
pub mod delay_queue {
    pub use crate::delay_queue::{claim, finish};
}

/// The lock a shop change takes, which a test takes and drops by hand.
pub mod shop_changes {
    pub use crate::shops::changes::lock;
}

/// An item's row, as the draw reads it.
pub mod items {
    pub use crate::items::repo::get;
}

/// The retention pass's steps — the items due, retiring one — which a test runs by hand
/// around a change of the item.
pub mod retire {
    pub use crate::items::repo::due_for_retirement;
    pub use crate::items::retire::{Retirement, retire};
}

/// A draw's ranking and its award, which a test runs twice at once.
pub mod draw {
    pub use crate::draw::{award::draw, rank::rank};
}

/// The invariants of the contract's section 7, judged as `seckill rehearse` judges them.
pub mod invariants {
    pub use crate::invariants::{InRedis, Orders, Outcome, judge, missing};
}
