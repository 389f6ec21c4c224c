//! The Redis side of a purchase: one `EVALSHA grab.lua`, one round trip.

use redis::{Script, ScriptInvocation};

use crate::domain::{OrderSn, UserId};
use crate::keys::ItemKeys;
use crate::lua::{GIVE_BACK, GRAB};
use crate::store::{RedisError, redis_timed};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrabOutcome {
    Won,
    Duplicate(OrderSn),
    SoldOut,
    Paused,
    NotLoaded,
    /// A warm-up is replacing the item's units (its buckets are fenced).
    Reloading,
    NotStarted,
    Ended,
    /// A split item's buyer kept losing borrowed units to others of their bucket: there
    /// may still be units, so not "sold out" (see `api::refill_and_grab`).
    StillMoving,
}

impl GrabOutcome {
    pub fn as_str(&self) -> &'static str {
        match self {
            GrabOutcome::Won => "won",
            GrabOutcome::Duplicate(_) => "duplicate",
            GrabOutcome::SoldOut => "sold_out",
            GrabOutcome::Paused => "paused",
            GrabOutcome::NotLoaded => "not_loaded",
            GrabOutcome::Reloading => "reloading",
            GrabOutcome::NotStarted => "not_started",
            GrabOutcome::Ended => "ended",
            GrabOutcome::StillMoving => "still_moving",
        }
    }
}

pub async fn grab(
    conn: &mut impl redis::aio::ConnectionLike,
    keys: &ItemKeys,
    user: UserId,
    order_sn: &OrderSn,
    now_ms: i64,
    order_json: &str,
) -> Result<GrabOutcome, RedisError> {
    let (outcome, detail): (String, String) = redis_timed(
        purchase_keys(&GRAB, keys, user)
            .arg(user.get())
            .arg(order_sn.as_str())
            .arg(now_ms)
            .arg(order_json)
            .invoke_async(conn),
    )
    .await?;
    Ok(match outcome.as_str() {
        "won" => GrabOutcome::Won,
        "duplicate" => GrabOutcome::Duplicate(
            OrderSn::parse(&detail)
                .ok_or_else(|| RedisError::Unexpected(format!("buyer record holds {detail:?}")))?,
        ),
        "sold_out" => GrabOutcome::SoldOut,
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
    })
}

/// Undoes a win whose replicas did not confirm it in time (`lua/give_back.lua`): true when
/// its unit is on sale again, false when the order stays (someone is sending it, or it is
/// gone already).
pub async fn give_back(
    conn: &mut impl redis::aio::ConnectionLike,
    keys: &ItemKeys,
    user: UserId,
    order_sn: &OrderSn,
) -> Result<bool, RedisError> {
    let outcome: String = redis_timed(
        purchase_keys(&GIVE_BACK, keys, user)
            .arg(user.get())
            .arg(order_sn.as_str())
            .invoke_async(conn),
    )
    .await?;
    Ok(outcome == "given_back")
}

/// `grab.lua`'s and `give_back.lua`'s keys, in their order: the bucket's meta and units,
/// the buyer's records, the pending orders and the outbox.
fn purchase_keys<'a>(script: &'a Script, keys: &ItemKeys, user: UserId) -> ScriptInvocation<'a> {
    let mut call = script.prepare_invoke();
    call.key(&keys.meta)
        .key(&keys.tokens)
        .key(keys.buyers(user))
        .key(keys.buyer_orders(user))
        .key(&keys.pending)
        .key(&keys.outbox);
    call
}
