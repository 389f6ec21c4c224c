//! A lock in Redis: `SET key token NX PX ms` with a random token, released only by its
//! holder (`lua/unlock.lua`), so a holder that outlived its lock never frees another's.
//! A holder that dies leaves the lock to expire.

use std::time::{Duration, Instant};

use crate::lua::{UNLOCK, UNLOCK_CODE};
use crate::store::{Grouped, RedisConns, RedisError, redis_timed};

/// How often a waiting taker tries again.
const RETRY_EVERY: Duration = Duration::from_millis(20);

pub struct RedisLock {
    key: String,
    token: String,
}

impl RedisLock {
    /// Takes the lock for `hold_for` if nobody holds it; `None` if somebody does.
    pub async fn try_take(
        redis: &RedisConns,
        key: String,
        hold_for: Duration,
    ) -> Result<Option<Self>, RedisError> {
        Self::take_within(redis, key, hold_for, Duration::ZERO).await
    }

    /// Takes the lock, waiting up to `wait` for its holder to let go.
    pub async fn take_within(
        redis: &RedisConns,
        key: String,
        hold_for: Duration,
        wait: Duration,
    ) -> Result<Option<Self>, RedisError> {
        let lock = Self {
            key,
            token: ulid::Ulid::new().to_string(),
        };
        let deadline = Instant::now() + wait;
        loop {
            let taken: Option<String> = {
                let mut conn = redis.bulk().await?;
                redis_timed(
                    redis::cmd("SET")
                        .arg(&lock.key)
                        .arg(&lock.token)
                        .arg("NX")
                        .arg("PX")
                        .arg(hold_for.as_millis() as u64)
                        .query_async(&mut conn),
                )
                .await?
            };
            if taken.is_some() {
                return Ok(Some(lock));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(RETRY_EVERY).await;
        }
    }

    /// Takes many locks at once (one pipelined round trip): each `None` where somebody
    /// holds it.
    pub async fn try_take_many(
        redis: &RedisConns,
        keys: Vec<String>,
        hold_for: Duration,
    ) -> Result<Vec<Option<Self>>, RedisError> {
        let locks: Vec<Self> = keys
            .into_iter()
            .map(|key| Self {
                key,
                token: ulid::Ulid::new().to_string(),
            })
            .collect();
        let mut grouped = Grouped::new(redis);
        for lock in &locks {
            grouped
                .group()
                .cmd("SET")
                .arg(&lock.key)
                .arg(&lock.token)
                .arg("NX")
                .arg("PX")
                .arg(hold_for.as_millis() as u64);
        }
        let taken: Vec<(Option<String>,)> = grouped.query(redis).await?;
        Ok(locks
            .into_iter()
            .zip(taken)
            .map(|(lock, (taken,))| taken.map(|_| lock))
            .collect())
    }

    /// Releases many locks at once (one pipelined round trip), each only if still ours.
    pub async fn release_many(redis: &RedisConns, locks: Vec<Self>) -> Result<(), RedisError> {
        if locks.is_empty() {
            return Ok(());
        }
        redis.load_script(UNLOCK_CODE).await?;
        let mut grouped = Grouped::new(redis);
        for lock in &locks {
            grouped
                .group()
                .cmd("EVALSHA")
                .arg(UNLOCK.get_hash())
                .arg(1)
                .arg(&lock.key)
                .arg(&lock.token);
        }
        grouped.run(redis).await
    }

    /// What every holder does when done: [`RedisLock::release`], or, when Redis does not
    /// answer, a warning and the lock left to expire by itself.
    pub async fn let_go(self, redis: &RedisConns) {
        let key = self.key.clone();
        if let Err(e) = self.release(redis).await {
            tracing::warn!(lock = %key, error = %e, "could not release a lock; it expires by itself");
        }
    }

    /// Releases the lock if it is still ours (it may have expired and been taken by
    /// another). Returns whether it was ours.
    pub async fn release(self, redis: &RedisConns) -> Result<bool, RedisError> {
        let mut conn = redis.bulk().await?;
        let released: i64 = redis_timed(
            UNLOCK
                .key(&self.key)
                .arg(&self.token)
                .invoke_async(&mut conn),
        )
        .await?;
        Ok(released == 1)
    }
}
