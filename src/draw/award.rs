//! The draw (run by the scheduler: `crate::scheduler::draws`): once `draw_at` has passed by
//! Redis's clock (the one entries close by), the
//! units go to the entries of lowest rank, one each, in rank order; then, every pass until
//! `end_at`, a unit a winner gave back (a cancel, a missed pay deadline) goes to the next
//! entry by rank.
//!
//! Each winner's unit is given by `lua/award.lua`, which records the winner in the same
//! step: giving it again answers "repeat". So a scheduler killed mid-draw resumes where
//! MySQL's `draw_cutoff` says (or before: what was given since answers "repeat"), two
//! schedulers never give one entry two units, and a winner who cancelled is not given the
//! unit back. The units are the item's loaded tokens, so no more than `total` are ever
//! given, whatever runs twice.
//!
//! Before its first unit the round closes the entries for good (`drawn` in each bucket's
//! meta, which `lua/enter.lua` checks): whatever `draw_at` says later, no entry is taken
//! once the draw is being made.

use redis::AsyncCommands;

use crate::domain::{BucketId, UserId};
use crate::items::repo::Item;
use crate::items::transfer::{self, Lending};
use crate::keys::{ItemKeys, Keys};
use crate::lua::AWARD;
use crate::store::{Grouped, RedisConn, RedisConns, RedisError, redis_timed};

/// Entries read per bucket per round.
const PAGE: isize = 512;

/// What one round did.
#[derive(Debug, Default)]
pub struct Round {
    /// Units given this round.
    pub given: u64,
    /// The highest rank given a unit so far.
    pub cutoff: Option<u64>,
    /// Units or entries ran out: every entry of rank ≤ `cutoff` has a unit (or was passed
    /// over: its user held as many orders as `per_user` allows), and no more can be given
    /// now.
    pub complete: bool,
}

/// One round of the item's draw: `None` while Redis's clock has not reached `draw_at`.
pub async fn draw(
    redis: &RedisConns,
    keys: &Keys,
    item: &Item,
) -> Result<Option<Round>, RedisError> {
    let (Some(draw_at), Some(_)) = (item.draw_at, item.draw_seed.as_ref()) else {
        return Ok(None);
    };
    let buckets: Vec<ItemKeys> = item.bucket_ids().map(|s| keys.bucket(s)).collect();
    let mut conn = redis.bulk().await?;
    let (secs, micros): (i64, i64) = redis_timed(redis::cmd("TIME").query_async(&mut conn)).await?;
    if secs * 1000 + micros / 1000 < draw_at.timestamp_millis() {
        return Ok(None);
    }
    if item.drawn_at.is_none() {
        close_entries(redis, &buckets).await?;
    }
    let mut round = Round {
        cutoff: item.draw_cutoff,
        ..Round::default()
    };
    // Every unit given (the usual state between the draw and `end_at`): nothing to read.
    if listed(redis, &buckets).await? == 0 {
        round.complete = true;
        return Ok(Some(round));
    }
    let lending = Lending { redis, keys };
    loop {
        let page = next_entries(&mut conn, keys, &buckets, round.cutoff).await?;
        let last_page = page.len() < PAGE as usize;
        for (user, rank) in page {
            match give(&mut conn, keys, item, &buckets, user, lending).await? {
                Given::Won => {
                    round.given += 1;
                    round.cutoff = Some(rank);
                }
                Given::Repeat => round.cutoff = Some(rank),
                Given::NoUnit => {
                    round.complete = true;
                    return Ok(Some(round));
                }
                Given::Wait => return Ok(Some(round)),
            }
        }
        if last_page {
            round.complete = true;
            return Ok(Some(round));
        }
    }
}

/// Marks every bucket's entries closed for good (`drawn` in its meta: `lua/enter.lua`).
async fn close_entries(redis: &RedisConns, buckets: &[ItemKeys]) -> Result<(), RedisError> {
    let mut grouped = Grouped::new(redis);
    for bucket in buckets {
        grouped.group().hset_nx(&bucket.meta, "drawn", 1).ignore();
    }
    grouped.run(redis).await
}

