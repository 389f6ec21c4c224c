//! The purchase: `POST /api/flashbuy` ([`api`]), the sale of a unit ([`sell`]) decided by
//! one Lua script in Redis ([`grab`]), a refusal answered by [`refusal`]; on a draw's item,
//! an entry ([`entry`]).

pub mod api;
pub mod entry;
pub mod grab;
mod refusal;
pub mod sell;
