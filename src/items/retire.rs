//! Retiring an ended sale: `SECKILL_SALE_RETENTION_S` after its reconciliation its Redis
//! state goes and MySQL alone answers for it — nothing in flight checked first, MySQL told
//! (`retired_at`, `unsold`), the keys, index entries, marks and breaker deleted, MySQL told
//! again (`redis_cleared_at`); each step can be repeated, so a crash or a second scheduler
//! does no harm, and an item retired but not cleared resumes at the keys. Whether it is
//! due is read again under the item's locks, and recorded only if the row still says so:
//! a sale reopened meanwhile keeps its state. Why: docs/architecture.md, "Retention".

use std::time::Duration;

use crate::breaker::Scope;
use crate::domain::ItemId;
use crate::keys::Keys;
use crate::lock::RedisLock;
use crate::marks::{self, Work};
use crate::orders::repo as orders;
use crate::store::{Db, Grouped, RedisConns, RedisError, StoreError};

use super::repo::{self, Item};
use super::stock;

/// Longest a retirement holds the item's warm-up and reconciliation locks.
const LOCK_FOR: Duration = Duration::from_secs(60);

/// What [`retire`] did with an item.
#[derive(Debug, PartialEq, Eq)]
pub enum Retirement {
    /// Its Redis state is gone.
    Done,
    /// A warm-up or a reconciliation of it is running: later.
    Busy,
    /// Something of it is still on its way (named): later.
    InFlight(&'static str),
    /// Its row no longer says it is due: its sale was reopened (a `PUT` moved its end, a
    /// warm-up loaded it again) or another scheduler retired it, since the due list was
    /// read. Nothing was changed.
    NotDue,
}

/// Retires the item if it is due (`retention` after its reconciliation, or cut off
/// halfway): see the module's header.
pub async fn retire(
    db: &Db,
    redis: &RedisConns,
    keys: &Keys,
    id: ItemId,
    retention: Duration,
) -> Result<Retirement, StoreError> {
    // Neither a warm-up (which would load it again) nor a reconciliation (which reads
    // what is being deleted) runs meanwhile.
    let wanted = vec![keys.warmup_lock(id), keys.reconcile_lock(id)];
    let taken = RedisLock::try_take_many(redis, wanted, LOCK_FOR).await?;
    let all_taken = taken.iter().all(Option::is_some);
    let locks: Vec<RedisLock> = taken.into_iter().flatten().collect();
    let outcome = if all_taken {
        retire_locked(db, redis, keys, id, retention).await
    } else {
        Ok(Retirement::Busy)
    };
    if let Err(e) = RedisLock::release_many(redis, locks).await {
        tracing::warn!(item = %id, error = %e, "could not release the retirement's locks; they expire by themselves");
    }
    outcome
}

async fn retire_locked(
    db: &Db,
    redis: &RedisConns,
    keys: &Keys,
    id: ItemId,
    retention: Duration,
) -> Result<Retirement, StoreError> {
    // The row as it is now, not as the due list read it: a `PUT` may have moved the sale's
    // end since, or a warm-up (before the locks were taken) loaded it again.
    let Some(item) = repo::due_to_retire(db, id, retention).await? else {
        return Ok(Retirement::NotDue);
    };
    if item.retired_at.is_none() {
        if let Some(what) = in_flight(redis, keys, &item).await? {
            return Ok(Retirement::InFlight(what));
        }
        let counts = orders::count_by_status(db, id).await?;
        if counts.unpaid > 0 {
            return Ok(Retirement::InFlight("unpaid orders"));
        }
        // Redis again: a cancel MySQL has committed by the read above recorded its
        // `ending` before it committed, and keeps it until its unit is back on the list;
        // read only before, a cancel between the two reads left its unit out of `unsold`
        // (and `clear` deleted its record). Nothing new can be pending by now: the first
        // read found nothing pending, and an ended sale takes no purchase.
        if let Some(what) = in_flight(redis, keys, &item).await? {
            return Ok(Retirement::InFlight(what));
        }
        let snapshot = {
            let mut conn = redis.bulk().await?;
            stock::item_snapshot(&mut conn, keys, item.bucket_ids()).await?
        };
        // A sale no order held a unit of (never loaded, or lost before it sold) sold
        // nothing. Otherwise what Redis lists is what is known to be unsold: a sale whose
        // units Redis lost records no more than that, so its stock does not add up
        // after the retirement either — total − paid would make it up.
        let unsold = if snapshot.loaded || counts.paid > 0 {
            snapshot.remaining
        } else {
            u64::from(item.total)
        };
        // A `PUT` does not wait for these locks: one reopening the sale from the read
        // above on leaves the row not due, and then nothing is recorded or deleted.
        if !repo::mark_retired(db, &item, unsold_count(id, unsold)?, retention).await? {
            return Ok(Retirement::NotDue);
        }
    }
    clear(redis, keys, &item).await?;
    repo::mark_cleared(db, id).await?;
    Ok(Retirement::Done)
}

/// `unsold` as the count MySQL keeps; more than a count holds is no number of units an
/// item has, so Redis's figures are wrong and nothing is recorded.
fn unsold_count(id: ItemId, unsold: u64) -> Result<u32, RedisError> {
    u32::try_from(unsold).map_err(|_| {
        RedisError::Unexpected(format!(
            "item {id}: {unsold} units listed as unsold, more than an item can hold ({})",
            u32::MAX
        ))
    })
}

/// What of the sale is still on its way in Redis, if anything (its delay-queue tasks
/// not taken may stay: every order is final by now, so they would change nothing).
async fn in_flight(
    redis: &RedisConns,
    keys: &Keys,
    item: &Item,
) -> Result<Option<&'static str>, StoreError> {
    let stocks: Vec<_> = item.bucket_ids().collect();
    let held = marks::holdings(redis, keys, &stocks).await?;
    Ok(held.iter().find_map(|h| {
        [
            (h.pending, "pending orders"),
            (h.outbox, "orders in the outbox"),
            (h.ending, "cancels under way"),
            (h.lent, "units on loan"),
            (h.leased, "deadline tasks being worked"),
        ]
        .into_iter()
        .find(|(n, _)| *n > 0)
        .map(|(_, what)| what)
    }))
}

