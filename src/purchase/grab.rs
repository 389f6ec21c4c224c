//! The Redis side of a purchase: one `FCALL` of `grab.lua`, one round trip.

use crate::domain::{OrderSn, UserId};
use crate::items::catalog::CatalogItem;
use crate::keys::{ItemKeys, Keys};
use crate::lua::{BOUGHT, GIVE_BACK, GRAB};
use crate::store::{RedisError, redis_timed};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrabOutcome {
    /// In this place of the buyer's record (0 for an item with one per buyer).
    Won {
        slot: u8,
    },
    /// The buyer's `Idempotency-Key` bought this order before, and nothing can take it
    /// back: it is in MySQL, or wins are never given back (no replicas asked for, or the
    /// `degrade` policy).
    Repeat(OrderSn),
    /// The buyer's `Idempotency-Key` bought this order before, and it is still pending:
    /// claimed now, so that no give-back takes it, it is theirs once its replicas hold the
    /// claim (`lua/lib/repeats.lua`).
    RepeatClaimed(OrderSn),
    Duplicate(OrderSn),
    /// The buyer holds `per_user` live orders (more than one).
    LimitReached(Vec<OrderSn>),
    /// A `Duplicate` or `LimitReached` naming orders some of which are still pending:
    /// claimed now, so that no give-back takes them, it stands once their replicas hold the
    /// claims (`lua/lib/repeats.lua`).
    HeldClaimed(Box<GrabOutcome>),
    SoldOut,
    /// Everything released is sold; the next wave opens at this time (ms).
    BetweenReleases(i64),
    Paused,
    NotLoaded,
    /// A warm-up is replacing the item's units (its buckets are fenced).
    Reloading,
    NotStarted,
    Ended,
    /// A split item's buyer kept losing borrowed units to others of their bucket: there
    /// may still be units, so not "sold out" (see `Refill::grab` in `sell.rs`).
    StillMoving,
}

impl GrabOutcome {
    pub fn as_str(&self) -> &'static str {
        match self {
            GrabOutcome::Won { .. } => "won",
            GrabOutcome::Repeat(_) => "repeat",
            GrabOutcome::RepeatClaimed(_) => "repeat_claimed",
            GrabOutcome::Duplicate(_) => "duplicate",
            GrabOutcome::LimitReached(_) => "limit_reached",
            GrabOutcome::HeldClaimed(_) => "held_claimed",
            GrabOutcome::SoldOut => "sold_out",
            GrabOutcome::BetweenReleases(_) => "between_releases",
            GrabOutcome::Paused => "paused",
            GrabOutcome::NotLoaded => "not_loaded",
            GrabOutcome::Reloading => "reloading",
            GrabOutcome::NotStarted => "not_started",
            GrabOutcome::Ended => "ended",
            GrabOutcome::StillMoving => "still_moving",
        }
    }
}

/// A buyer's `Idempotency-Key` and the key of its record in their home bucket.
#[derive(Clone, Debug)]
pub struct IdempotencyKey {
    pub key: String,
    pub record: String,
}

impl IdempotencyKey {
    pub fn of(keys: &Keys, item: &CatalogItem, user: UserId, key: String) -> Self {
        Self {
            record: keys.idempotency(item.home(user).bucket, user, &key),
            key,
        }
    }
}

