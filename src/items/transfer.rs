//! Moving units between the buckets of a split item, so that a buyer whose bucket ran dry
//! still gets a unit while any bucket has one (no false "sold out").
//!
//! A buyer's record, order and unit always live in their home bucket (`Stock::home`):
//! "one unit per user" is decided by one script on one slot, as for an item not split.
//! When the home bucket is empty, a unit is moved to it from another bucket, in two
//! scripts on two slots — `lend.lua` on the lender (the unit leaves its list for its
//! `lent` record), `receive.lua` on the home bucket (the transfer is decided `in`: the
//! unit is on its list) — and the lender's record is dropped (`unlend.lua`). A crash
//! between two steps leaves a `lent` record that [`settle_stuck`] finishes: it decides
//! the transfer at the receiver (`void`, unless already `in`) and settles the lender to
//! match, so the unit ends on exactly one list. README: "A hot item over many buckets".

use std::time::Duration;

use chrono::Utc;

use crate::domain::Stock;
use crate::keys::{ItemKeys, Keys};
use crate::lua::{LEND, RECEIVE, UNLEND};
use crate::marks::{self, Work};
use crate::store::{Grouped, RedisConns, RedisError, redis_timed};

/// A transfer still not settled this long after its loan was cut off (a purchase takes
/// well under a second; its store calls time out sooner).
const STUCK_AFTER: Duration = Duration::from_secs(5);

/// What [`borrow`] found.
#[derive(Debug, Default)]
pub struct Borrowed {
    /// A unit is on the home bucket's list now.
    pub moved: bool,
    /// A lender's replicas did not confirm its loan in time (`SECKILL_REDIS_WAIT_REPLICAS`):
    /// the transfer is left to [`settle_stuck`], and nothing can be said yet.
    pub stalled: bool,
    /// Buckets that had nothing to lend.
    pub empty: Vec<u8>,
}

/// What a loan needs besides the buckets: the replicas that must hold it before its unit
/// is received (`SECKILL_REDIS_WAIT_REPLICAS`; a lender failing over to a replica without
/// the loan would sell the unit again), and the keys to mark a loan left unsettled.
#[derive(Clone, Copy)]
pub struct Lending<'a> {
    pub redis: &'a RedisConns,
    pub keys: &'a Keys,
    /// 0: no wait.
    pub replicas: u32,
    pub within: Duration,
}

/// Moves one unit into `home` from the first of `lenders` that has one.
pub async fn borrow(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    home: &ItemKeys,
    lenders: impl Iterator<Item = &ItemKeys>,
    lending: Lending<'_>,
) -> Result<Borrowed, RedisError> {
    let mut borrowed = Borrowed::default();
    for lender in lenders {
        let transfer = ulid::Ulid::new().to_string();
        let unit: Option<String> = redis_timed(
            LEND.key(&lender.meta)
                .key(&lender.tokens)
                .key(&lender.lent)
                .arg(&transfer)
                .arg(home.stock.bucket)
                .arg(Utc::now().timestamp_millis())
                .invoke_async(conn),
        )
        .await?;
        let Some(unit) = unit else {
            borrowed.empty.push(lender.stock.bucket);
            continue;
        };
        let moved = receive(conn, home, lender, &transfer, &unit, lending).await;
        if !matches!(moved, Ok(Some(_))) {
            // Left to `settle_stuck`: the lender is marked for it (best effort; the
            // scheduler's safety sweep finds the loan otherwise).
            let _ = marks::mark(conn, lending.keys, Work::Loans, [lender.stock]).await;
        }
        match moved? {
            None => {
                borrowed.stalled = true;
                return Ok(borrowed);
            }
            Some(decided) if decided == "in" => {
                borrowed.moved = true;
                return Ok(borrowed);
            }
            Some(_) => {}
        }
    }
    Ok(borrowed)
}

/// The steps of a transfer after the loan: the receiver decides it, the lender settles.
/// `None` when the lender's replicas did not confirm the loan in time.
async fn receive(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    home: &ItemKeys,
    lender: &ItemKeys,
    transfer: &str,
    unit: &str,
    lending: Lending<'_>,
) -> Result<Option<String>, RedisError> {
    if lending.replicas > 0 {
        let held = lending
            .redis
            .replicas_hold(&lender.replicated, lending.replicas, lending.within)
            .await?;
        if !held {
            return Ok(None);
        }
    }
    let decided: String = redis_timed(
        RECEIVE
            .key(&home.meta)
            .key(&home.tokens)
            .key(&home.transfers)
            .arg(transfer)
            .arg(unit)
            .invoke_async(conn),
    )
    .await?;
    settle(conn, lender, transfer, &decided).await?;
    Ok(Some(decided))
}

