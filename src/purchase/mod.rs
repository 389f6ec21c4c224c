//! The purchase: `POST /api/flashbuy` ([`api`]), decided by one Lua script in Redis
//! ([`grab`]).

pub mod api;
pub mod grab;
