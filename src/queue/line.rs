//! The waiting room in Redis: a buyer's place (`lua/queue_join.lua`), where they stand
//! (`lua/queue_where.lua`), the admission step (`lua/queue_step.lua`), a pass's win
//! (`lua/queue_used.lua`), and the operators' switches and figures. What each key holds:
//! `lua/queue_step.lua`'s header.

use redis::AsyncCommands;

use crate::domain::{BucketId, OrderSn, UserId};
use crate::keys::{Keys, QueueKeys};
use crate::lua::{
    QUEUE_GIVE, QUEUE_JOIN, QUEUE_RELOAD, QUEUE_SHOW, QUEUE_STEP, QUEUE_TAKE, QUEUE_USED,
    QUEUE_WHERE,
};
use crate::store::{RedisConn, RedisError, redis_timed};

/// A pass's reservation outlives the expiry its token carries by this much: the hosts
/// that check passes may run a few seconds behind Redis's clock (the contract tolerates
/// a skewed host), and a pass they still honour must still hold its units.
pub const GRACE_MS: i64 = 5_000;

/// Where one buyer stands, as Redis has it (see `lua/lib/queue_where.lua`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing {
    /// 0-based place in the line; `None`: not in it.
    pub index: Option<u64>,
    /// How many were let in so far, and shown (see `lua/queue_show.lua`).
    pub cursor: u64,
    /// The live pass's expiry (ms), if the buyer holds one.
    pub pass_expires_ms: Option<i64>,
    /// Wins bought with a pass.
    pub used: u64,
    /// No unit can come back: everyone still waiting hears `sold_out`.
    pub sold_out: bool,
    /// While units are held in unpaid orders that may come back: when the last of them is
    /// known (its pay deadline, ms).
    pub known_by_ms: Option<i64>,
    /// Admissions per second, as measured (thousandths).
    pub rate_milli: u64,
    /// Redis's clock (ms).
    pub now_ms: i64,
    pub paused: bool,
    /// In line and not yet let in.
    pub waiting: u64,
}

impl Standing {
    fn from_reply(reply: &[i64]) -> Result<Self, RedisError> {
        let [
            in_line,
            index,
            cursor,
            expires,
            used,
            sold_out,
            known_by,
            rate,
            now,
            paused,
            waiting,
        ] = reply
        else {
            return Err(RedisError::Unexpected(format!(
                "queue_where answered {reply:?}"
            )));
        };
        let count = |n: &i64| u64::try_from(*n).unwrap_or(0);
        Ok(Self {
            index: (*in_line == 1).then(|| count(index)),
            cursor: count(cursor),
            pass_expires_ms: (*expires >= 0).then_some(*expires),
            used: count(used),
            sold_out: *sold_out == 1,
            known_by_ms: (*known_by > 0).then_some(*known_by),
            rate_milli: count(rate),
            now_ms: *now,
            paused: *paused == 1,
            waiting: count(waiting),
        })
    }
}

/// What a join did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Joined {
    /// A place taken now, or (`again`) the one taken before.
    Placed { again: bool, standing: Standing },
    /// Before the pre-queue opens.
    NotOpen,
    /// The sale is over: no newcomer.
    Ended,
}

/// The times a join is judged by (ms, by Redis's clock).
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub opens_ms: i64,
    pub start_ms: i64,
    pub end_ms: i64,
}

pub async fn join(
    conn: &mut RedisConn,
    keys: &QueueKeys,
    user: UserId,
    rank: u64,
    window: Window,
) -> Result<Joined, RedisError> {
    let reply: Vec<i64> = redis_timed(
        QUEUE_JOIN
            .key(&keys.line)
            .key(&keys.state)
            .key(&keys.passes)
            .key(&keys.used)
            .arg(user.get())
            .arg(rank)
            .arg(window.start_ms)
            .arg(window.opens_ms)
            .arg(window.end_ms)
            .invoke_async(conn),
    )
    .await?;
    match reply.split_first() {
        Some((0, _)) => Ok(Joined::NotOpen),
        Some((1, _)) => Ok(Joined::Ended),
        Some((verdict @ (2 | 3), rest)) => Ok(Joined::Placed {
            again: *verdict == 3,
            standing: Standing::from_reply(rest)?,
        }),
        _ => Err(RedisError::Unexpected(format!(
            "queue_join answered {reply:?}"
        ))),
    }
}