/// Deletes every key of the sale, then its entries in the index, the marks and the
/// breakers (each a single key outside the item's slots).
async fn clear(redis: &RedisConns, keys: &Keys, item: &Item) -> Result<(), StoreError> {
    let mut grouped = Grouped::new(redis);
    for stock in item.bucket_ids() {
        grouped.group().unlink(keys.sale_state(stock)).ignore();
    }
    // The waiting room, in a slot of its own.
    grouped
        .group()
        .unlink(keys.queue(item.id).all().to_vec())
        .ignore();
    grouped.run(redis).await?;
    let members: Vec<String> = item.bucket_ids().map(|s| s.to_string()).collect();
    let mut grouped = Grouped::new(redis);
    grouped.group().srem(keys.items_index(), &members).ignore();
    for work in Work::ALL {
        grouped.group().zrem(work.key(keys), &members).ignore();
    }
    grouped
        .group()
        .hdel(keys.breakers(), Scope::Item(item.id).field())
        .ignore();
    grouped.run(redis).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsold_count_out_of_range_is_an_error_not_a_number() {
        let id = ItemId::new(7).unwrap();
        assert_eq!(unsold_count(id, 3).unwrap(), 3);
        assert_eq!(unsold_count(id, u64::from(u32::MAX)).unwrap(), u32::MAX);
        let e = unsold_count(id, u64::from(u32::MAX) + 1).unwrap_err();
        assert!(e.to_string().contains("item 7: 4294967296 units"), "{e}");
    }
}
