//! Which buckets background work must look at, and when: one sorted set per kind of work
//! (bucket → ms), so the scheduler's passes read the few buckets due instead of walking
//! the whole catalogue every second (docs/benchmarks.md: "A large catalogue").
//!
//! Whoever leaves work in a bucket marks it — score 0, "look at once" — *after* the work
//! is written. A pass takes the due buckets under a lease (`lua/marks_take.lua`), works
//! them, and settles each to when it next needs a look (`lua/marks_settle.lua`); a bucket
//! marked while the pass worked keeps its mark. A mark lost with a process that died
//! between the two steps is put back by the scheduler's safety sweep.

use std::time::Duration;

use crate::domain::BucketId;
use crate::keys::Keys;
use crate::lua::{MARKS_SETTLE, MARKS_TAKE};
use crate::store::{Grouped, RedisConns, RedisError, redis_timed};

/// A kind of background work, with a set of marks of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Work {
    /// Outbox entries the publisher may not have sent (the relay).
    Relay,
    /// Delay-queue tasks: pay deadlines and reminders.
    Deadlines,
    /// Cancels begun whose unit may not have come back.
    CutOff,
    /// Units lent between a split item's buckets and not yet settled.
    Loans,
}

impl Work {
    pub const ALL: [Work; 4] = [Work::Relay, Work::Deadlines, Work::CutOff, Work::Loans];

    /// The sorted set of this kind of work's marks.
    pub fn key(self, keys: &Keys) -> String {
        keys.marks(self.name())
    }

    pub fn name(self) -> &'static str {
        match self {
            Work::Relay => "relay",
            Work::Deadlines => "deadlines",
            Work::CutOff => "cut_off",
            Work::Loans => "loans",
        }
    }
}

/// Marks these buckets for a look at once. Call it after writing their work.
pub async fn mark<C>(
    conn: &mut C,
    keys: &Keys,
    work: Work,
    stocks: impl IntoIterator<Item = BucketId>,
) -> Result<(), RedisError>
where
    C: redis::aio::ConnectionLike + Send,
{
    let mut members: Vec<String> = stocks.into_iter().map(|s| s.to_string()).collect();
    members.sort_unstable();
    members.dedup();
    if members.is_empty() {
        return Ok(());
    }
    let mut zadd = redis::cmd("ZADD");
    zadd.arg(work.key(keys));
    for member in members {
        zadd.arg(0).arg(member);
    }
    redis_timed(zadd.query_async::<()>(conn)).await
}

/// Buckets taken per round trip.
const BATCH: usize = 1_000;
/// A batch whose work failed (a store down) is looked at again after this long.
const AGAIN_AFTER_FAILURE: Duration = Duration::from_secs(1);
/// Batches per pass at most: buckets whose work cannot be done yet (a broker down) are due
/// again at once, and must not keep one pass going round them.
const MOST_BATCHES: usize = 10;

/// One pass of `work`: takes the due buckets a thousand at a time under `lease`, lets
/// `each` work a batch and say when each of its buckets next needs a look, and settles
/// them so. A failed batch is looked at again a second later (or, if even that cannot
/// be written, when its lease runs out).
pub async fn work_through<E, F, Fut>(
    redis: &RedisConns,
    keys: &Keys,
    work: Work,
    lease: Duration,
    mut each: F,
) -> Result<(), E>
where
    E: From<RedisError>,
    F: FnMut(Vec<BucketId>) -> Fut,
    Fut: Future<Output = Result<Vec<Option<i64>>, E>>,
{
    for _ in 0..MOST_BATCHES {
        let taken = take(redis, keys, work, lease, BATCH).await?;
        if taken.stocks.is_empty() {
            break;
        }
        let next = match each(taken.stocks.clone()).await {
            Ok(next) => next,
            Err(e) => {
                // Looked at again soon, not only when the lease runs out (best effort).
                let again =
                    crate::clock::now().timestamp_millis() + AGAIN_AFTER_FAILURE.as_millis() as i64;
                let again = taken.stocks.iter().map(|stock| (*stock, Some(again)));
                let _ = taken.settle(redis, keys, again).await;
                return Err(e);
            }
        };
        taken
            .settle(redis, keys, taken.stocks.iter().copied().zip(next))
            .await?;
        if taken.stocks.len() < BATCH {
            break;
        }
    }
    Ok(())
}

/// Buckets a pass took, under one lease.
#[derive(Debug)]
struct Taken {
    work: Work,
    stocks: Vec<BucketId>,
    /// The lease end, which is also what [`Taken::settle`] compares against.
    marker: i64,
}