/// Where `user` stands.
pub async fn standing(
    conn: &mut RedisConn,
    keys: &QueueKeys,
    user: UserId,
) -> Result<Standing, RedisError> {
    let reply: Vec<i64> = redis_timed(
        QUEUE_WHERE
            .key(&keys.line)
            .key(&keys.state)
            .key(&keys.passes)
            .key(&keys.used)
            .arg(user.get())
            .invoke_async(conn),
    )
    .await?;
    Standing::from_reply(&reply)
}

/// What one admission step is told.
#[derive(Clone, Copy, Debug)]
pub struct StepRules {
    pub start_ms: i64,
    pub end_ms: i64,
    pub admit_per_s: u32,
    pub pass_ttl_ms: i64,
    pub per_user: u8,
    /// The sale itself cannot sell now (paused, being reloaded): nobody is let in.
    pub held: bool,
}

/// What one admission step did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stepped {
    pub admitted: u64,
    pub cursor: u64,
    /// Units the live passes may still buy.
    pub reserved: u64,
    /// Those let in that may see their passes.
    pub shown: u64,
}

/// What a step reads before the stock, for [`step`] to see what moved since.
#[derive(Clone, Copy, Debug)]
pub struct BeforeStock {
    /// Wins bought with a pass, counted so far.
    pub sold: u64,
    /// Forced warm-ups that held the line so far (`lua/queue_reload.lua`).
    pub reloads: u64,
}

/// Reads [`BeforeStock`], in one round trip.
pub async fn before_stock(
    conn: &mut RedisConn,
    keys: &QueueKeys,
) -> Result<BeforeStock, RedisError> {
    let (sold, reloads): (u64, Option<u64>) = redis_timed(
        redis::pipe()
            .scard(&keys.sold)
            .hget(&keys.state, "reload_gen")
            .query_async(conn),
    )
    .await?;
    Ok(BeforeStock {
        sold,
        reloads: reloads.unwrap_or(0),
    })
}

/// One admission step (`lua/queue_step.lua`): `available`, the units unsold, read after
/// `before`. `None`: nobody is in the line (nobody joined, or the sale was retired), and
/// nothing was written.
pub async fn step(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    keys: &QueueKeys,
    rules: StepRules,
    available: u64,
    before: BeforeStock,
) -> Result<Option<Stepped>, RedisError> {
    let reply: Vec<i64> = redis_timed(
        QUEUE_STEP
            .key(&keys.line)
            .key(&keys.state)
            .key(&keys.passes)
            .key(&keys.held)
            .key(&keys.sold)
            .key(&keys.used)
            .arg(rules.start_ms)
            .arg(rules.end_ms)
            .arg(rules.admit_per_s)
            .arg(rules.pass_ttl_ms)
            .arg(rules.per_user)
            .arg(available)
            .arg(before.sold)
            .arg(GRACE_MS)
            .arg(i64::from(rules.held))
            .arg(before.reloads)
            .invoke_async(conn),
    )
    .await?;
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    match reply[..] {
        [-1] => Ok(None),
        [admitted, cursor, reserved, shown] => Ok(Some(Stepped {
            admitted: count(admitted),
            cursor: count(cursor),
            reserved: count(reserved),
            shown: count(shown),
        })),
        _ => Err(RedisError::Unexpected(format!(
            "queue_step answered {reply:?}"
        ))),
    }
}

/// Holds the waiting room for a forced warm-up (nobody let in for two minutes at most) and
/// returns the units its live passes reserve, read in the same step
/// (`lua/queue_reload.lua`).
pub async fn hold_for_reload(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    keys: &QueueKeys,
) -> Result<u64, RedisError> {
    redis_timed(QUEUE_RELOAD.key(&keys.state).arg("hold").invoke_async(conn)).await
}

/// Lets the waiting room go on after a warm-up's hold.
pub async fn free_after_reload(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    keys: &QueueKeys,
) -> Result<(), RedisError> {
    let _: i64 = redis_timed(QUEUE_RELOAD.key(&keys.state).arg("free").invoke_async(conn)).await?;
    Ok(())
}

/// Those let in up to `cursor` may see their passes (never moves back).
pub async fn show(conn: &mut RedisConn, keys: &QueueKeys, cursor: u64) -> Result<(), RedisError> {
    let _: i64 = redis_timed(QUEUE_SHOW.key(&keys.state).arg(cursor).invoke_async(conn)).await?;
    Ok(())
}

