//! Moving units between the buckets of a split item, so that a buyer whose bucket ran dry
//! still gets a unit while any bucket has one (no false "sold out").
//!
//! A buyer's record, order and unit always live in their home bucket (`BucketId::home`):
//! "one unit per user" is decided by one script on one slot, as for an item not split.
//! When the home bucket is empty, a unit is moved to it from another bucket, in two
//! scripts on two slots — `lend.lua` on the lender (the unit leaves its list for its
//! `lent` record), `receive.lua` on the home bucket (the transfer is decided `in`: the
//! unit is on its list) — and the lender's record is dropped (`unlend.lua`). A crash
//! between two steps leaves a `lent` record that [`settle_stuck`] finishes: it decides
//! the transfer at the receiver (`void`, unless already `in`) and settles the lender to
//! match, so the unit ends on exactly one list. docs/architecture.md: "A hot item over many buckets".

use std::time::Duration;

use crate::domain::BucketId;
use crate::keys::{ItemKeys, Keys};
use crate::lua::{LEND, RECEIVE, UNLEND};
use crate::marks::{self, Work};
use crate::store::{Grouped, RedisConns, RedisError, Replication, redis_timed};

/// A transfer still not settled this long after its loan was cut off (a purchase takes
/// well under a second; its store calls time out sooner).
const STUCK_AFTER: Duration = Duration::from_secs(5);
/// A loan cut off no longer ago than this whose unit has not arrived is on its way back to
/// its lender: the repair settles it within about 6.5 s of the buckets' replicas being in
/// step (docs/architecture.md), so a buyer hears "press again", not "sold out", for a unit
/// that will be on sale in seconds. An older one means the repair is not running (no
/// scheduler, replicas gone for a minute): the unit is not counted then, or a sold-out
/// crowd would hear `503` for as long.
const RETURNING_FOR: Duration = Duration::from_secs(60);

/// What [`borrow`] found.
#[derive(Debug, Default)]
pub struct Borrowed {
    /// A unit is on the home bucket's list now.
    pub moved: bool,
    /// Replicas did not confirm a step in time (`SECKILL_REDIS_WAIT_REPLICAS`), a bucket
    /// that may hold units sits on a master short of them, or a unit of a loan cut off is
    /// on its way back to its lender: nothing can be said yet (a transfer begun is left to
    /// [`settle_stuck`]).
    pub stalled: bool,
    /// Buckets that had nothing to lend and nothing on its way, with the loans each had
    /// made (`lua/lend.lua`).
    pub empty: Vec<(u8, u64)>,
    /// One of them lent a unit within the last second and its loan is not settled: the
    /// unit may have reached a bucket asked before it, so "nothing anywhere" cannot be
    /// said.
    pub moving: bool,
}

/// What a loan needs besides the buckets: the Redis connections, whose replicas must hold
/// each step before the next (`SECKILL_REDIS_WAIT_REPLICAS`: a lender failing over to a
/// replica without the loan would sell the unit again; a home bucket failing over without
/// the unit's arrival would lose it once the lender forgot the loan), and the keys to mark
/// a loan left unsettled.
#[derive(Clone, Copy)]
pub struct Lending<'a> {
    pub redis: &'a RedisConns,
    pub keys: &'a Keys,
}

