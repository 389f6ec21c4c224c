//! Keyspace notifications as a wake-up hint. When an order's deadline or reminder is
//! scheduled, a key named after that second is set to expire then (`Keys::wake`); Redis
//! announces the expiry on `__keyevent@DB__:expired` and every listening scheduler looks
//! at the delay queue at once instead of at its next poll. Only a hint: an event nobody
//! hears is lost, and the sorted set stays the truth.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::keys::Keys;
use crate::store::{RedisConns, RedisError, redis_timed};

/// Turns expiry events on in Redis if they are off (adding `Ex` to what is set), then
/// relays the expiries of wake keys to `wake` until shutdown. Where Redis refuses
/// `CONFIG` (managed services often do), says so once and leaves waking to the poll.
pub async fn listen(redis: RedisConns, keys: Keys, wake: Arc<Notify>, shutdown: CancellationToken) {
    let channel = format!("__keyevent@{}__:expired", redis.db());
    let prefix = keys.wake_prefix();
    loop {
        match enable(&redis).await {
            Ok(flags) => {
                tracing::info!(%channel, flags, "keyspace notifications wake the scheduler");
                break;
            }
            Err(Refused::Config(e)) => {
                tracing::warn!(error = %e, "Redis refuses to turn keyspace notifications on (CONFIG SET notify-keyspace-events Ex); the scheduler relies on polling (SECKILL_SCHEDULER_POLL_MS). Set it in redis.conf, or SECKILL_KEYSPACE_EVENTS=false to silence this");
                return;
            }
            Err(Refused::Redis(e)) => {
                tracing::debug!(error = %e, "keyspace notifications: Redis not reachable yet");
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    // A restarted Redis forgets a `CONFIG SET`: look again now and then.
    let recheck = tokio::spawn(keep_enabled(redis.clone(), shutdown.clone()));
    // Whatever expired while nobody listened is found by the next poll.
    redis
        .listen(&channel, &shutdown, |message| match message {
            Some(m) if !m.get_payload_bytes().starts_with(prefix.as_bytes()) => {}
            _ => wake.notify_one(),
        })
        .await;
    let _ = recheck.await;
}

async fn keep_enabled(redis: RedisConns, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(RECHECK_EVERY) => {}
        }
        if let Err(Refused::Config(e)) = enable(&redis).await {
            tracing::warn!(error = %e, "Redis no longer lets keyspace notifications be turned on; the scheduler relies on polling");
            return;
        }
    }
}

/// How often the setting is checked again.
const RECHECK_EVERY: Duration = Duration::from_secs(30);

enum Refused {
    /// Redis answered, and said no.
    Config(redis::RedisError),
    Redis(RedisError),
}

/// Makes sure `notify-keyspace-events` includes expiry events; returns the flags now set.
async fn enable(redis: &RedisConns) -> Result<String, Refused> {
    let mut conn = redis.bulk().await.map_err(Refused::Redis)?;
    let current: Vec<String> = redis_timed(
        redis::cmd("CONFIG")
            .arg("GET")
            .arg("notify-keyspace-events")
            .query_async(&mut conn),
    )
    .await
    .map_err(refused)?;
    let mut flags = current.get(1).cloned().unwrap_or_default();
    let keyevents = flags.contains('E');
    let expiries = flags.contains('x') || flags.contains('A');
    if keyevents && expiries {
        return Ok(flags);
    }
    if !keyevents {
        flags.push('E');
    }
    if !expiries {
        flags.push('x');
    }
    redis_timed(
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("notify-keyspace-events")
            .arg(&flags)
            .query_async::<()>(&mut conn),
    )
    .await
    .map_err(refused)?;
    Ok(flags)
}

fn refused(e: RedisError) -> Refused {
    match e {
        RedisError::Command(e)
            if !e.is_io_error() && !e.is_connection_dropped() && !e.is_timeout() =>
        {
            Refused::Config(e)
        }
        other => Refused::Redis(other),
    }
}