/// Units on the buckets' lists (one round trip per server).
async fn listed(redis: &RedisConns, buckets: &[ItemKeys]) -> Result<u64, RedisError> {
    let mut grouped = Grouped::new(redis);
    for bucket in buckets {
        grouped.group().llen(&bucket.tokens);
    }
    // Each group's answers come as one array: here, of one length.
    let lengths: Vec<(u64,)> = grouped.query(redis).await?;
    Ok(lengths.into_iter().map(|(n,)| n).sum())
}

/// The bucket that keeps `user`'s entry and record of the item.
fn item_home(item: &Item, user: UserId) -> BucketId {
    BucketId::home(item.id, user, item.buckets)
}

/// The next entries by rank from `cutoff` on (inclusive: an entry tied with the cutoff, or
/// the cutoff's own, answers "repeat" if it has a unit), merged over the buckets.
async fn next_entries(
    conn: &mut RedisConn,
    keys: &Keys,
    buckets: &[ItemKeys],
    cutoff: Option<u64>,
) -> Result<Vec<(UserId, u64)>, RedisError> {
    let from = cutoff.map_or("-inf".to_owned(), |c| c.to_string());
    let mut all: Vec<(UserId, u64)> = Vec::new();
    for bucket in buckets {
        let page: Vec<(u64, f64)> = redis_timed(conn.zrangebyscore_limit_withscores(
            keys.entries(bucket.bucket),
            &from,
            "+inf",
            0,
            PAGE,
        ))
        .await?;
        all.extend(page.into_iter().map(|(u, r)| (UserId::new(u), r as u64)));
    }
    // Lowest rank first; a tie (one in ~10^14) by user id as text, as Redis orders it.
    all.sort_by(|(ua, ra), (ub, rb)| ra.cmp(rb).then_with(|| ua.to_string().cmp(&ub.to_string())));
    all.truncate(PAGE as usize);
    Ok(all)
}

/// What giving one entry a unit came to.
enum Given {
    Won,
    /// It had one already, or was passed over (its user holds as many orders as
    /// `per_user` allows).
    Repeat,
    /// No bucket has a unit to give.
    NoUnit,
    /// A bucket that may have one cannot lend now (its master is short of replicas).
    Wait,
}

/// Gives `user` a unit in their home bucket (`lua/award.lua`), borrowing one from the
/// item's other buckets while it has none.
async fn give(
    conn: &mut RedisConn,
    keys: &Keys,
    item: &Item,
    buckets: &[ItemKeys],
    user: UserId,
    lending: Lending<'_>,
) -> Result<Given, RedisError> {
    let home = &buckets[usize::from(item_home(item, user).index).min(buckets.len() - 1)];
    let now = crate::clock::now().timestamp_millis();
    let order = item.order_for(home.bucket, user, now);
    let json = order.to_json();
    loop {
        let (outcome, _): (String, String) = redis_timed(
            AWARD
                .key(&home.meta)
                .key(&home.tokens)
                .key(home.buyer_orders(user))
                .key(&home.pending)
                .key(&home.outbox)
                .key(keys.entries(home.bucket))
                .key(keys.awarded(home.bucket))
                .arg(user.get())
                .arg(order.order_sn.as_str())
                .arg(now)
                .arg(&json)
                .invoke_async(conn),
        )
        .await?;
        match outcome.as_str() {
            "won" => return Ok(Given::Won),
            "repeat" | "passed" => return Ok(Given::Repeat),
            "sold_out" if item.split() => {
                let lenders = buckets.iter().filter(|b| b.bucket != home.bucket);
                let borrowed = transfer::borrow(conn, home, lenders, lending).await?;
                if borrowed.stalled {
                    return Ok(Given::Wait);
                }
                if !borrowed.moved {
                    return Ok(Given::NoUnit);
                }
            }
            "sold_out" => return Ok(Given::NoUnit),
            // A warm-up replacing the units, or none loaded: the next pass tries again.
            "reloading" | "not_loaded" => return Ok(Given::Wait),
            other => {
                return Err(RedisError::Unexpected(format!(
                    "award.lua answered {other:?}"
                )));
            }
        }
    }
}