/// A purchase with `user`'s pass takes one of the units it reserves; `false`: it
/// reserves none (spent, or run out).
pub async fn take(
    conn: &mut RedisConn,
    keys: &QueueKeys,
    user: UserId,
) -> Result<bool, RedisError> {
    let taken: i64 = redis_timed(
        QUEUE_TAKE
            .key(&keys.held)
            .arg(user.get())
            .invoke_async(conn),
    )
    .await?;
    Ok(taken == 1)
}

/// The purchase that took a unit of `user`'s pass won nothing: the unit goes back.
pub async fn give(conn: &mut RedisConn, keys: &QueueKeys, user: UserId) -> Result<(), RedisError> {
    let _: i64 = redis_timed(
        QUEUE_GIVE
            .key(&keys.held)
            .arg(user.get())
            .invoke_async(conn),
    )
    .await?;
    Ok(())
}

/// The purchase that took a unit of `user`'s pass won `order_sn` (once per order: a
/// repeated key's answer gives its unit back).
pub async fn used(
    conn: &mut RedisConn,
    keys: &QueueKeys,
    user: UserId,
    order_sn: &OrderSn,
) -> Result<(), RedisError> {
    let _: i64 = redis_timed(
        QUEUE_USED
            .key(&keys.state)
            .key(&keys.held)
            .key(&keys.used)
            .key(&keys.sold)
            .key(&keys.passes)
            .arg(user.get())
            .arg(order_sn.as_str())
            .invoke_async(conn),
    )
    .await?;
    Ok(())
}

/// What those waiting are told of the stock: nothing can come back (`sold_out`), or
/// units held in unpaid orders are known by `known_by_ms`.
pub async fn set_outlook(
    conn: &mut RedisConn,
    keys: &QueueKeys,
    sold_out: bool,
    known_by_ms: Option<i64>,
) -> Result<(), RedisError> {
    let _: () = redis_timed(conn.hset_multiple(
        &keys.state,
        &[
            ("sold_out", i64::from(sold_out)),
            ("known_by_ms", known_by_ms.unwrap_or(0)),
        ],
    ))
    .await?;
    Ok(())
}

/// Holds (or lets go) admission: those waiting keep their places.
pub async fn set_paused(
    conn: &mut RedisConn,
    keys: &QueueKeys,
    paused: bool,
) -> Result<(), RedisError> {
    let _: () = redis_timed(conn.hset(&keys.state, "paused", i64::from(paused))).await?;
    Ok(())
}

/// The queue's figures for operators.
#[derive(Clone, Copy, Debug, Default)]
pub struct Figures {
    /// Everyone who took a place.
    pub joined: u64,
    /// Let in so far.
    pub admitted: u64,
    /// Passes live now.
    pub passes_outstanding: u64,
    /// Units the live passes may still buy.
    pub reserved: u64,
    /// Units bought with a pass.
    pub bought: u64,
    /// Passes that ran out unused.
    pub expired: u64,
    pub rate_milli: u64,
    pub paused: bool,
    pub sold_out: bool,
}

/// What [`figures`] reads: the line's size, the state's counters, the live passes, the
/// wins.
type FiguresRead = (u64, Vec<Option<u64>>, u64, u64);

pub async fn figures(conn: &mut RedisConn, keys: &QueueKeys) -> Result<Figures, RedisError> {
    let mut pipe = redis::pipe();
    pipe.zcard(&keys.line)
        .cmd("HMGET")
        .arg(&keys.state)
        .arg(&[
            "cursor",
            "reserved",
            "expired",
            "rate_milli",
            "paused",
            "sold_out",
        ])
        .zcard(&keys.passes)
        .scard(&keys.sold);
    let (joined, state, passes, bought): FiguresRead = redis_timed(pipe.query_async(conn)).await?;
    let field = |i: usize| state.get(i).copied().flatten().unwrap_or(0);
    Ok(Figures {
        joined,
        admitted: field(0),
        passes_outstanding: passes,
        reserved: field(1),
        bought,
        expired: field(2),
        rate_milli: field(3),
        paused: field(4) == 1,
        sold_out: field(5) == 1,
    })
}

/// Cancels under way in a bucket (its `ending` set): units on their way back.
pub async fn ending(
    conn: &mut RedisConn,
    keys: &Keys,
    bucket: BucketId,
) -> Result<u64, RedisError> {
    redis_timed(conn.zcard(keys.ending(bucket))).await
}