/// The lender's side of a decided transfer.
async fn settle(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    lender: &ItemKeys,
    transfer: &str,
    decided: &str,
) -> Result<(), RedisError> {
    redis_timed(
        UNLEND
            .key(&lender.meta)
            .key(&lender.tokens)
            .key(&lender.lent)
            .arg(transfer)
            .arg(decided)
            .invoke_async::<i64>(conn),
    )
    .await?;
    Ok(())
}

/// Finishes transfers of these lenders cut off between their steps (a process died, a
/// store call timed out): each is decided at its receiver — `void` unless it is `in`
/// already — and its lender settled to match. Returns how many it settled.
pub async fn settle_stuck(
    redis: &RedisConns,
    keys: &Keys,
    lenders: &[Stock],
) -> Result<u64, RedisError> {
    settle_loans(redis, keys, lenders.iter().copied(), Some(STUCK_AFTER)).await
}

/// When each of these lenders next needs the stuck-transfer pass: [`STUCK_AFTER`] from
/// now while it has loans outstanding.
pub async fn next_look(
    redis: &RedisConns,
    keys: &Keys,
    lenders: &[Stock],
) -> Result<Vec<Option<i64>>, RedisError> {
    let mut grouped = Grouped::new(redis);
    for lender in lenders {
        grouped.group().hlen(keys.lent(*lender));
    }
    let loans: Vec<(u64,)> = grouped.query(redis).await?;
    let later = Utc::now().timestamp_millis() + STUCK_AFTER.as_millis() as i64;
    Ok(loans
        .into_iter()
        .map(|(n,)| (n > 0).then_some(later))
        .collect())
}

/// Decides and settles the loans of these lenders older than `older_than` (all of them
/// with `None`: a warm-up replacing the stock). Returns how many it settled.
pub async fn settle_loans(
    redis: &RedisConns,
    keys: &Keys,
    lenders: impl Iterator<Item = Stock>,
    older_than: Option<Duration>,
) -> Result<u64, RedisError> {
    let cutoff = older_than.map_or(i64::MAX, |age| {
        Utc::now().timestamp_millis() - age.as_millis() as i64
    });
    let mut settled = 0;
    for lender in lenders {
        let lender_keys = keys.stock(lender);
        let mut conn = redis.bulk().await?;
        let loans: Vec<(String, String)> =
            redis_timed(redis::AsyncCommands::hgetall(&mut conn, &lender_keys.lent)).await?;
        for (transfer, record) in loans {
            let Some((home, _unit, at)) = parse_loan(&record) else {
                tracing::error!(%lender, transfer, record, "a lent record not written by lend.lua; left alone");
                continue;
            };
            if at > cutoff {
                continue;
            }
            let home = keys.stock(Stock::new(lender.item, home));
            // The first decision stands: HSETNX decides `void` only if nothing was yet.
            let (_, decided): (bool, String) = redis_timed(
                redis::pipe()
                    .hset_nx(&home.transfers, &transfer, "void")
                    .hget(&home.transfers, &transfer)
                    .query_async(&mut conn),
            )
            .await?;
            settle(&mut conn, &lender_keys, &transfer, &decided).await?;
            tracing::warn!(%lender, to = %home.stock, transfer, decided, "settled a transfer between buckets that was cut off");
            settled += 1;
        }
    }
    Ok(settled)
}

/// `home|unit|ms` → (home bucket, unit, ms).
fn parse_loan(record: &str) -> Option<(u8, &str, i64)> {
    let (home, rest) = record.split_once('|')?;
    let (unit, at) = rest.rsplit_once('|')?;
    Some((home.parse().ok()?, unit, at.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loans_parse_as_lend_lua_writes_them() {
        assert_eq!(parse_loan("3|r:7_01ABC|1700"), Some((3, "r:7_01ABC", 1700)));
        assert_eq!(parse_loan("3|12|x"), None);
        assert_eq!(parse_loan("nonsense"), None);
    }
}