/// `per_user` is the item's limit as the caller's catalogue has it: a buyer who holds
/// that many orders is answered from their record alone (see `lua/grab.lua`). `claims`:
/// an answer naming orders the buyer holds (a repeat of their key, `duplicate`,
/// `limit_reached`) claims those still pending, as when replicas are asked for and a win
/// they do not confirm is given back (`lua/lib/repeats.lua`).
///
/// With the outcome, the loans the bucket had made when it had no unit to sell (a split
/// item's, `lua/lend.lua`; 0 otherwise): see `Refill::grab` in `sell.rs`.
pub async fn grab(
    conn: &mut impl redis::aio::ConnectionLike,
    keys: &ItemKeys,
    (user, per_user): (UserId, u8),
    order_sn: &OrderSn,
    order_json: &str,
    idempotency: Option<&IdempotencyKey>,
    claims: bool,
) -> Result<(GrabOutcome, u64), RedisError> {
    // Claiming, the outbox before the key's record, as `give_back.lua` takes them.
    let outbox = claims.then_some(keys.outbox.as_str());
    let named = purchase_keys(keys, user, outbox, idempotency);
    let mut call = GRAB.call(named.len());
    call.arg(&named)
        .arg(user.get())
        .arg(order_sn.as_str())
        .arg(order_json);
    if claims {
        // The limit in ARGV[5], so that none of the answers that claim nothing matches.
        call.arg("").arg(per_user.max(1));
    } else {
        call.arg(per_user.max(1));
    }
    let answer: String = GRAB.invoke(&call, conn).await?;
    let (outcome, detail) = answer.split_once(' ').unwrap_or((&answer, ""));
    let order = |detail: &str| {
        OrderSn::parse(detail)
            .ok_or_else(|| RedisError::Unexpected(format!("buyer record holds {detail:?}")))
    };
    let orders = |detail: &str| detail.split(' ').map(order).collect::<Result<_, _>>();
    let odd = || RedisError::Unexpected(format!("grab.lua answered {outcome} {detail:?}"));
    // Claimed: orders named that are still pending (`lua/lib/repeats.lua`).
    let claimed = |refused| GrabOutcome::HeldClaimed(Box::new(refused));
    if outcome == "sold_out" {
        let lends = match detail {
            "" => 0,
            lends => lends.parse().map_err(|_| odd())?,
        };
        return Ok((GrabOutcome::SoldOut, lends));
    }
    let outcome = match outcome {
        "won" if detail.is_empty() => GrabOutcome::Won { slot: 0 },
        "won" => GrabOutcome::Won {
            slot: detail.parse().map_err(|_| odd())?,
        },
        "repeat" | "claimed" => repeat(outcome, order(detail)?),
        "duplicate" => GrabOutcome::Duplicate(order(detail)?),
        "claimed_duplicate" => claimed(GrabOutcome::Duplicate(order(detail)?)),
        "limit_reached" => GrabOutcome::LimitReached(orders(detail)?),
        "claimed_limit_reached" => claimed(GrabOutcome::LimitReached(orders(detail)?)),
        "between_releases" => GrabOutcome::BetweenReleases(detail.parse().map_err(|_| odd())?),
        "paused" => GrabOutcome::Paused,
        "not_loaded" => GrabOutcome::NotLoaded,
        "reloading" => GrabOutcome::Reloading,
        "not_started" => GrabOutcome::NotStarted,
        "ended" => GrabOutcome::Ended,
        other => {
            return Err(RedisError::Unexpected(format!(
                "grab.lua answered {other:?}"
            )));
        }
    };
    Ok((outcome, 0))
}

/// A repeat's outcome from `lua/lib/repeats.lua`'s answer (`repeat` or `claimed`).
fn repeat(answer: &str, order_sn: OrderSn) -> GrabOutcome {
    if answer == "claimed" {
        GrabOutcome::RepeatClaimed(order_sn)
    } else {
        GrabOutcome::Repeat(order_sn)
    }
}

/// The order `idempotency` bought (`None`: nothing), claimed while it is pending (as a
/// grab claims it: `lua/bought.lua`), for a press memory refused. A `Repeat` or a
/// `RepeatClaimed`.
pub async fn bought(
    conn: &mut impl redis::aio::ConnectionLike,
    keys: &ItemKeys,
    idempotency: &IdempotencyKey,
) -> Result<Option<GrabOutcome>, RedisError> {
    let mut call = BOUGHT.prepare_invoke();
    call.key(&idempotency.record)
        .key(&keys.pending)
        .key(&keys.outbox);
    let answer: Option<String> = redis_timed(call.invoke_async(conn)).await?;
    let Some(answer) = answer else {
        return Ok(None);
    };
    match answer.split_once(' ') {
        Some((outcome @ ("repeat" | "claimed"), sn)) => match OrderSn::parse(sn) {
            Some(order_sn) => Ok(Some(repeat(outcome, order_sn))),
            None => Err(RedisError::Unexpected(format!(
                "an Idempotency-Key's record holds {sn:?}"
            ))),
        },
        _ => Err(RedisError::Unexpected(format!(
            "bought.lua answered {answer:?}"
        ))),
    }
}

/// Undoes a win whose replicas did not confirm it in time (`lua/give_back.lua`): true when
/// its unit is on sale again, false when the order stays (someone is sending it, or it is
/// gone already).
pub async fn give_back(
    conn: &mut impl redis::aio::ConnectionLike,
    keys: &ItemKeys,
    user: UserId,
    order_sn: &OrderSn,
    idempotency: Option<&IdempotencyKey>,
) -> Result<bool, RedisError> {
    let mut call = GIVE_BACK.prepare_invoke();
    for key in purchase_keys(keys, user, Some(&keys.outbox), idempotency) {
        call.key(key);
    }
    call.arg(user.get())
        .arg(order_sn.as_str())
        .arg(idempotency.map_or("", |i| i.key.as_str()));
    let outcome: String = redis_timed(call.invoke_async(conn)).await?;
    Ok(outcome == "given_back")
}

/// `grab.lua`'s and `give_back.lua`'s keys, in their order: the bucket's meta and units,
/// the buyer's records, the pending orders, the outbox (`give_back.lua`'s, and a grab's
/// that claims: a won order is entered by whoever sends it) and (with a key) its record.
fn purchase_keys<'a>(
    keys: &'a ItemKeys,
    user: UserId,
    outbox: Option<&'a str>,
    idempotency: Option<&'a IdempotencyKey>,
) -> Vec<&'a str> {
    let mut named = vec![
        keys.meta.as_str(),
        keys.tokens.as_str(),
        keys.buyer_orders(user),
        keys.pending.as_str(),
    ];
    named.extend(outbox);
    named.extend(idempotency.map(|i| i.record.as_str()));
    named
}
