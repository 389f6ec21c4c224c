//! The draw (run by the scheduler: `crate::scheduler::draws`): once `draw_at` has passed by
//! Redis's clock (the one entries close by), the
//! units go to the entries of lowest rank, one each, in rank order — this first round
//! whenever the scheduler gets to it, also after `end_at` (a draw at the end, the default,
//! is drawn then); then, every pass until `end_at`, a unit a winner gave back (a cancel, a
//! missed pay deadline) goes to the next entry by rank.
//!
//! Each winner's unit is given by `lua/award.lua`, which records the winner in the same
//! step: giving it again answers "repeat". So a scheduler killed mid-draw resumes where it
//! was cut off, two schedulers never give one entry two units, and a winner who cancelled
//! is not given the unit back. The units are the item's loaded tokens, so no more than
//! `total` are ever given, whatever runs twice.
//!
//! Each round walks the entries from the lowest rank, skipping those already decided (a
//! unit given, or passed over), not from MySQL's `draw_cutoff`: an award Redis lost after
//! the cut-off was recorded (a failover that lost the last writes) leaves an entry below
//! the cut-off with nothing, and it must have the unit before any rank above. The walk
//! costs a read of the decided entries only while a unit waits on the list and some entry
//! is undecided.
//!
//! Before its first unit the round closes the entries for good (`drawn` in each bucket's
//! meta, which `lua/enter.lua` checks): whatever `draw_at` says later, no entry is taken
//! once the draw is being made. Once the first round is complete it says so in each
//! bucket's meta (`first_round_done`) before MySQL's `drawn_at` records it: `award.lua`
//! gives units after `end_at` only while neither says the first round is done.

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
    /// Units or entries ran out, or the sale ended: every entry of rank ≤ `cutoff` has a
    /// unit (or was passed over: its user held as many orders as `per_user` allows), and
    /// no more can be given now.
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
    let first = item.drawn_at.is_none();
    if first {
        close_entries(redis, &buckets).await?;
    }
    let round = round(redis, keys, item, &buckets, &mut conn).await?;
    if round.complete && first {
        mark_first_round_done(redis, &buckets).await?;
    }
    Ok(Some(round))
}

/// Gives units by rank until they or the entries run out, the sale ended (after the first
/// round), or a bucket cannot lend now.
async fn round(
    redis: &RedisConns,
    keys: &Keys,
    item: &Item,
    buckets: &[ItemKeys],
    conn: &mut RedisConn,
) -> Result<Round, RedisError> {
    let mut round = Round {
        cutoff: item.draw_cutoff,
        ..Round::default()
    };
    // Every unit given (the usual state between the draw and `end_at`), or every entry
    // decided: nothing to read.
    let counts = counts(redis, keys, buckets).await?;
    if counts.listed == 0 || counts.decided >= counts.entries {
        round.complete = true;
        return Ok(round);
    }
    let lending = Lending { redis, keys };
    let mut from = None;
    loop {
        let page = next_entries(conn, keys, buckets, from).await?;
        let last_page = page.len() < PAGE as usize;
        for entry in &page {
            let given = if entry.decided {
                Given::Repeat
            } else {
                give(conn, keys, item, buckets, entry.user, lending).await?
            };
            match given {
                Given::Won => {
                    round.given += 1;
                    round.cutoff = round.cutoff.max(Some(entry.rank));
                }
                Given::Repeat => round.cutoff = round.cutoff.max(Some(entry.rank)),
                Given::NoUnit | Given::Ended => {
                    round.complete = true;
                    return Ok(round);
                }
                Given::Wait => return Ok(round),
            }
        }
        match page.last() {
            Some(entry) if !last_page => from = Some(entry.rank),
            _ => {
                round.complete = true;
                return Ok(round);
            }
        }
    }
}

/// Notes in every bucket's meta that the first round is done (`first_round_done`): from
/// then on `lua/award.lua` gives nothing after the sale's end, whatever a draw pass's
/// record of the item still says. Written before MySQL's `drawn_at`.
async fn mark_first_round_done(redis: &RedisConns, buckets: &[ItemKeys]) -> Result<(), RedisError> {
    let mut grouped = Grouped::new(redis);
    for bucket in buckets {
        grouped
            .group()
            .hset(&bucket.meta, "first_round_done", 1)
            .ignore();
    }
    grouped.run(redis).await
}