/// Moves one unit into `home` from the first of `lenders` that has one.
pub async fn borrow(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    home: &ItemKeys,
    lenders: impl Iterator<Item = &ItemKeys>,
    lending: Lending<'_>,
) -> Result<Borrowed, RedisError> {
    let mut borrowed = Borrowed::default();
    if !may_take_in(home, lending).await {
        borrowed.stalled = true;
        return Ok(borrowed);
    }
    for lender in lenders {
        // A lender whose master is short of replicas cannot lend: its loan could never be
        // confirmed. Its units are not gone, so no "sold out" is said for them.
        let Ok(lent) = lending.redis.replicas_for(&lender.replicated).await else {
            borrowed.stalled = true;
            continue;
        };
        let transfer = ulid::Ulid::new().to_string();
        let answer = lend(conn, home, lender, &transfer).await?;
        let (outcome, unit) = match answer.as_slice() {
            [outcome, unit, ..] => (outcome.as_str(), unit.as_str()),
            _ => {
                return Err(RedisError::Unexpected(format!(
                    "lend.lua answered {answer:?}"
                )));
            }
        };
        match outcome {
            "lent" => {}
            // A unit lent a moment ago may be anywhere now; one cut off is coming back
            // here. Neither bucket is empty for the catalogue in memory: its sold-out flag
            // would otherwise answer `410` while the unit is on its way.
            "moving" => {
                borrowed.moving = true;
                continue;
            }
            "empty" => {
                let lends = unit
                    .parse()
                    .map_err(|_| RedisError::Unexpected(format!("lend.lua answered {answer:?}")))?;
                if returning(conn, lender, &answer[2..], lending).await {
                    borrowed.stalled = true;
                } else {
                    borrowed.empty.push((lender.bucket.index, lends));
                }
                continue;
            }
            // Paused, not loaded, or held back by a warm-up: it may have units.
            _ => {
                borrowed.stalled = true;
                continue;
            }
        }
        let moved = receive(conn, home, lender, &transfer, unit, lending, lent).await;
        if !matches!(moved, Ok(Some(_))) {
            // Left to `settle_stuck`: the lender is marked for it (best effort; the
            // scheduler's safety sweep finds the loan otherwise).
            let _ = marks::mark(conn, lending.keys, Work::Loans, [lender.bucket]).await;
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
    // Stalled by a lender short of replicas, but another bucket may still lend next time.
    if borrowed.moved {
        borrowed.stalled = false;
    }
    Ok(borrowed)
}

/// Whether `home` may take a unit in now. A home bucket whose master is short of replicas
/// cannot under `refuse`: a loan to it would be cut off after the lend, its unit on no list
/// until the repair, seconds after the replicas are back (a buyer pressing just after a
/// replica thawed did that, in a generated history). Nothing is lent then: the buyer
/// presses again. (Under `degrade` the receive goes ahead unconfirmed, as every write does.)
async fn may_take_in(home: &ItemKeys, lending: Lending<'_>) -> bool {
    lending.redis.replicas_for(&home.replicated).await.is_ok()
}

/// Of a bucket's loans, those whose unit has not arrived: the home bucket has not decided
/// the transfer `in`. A loan cut off after `receive.lua` (its unit on the home list, the
/// lender not settled yet) is on a list already: counting it too made the stats read a
/// unit more than the item has, and `consistent` false, until the repair settled it.
/// One read per loan (a bucket holds few, and only while a transfer is under way or cut
/// off); a record `lend.lua` did not write counts as on its way.
pub async fn on_their_way<C>(
    conn: &mut C,
    keys: &Keys,
    lender: BucketId,
    loans: &[(String, String)],
) -> Result<u64, RedisError>
where
    C: redis::aio::ConnectionLike + Send,
{
    let mut moving = 0;
    for (transfer, record) in loans {
        let Some((home, _, _)) = parse_loan(record) else {
            moving += 1;
            continue;
        };
        let home = keys.bucket(BucketId::new(lender.item, home));
        let decided: Option<String> = redis_timed(
            redis::cmd("HGET")
                .arg(&home.transfers)
                .arg(transfer)
                .query_async(conn),
        )
        .await?;
        if decided.as_deref() != Some("in") {
            moving += 1;
        }
    }
    Ok(moving)
}

/// `lend.lua` on `lender` for `home`: the unit lent, or (empty, moving) the loans the
/// lender had made — with an empty one's older loans still unsettled.
pub async fn lend(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    home: &ItemKeys,
    lender: &ItemKeys,
    transfer: &str,
) -> Result<Vec<String>, RedisError> {
    redis_timed(
        LEND.key(&lender.meta)
            .key(&lender.tokens)
            .key(&lender.lent)
            .arg(transfer)
            .arg(home.bucket.index)
            .arg(crate::clock::now().timestamp_millis())
            .arg(RETURNING_FOR.as_millis() as u64)
            .invoke_async(conn),
    )
    .await
}

/// Whether a unit of these older loans of an empty lender (`lend.lua`'s transfer ids and
/// records, or `more` when it had more than it names) is on its way back to it: its home
/// bucket did not take it in. Then the lender is marked for the repair, which brings the
/// unit back 5 s after the loan at the earliest — its request may have died before it
/// could mark it, leaving it to the safety sweep's slower round. A home bucket that
/// cannot be asked (its master gone) leaves the unit's fate unknown: on its way, too.
async fn returning(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    lender: &ItemKeys,
    older: &[String],
    lending: Lending<'_>,
) -> bool {
    if older.is_empty() {
        return false;
    }
    let loans: Vec<(String, String)> = older
        .chunks_exact(2)
        .map(|loan| (loan[0].clone(), loan[1].clone()))
        .collect();
    let on_the_way = older.len() % 2 == 1
        || !matches!(
            on_their_way(conn, lending.keys, lender.bucket, &loans).await,
            Ok(0)
        );
    if on_the_way {
        let _ = marks::mark(conn, lending.keys, Work::Loans, [lender.bucket]).await;
    }
    on_the_way
}

/// The steps of a transfer after the loan: the receiver decides it, the lender settles.
/// `None` when the replicas did not confirm the loan, or the receiver's master is short
/// of them (the transfer is then left to [`settle_stuck`]).
async fn receive(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    home: &ItemKeys,
    lender: &ItemKeys,
    transfer: &str,
    unit: &str,
    lending: Lending<'_>,
    lent: Replication,
) -> Result<Option<String>, RedisError> {
    if !lent.held().await {
        return Ok(None);
    }
    let Ok(arrived) = lending.redis.replicas_for(&home.replicated).await else {
        return Ok(None);
    };
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
    // The lender forgets the loan only once the home bucket's replicas hold the decision:
    // a failover there could otherwise lose the unit's arrival after the lender dropped
    // it — one unit short for good. Not held in time: the unit is on the home list (the
    // grab that follows waits for the same replicas), and the loan is settled later.
    if arrived.held().await {
        settle(conn, lender, transfer, &decided).await?;
        forget(conn, home, transfer).await;
    } else {
        let _ = marks::mark(conn, lending.keys, Work::Loans, [lender.bucket]).await;
    }
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

/// Drops the home bucket's decision of a transfer this request decided and settled. The
/// decision is kept against a second `receive.lua` of the transfer, and none can come any
/// more: the request sent its only one and heard the answer, and the repair, which never
/// receives, acts only on a loan the lender still holds — settled now. Without this the
/// `transfers` hash kept an entry per transfer for the life of the sale, growing with every
/// unit a cancel put back (under a new name) and lent again. One cut off (settled by the
/// repair) keeps its decision: its request may yet send a late receive. A failure leaves
/// the entry, which harms nothing but its bytes.
async fn forget(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    home: &ItemKeys,
    transfer: &str,
) {
    let dropped: Result<i64, _> = redis_timed(
        redis::cmd("HDEL")
            .arg(&home.transfers)
            .arg(transfer)
            .query_async(conn),
    )
    .await;
    if let Err(e) = dropped {
        tracing::debug!(bucket = %home.bucket, transfer, error = %e, "could not drop a settled transfer's decision; it stays until the sale is retired");
    }
}

/// Finishes transfers of these lenders cut off between their steps (a process died, a
/// store call timed out): each is decided at its receiver — `void` unless it is `in`
/// already — and its lender settled to match.
pub async fn settle_stuck(
    redis: &RedisConns,
    keys: &Keys,
    lenders: &[BucketId],
) -> Result<Settled, RedisError> {
    settle_loans(redis, keys, lenders.iter().copied(), Some(STUCK_AFTER)).await
}

/// What [`settle_loans`] did.
#[derive(Debug, Default)]
pub struct Settled {
    pub settled: u64,
    /// Loans decided whose decision the receiver's replicas do not hold yet (or whose
    /// receiver's master is short of them): left for a later pass.
    pub waiting: u64,
}

/// When each of these lenders next needs the stuck-transfer pass: [`STUCK_AFTER`] from
/// now while it has loans outstanding.
pub async fn next_look(
    redis: &RedisConns,
    keys: &Keys,
    lenders: &[BucketId],
) -> Result<Vec<Option<i64>>, RedisError> {
    let mut grouped = Grouped::new(redis);
    for lender in lenders {
        grouped.group().hlen(keys.lent(*lender));
    }
    let loans: Vec<(u64,)> = grouped.query(redis).await?;
    let later = crate::clock::now().timestamp_millis() + STUCK_AFTER.as_millis() as i64;
    Ok(loans
        .into_iter()
        .map(|(n,)| (n > 0).then_some(later))
        .collect())
}

/// Decides and settles the loans of these lenders older than `older_than` (all of them
/// with `None`: a warm-up replacing the stock). A lender settles only once the receiver's
/// replicas hold the decision (`SECKILL_REDIS_WAIT_REPLICAS`).
pub async fn settle_loans(
    redis: &RedisConns,
    keys: &Keys,
    lenders: impl Iterator<Item = BucketId>,
    older_than: Option<Duration>,
) -> Result<Settled, RedisError> {
    let cutoff = older_than.map_or(i64::MAX, |age| {
        crate::clock::now().timestamp_millis() - age.as_millis() as i64
    });
    let mut settled = Settled::default();
    for lender in lenders {
        let lender_keys = keys.bucket(lender);
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
            let home = keys.bucket(BucketId::new(lender.item, home));
            let Ok(decision) = redis.replicas_for(&home.replicated).await else {
                settled.waiting += 1;
                continue;
            };
            // The first decision stands: HSETNX decides `void` only if nothing was yet.
            let (_, decided): (bool, String) = redis_timed(
                redis::pipe()
                    .hset_nx(&home.transfers, &transfer, "void")
                    .hget(&home.transfers, &transfer)
                    .query_async(&mut conn),
            )
            .await?;
            // A decision a failover could undo must not be acted on: a lost `void` would
            // let a late receive take the unit in while the lender sells it again.
            if !decision.held().await {
                settled.waiting += 1;
                continue;
            }
            settle(&mut conn, &lender_keys, &transfer, &decided).await?;
            tracing::warn!(%lender, to = %home.bucket, transfer, decided, "settled a transfer between buckets that was cut off");
            settled.settled += 1;
        }
    }
    Ok(settled)
}

/// `home|unit|ms` → (home bucket, unit, ms).
pub(crate) fn parse_loan(record: &str) -> Option<(u8, &str, i64)> {
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
