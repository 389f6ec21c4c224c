//! Connections to the two stores, and the errors and time limits of talking to them.

use std::time::Duration;

mod galera;
mod given_back;
mod grouped;
mod misses;
mod mysql;
mod redis_conns;
mod replicas;

pub use self::grouped::Grouped;
pub use self::misses::MissLimit;
pub use self::mysql::{
    Db, DbError, STORABLE, begin as mysql_begin, connect_mysql, migrate, retrying_deadlocks,
    storable, timed as mysql_timed, timed_within as mysql_timed_within, to_millis,
};
pub use self::redis_conns::{RedisConn, RedisConns, RedisError, timed as redis_timed};
pub use self::replicas::{Replication, ShortOfReplicas, WaitRule};

/// A failure of either store, for work that needs both (ending orders, the scheduler).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Database(#[from] DbError),
    #[error(transparent)]
    Redis(#[from] RedisError),
}

/// `From<DbError>` and `From<RedisError>` for an operation's error whose `Store` variant
/// holds a [`StoreError`], so that `?` takes either store's error as it is.
macro_rules! from_either_store {
    ($error:ident) => {
        impl From<$crate::store::DbError> for $error {
            fn from(e: $crate::store::DbError) -> Self {
                $error::Store(e.into())
            }
        }

        impl From<$crate::store::RedisError> for $error {
            fn from(e: $crate::store::RedisError) -> Self {
                $error::Store(e.into())
            }
        }
    };
}
pub(crate) use from_either_store;

/// How long one store call may take before the request gives up on it, leaving room in the
/// contract's one-second budget for everything else.
pub const STORE_TIMEOUT: Duration = Duration::from_millis(800);

/// How long a write may wait for its replicas (`SECKILL_REDIS_WAIT_REPLICAS`) before it
/// counts as not held: a won unit's buyer is told `503` well inside the one second.
pub const WAIT_FOR_REPLICAS: Duration = Duration::from_millis(300);