/// Marks every bucket's entries closed for good (`drawn` in its meta: `lua/enter.lua`).
async fn close_entries(redis: &RedisConns, buckets: &[ItemKeys]) -> Result<(), RedisError> {
    let mut grouped = Grouped::new(redis);
    for bucket in buckets {
        grouped.group().hset_nx(&bucket.meta, "drawn", 1).ignore();
    }
    grouped.run(redis).await
}

/// What a round looks at before it reads any entry.
struct Counts {
    /// Units on the buckets' lists.
    listed: u64,
    entries: u64,
    /// Entries given a unit or passed over (`awarded`).
    decided: u64,
}

/// [`Counts`] over the buckets (one round trip per server).
async fn counts(
    redis: &RedisConns,
    keys: &Keys,
    buckets: &[ItemKeys],
) -> Result<Counts, RedisError> {
    let mut grouped = Grouped::new(redis);
    for bucket in buckets {
        grouped
            .group()
            .llen(&bucket.tokens)
            .zcard(keys.entries(bucket.bucket))
            .hlen(keys.awarded(bucket.bucket));
    }
    let each: Vec<(u64, u64, u64)> = grouped.query(redis).await?;
    Ok(each.into_iter().fold(
        Counts {
            listed: 0,
            entries: 0,
            decided: 0,
        },
        |sum, (listed, entries, decided)| Counts {
            listed: sum.listed + listed,
            entries: sum.entries + entries,
            decided: sum.decided + decided,
        },
    ))
}

/// The bucket that keeps `user`'s entry and record of the item.
fn item_home(item: &Item, user: UserId) -> BucketId {
    BucketId::home(item.id, user, item.buckets)
}

/// An entry as a round reads it.
struct Entry {
    user: UserId,
    rank: u64,
    /// Given a unit, or passed over, before (`awarded` has it).
    decided: bool,
}

/// The next entries by rank from `from` on (inclusive: an entry tied with the last one
/// read comes again, decided by then; `None`: from the lowest), merged over the buckets.
async fn next_entries(
    conn: &mut RedisConn,
    keys: &Keys,
    buckets: &[ItemKeys],
    from: Option<u64>,
) -> Result<Vec<Entry>, RedisError> {
    let from = from.map_or("-inf".to_owned(), |rank| rank.to_string());
    let mut all: Vec<Entry> = Vec::new();
    for bucket in buckets {
        let page: Vec<(u64, f64)> = redis_timed(conn.zrangebyscore_limit_withscores(
            keys.entries(bucket.bucket),
            &from,
            "+inf",
            0,
            PAGE,
        ))
        .await?;
        if page.is_empty() {
            continue;
        }
        let users: Vec<u64> = page.iter().map(|(user, _)| *user).collect();
        let awarded: Vec<Option<String>> = redis_timed(
            redis::cmd("HMGET")
                .arg(keys.awarded(bucket.bucket))
                .arg(&users)
                .query_async(conn),
        )
        .await?;
        all.extend(
            page.into_iter()
                .zip(awarded)
                .map(|((user, rank), awarded)| Entry {
                    user: UserId::new(user),
                    rank: rank as u64,
                    decided: awarded.is_some(),
                }),
        );
    }
    // Lowest rank first; a tie (one in ~10^14) by user id as text, as Redis orders it.
    all.sort_by(|a, b| {
        a.rank
            .cmp(&b.rank)
            .then_with(|| a.user.to_string().cmp(&b.user.to_string()))
    });
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
    /// The sale ended by Redis's clock and the first round is done: nothing more is given.
    Ended,
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
                .arg(if item.drawn_at.is_none() { "1" } else { "0" })
                .invoke_async(conn),
        )
        .await?;
        match outcome.as_str() {
            "won" => return Ok(Given::Won),
            "repeat" | "passed" => return Ok(Given::Repeat),
            "ended" => return Ok(Given::Ended),
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
