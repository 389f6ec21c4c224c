//! The fleet's clock: Redis's `TIME`, as this process last measured its own clock against
//! it. Every decision other hosts must agree with — is the sale open, is a deadline due, is
//! a client's clock off, which shop hours apply — reads [`now`], so a host whose clock runs
//! seconds off (no NTP, a VM resumed) still opens and closes a sale with the others. The
//! scripts that sell, enter, end and release judge by Redis's `TIME` themselves; this is
//! for the decisions made on the host.
//!
//! One offset per process, kept in an atomic: it is read on every purchase, and a process
//! has one clock to correct.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::store::{RedisConns, RedisError, redis_timed};
use chrono::{DateTime, Utc};

/// Redis's clock minus this host's, in ms (0 until first measured).
static OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// How often the offset is measured again (a clock drifts, or is stepped).
pub const MEASURE_EVERY: Duration = Duration::from_secs(10);
/// Round trips per measurement: the quickest one's midpoint is the closest estimate.
const SAMPLES: usize = 5;
/// A measurement whose quickest round trip took longer than this says too little.
const TRUSTED_ROUND_TRIP: Duration = Duration::from_millis(200);

/// The time the fleet agrees on.
pub fn now() -> DateTime<Utc> {
    Utc::now() + chrono::Duration::milliseconds(OFFSET_MS.load(Ordering::Relaxed))
}

/// [`now`] in ms since the epoch, with no date built: for the checks every purchase makes
/// (a `DateTime` and the offset's checked addition cost each of them a few hundred
/// instructions).
pub fn now_ms() -> i64 {
    let host_ms = match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_millis()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_millis()).unwrap_or(i64::MAX),
    };
    host_ms.saturating_add(OFFSET_MS.load(Ordering::Relaxed))
}

/// Measures this host's clock against Redis's `TIME` and keeps the correction.
pub async fn measure(redis: &RedisConns) -> Result<(), RedisError> {
    let mut conn = redis.bulk().await?;
    let mut best: Option<(Duration, i64)> = None;
    for _ in 0..SAMPLES {
        let sent_at = Utc::now();
        let started = Instant::now();
        let (secs, micros): (i64, i64) =
            redis_timed(redis::cmd("TIME").query_async(&mut conn)).await?;
        let round_trip = started.elapsed();
        let redis_ms = secs * 1000 + micros / 1000;
        let midpoint_ms = sent_at.timestamp_millis() + (round_trip.as_millis() / 2) as i64;
        if best.is_none_or(|(quickest, _)| round_trip < quickest) {
            best = Some((round_trip, redis_ms - midpoint_ms));
        }
    }
    if let Some((round_trip, offset)) = best.filter(|(rt, _)| *rt <= TRUSTED_ROUND_TRIP) {
        let before = OFFSET_MS.swap(offset, Ordering::Relaxed);
        if (offset - before).abs() >= 500 {
            tracing::warn!(
                offset_ms = offset,
                round_trip_ms = round_trip.as_millis() as u64,
                "this host's clock is off the fleet's (Redis TIME); deciding by the fleet's"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn now_in_ms_is_now() {
        let before = super::now().timestamp_millis();
        let ms = super::now_ms();
        let after = super::now().timestamp_millis();
        assert!((before..=after).contains(&ms), "{before} {ms} {after}");
    }
}