/// Takes up to `limit` buckets due for `work`, for `lease` (past it, they are due again).
async fn take(
    redis: &RedisConns,
    keys: &Keys,
    work: Work,
    lease: Duration,
    limit: usize,
) -> Result<Taken, RedisError> {
    let now = crate::clock::now().timestamp_millis();
    let marker = now + lease.as_millis() as i64;
    let mut conn = redis.bulk().await?;
    let members: Vec<String> = redis_timed(
        MARKS_TAKE
            .key(work.key(keys))
            .arg(now)
            .arg(marker)
            .arg(limit)
            .invoke_async(&mut conn),
    )
    .await?;
    let stocks = members.iter().filter_map(|m| BucketId::parse(m)).collect();
    if members.iter().any(|m| BucketId::parse(m).is_none()) {
        tracing::error!(
            work = work.name(),
            ?members,
            "marks that are not buckets; left to expire"
        );
    }
    Ok(Taken {
        work,
        stocks,
        marker,
    })
}

impl Taken {
    /// After the pass: when each bucket next needs a look (`None`: not until marked again).
    async fn settle(
        &self,
        redis: &RedisConns,
        keys: &Keys,
        next: impl IntoIterator<Item = (BucketId, Option<i64>)>,
    ) -> Result<(), RedisError> {
        let mut call = MARKS_SETTLE.key(self.work.key(keys));
        call.arg(self.marker);
        let mut any = false;
        for (stock, at) in next {
            call.arg(stock.to_string())
                .arg(at.map(|ms| ms.to_string()).unwrap_or_default());
            any = true;
        }
        if !any {
            return Ok(());
        }
        let mut conn = redis.bulk().await?;
        redis_timed(call.invoke_async::<i64>(&mut conn)).await?;
        Ok(())
    }
}

/// The earliest score in each bucket's sorted sets named by `sets` (`None`: all empty),
/// plus `after` ms: one pipelined round trip.
pub async fn earliest(
    redis: &RedisConns,
    stocks: &[BucketId],
    sets: impl Fn(BucketId) -> Vec<String>,
    after: Duration,
) -> Result<Vec<Option<i64>>, RedisError> {
    let mut grouped = Grouped::new(redis);
    for stock in stocks {
        let pipe = grouped.group();
        for key in sets(*stock) {
            pipe.zrange_withscores(key, 0, 0);
        }
    }
    let firsts: Vec<Vec<Vec<(String, f64)>>> = grouped.query(redis).await?;
    Ok(firsts
        .into_iter()
        .map(|sets| {
            sets.iter()
                .filter_map(|first| first.first().map(|(_, at)| *at as i64))
                .min()
                .map(|at| at + after.as_millis() as i64)
        })
        .collect())
}

/// What a bucket holds of each kind of work, and its pending orders: what the safety
/// sweep marks, and what must be gone before a sale is retired.
#[derive(Debug)]
pub struct Holding {
    pub outbox: u64,
    pub due: u64,
    pub leased: u64,
    pub ending: u64,
    pub lent: u64,
    pub pending: u64,
    /// Orders RabbitMQ confirmed, waiting for the consumer (`crate::keys::Keys::confirmed`):
    /// more than `pending` means some the consumer wrote before their confirm was noted.
    pub confirmed: u64,
}

impl Holding {
    /// Whether it holds work of this kind (and so needs its mark).
    pub fn has(&self, work: Work) -> bool {
        match work {
            Work::Relay => self.outbox > 0,
            Work::Deadlines => self.due + self.leased > 0,
            Work::CutOff => self.ending > 0,
            Work::Loans => self.lent > 0,
        }
    }
}

/// What each bucket holds, in one round trip per slot group.
pub async fn holdings(
    redis: &RedisConns,
    keys: &Keys,
    stocks: &[BucketId],
) -> Result<Vec<Holding>, RedisError> {
    let mut grouped = Grouped::new(redis);
    for stock in stocks {
        grouped
            .group()
            .zcard(keys.outbox(*stock))
            .zcard(keys.due(*stock))
            .zcard(keys.leased(*stock))
            .zcard(keys.ending(*stock))
            .hlen(keys.lent(*stock))
            .hlen(keys.pending(*stock))
            .scard(keys.confirmed(*stock));
    }
    let held: Vec<(u64, u64, u64, u64, u64, u64, u64)> = grouped.query(redis).await?;
    Ok(held
        .into_iter()
        .map(
            |(outbox, due, leased, ending, lent, pending, confirmed)| Holding {
                outbox,
                due,
                leased,
                ending,
                lent,
                pending,
                confirmed,
            },
        )
        .collect())
}
