//! A buyer's entry in a draw: entering it (`lua/enter.lua`; the rank is fixed now, by the
//! seed and the user: [`super::rank`]) and how it fared. `crate::purchase::entry` and
//! `api.rs` are their HTTP surface.

use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::{OrderSn, UserId};
use crate::items::catalog::CatalogItem;
use crate::keys::Keys;
use crate::lua::ENTER;
use crate::purchase::grab::GrabOutcome;
use crate::store::{RedisConns, RedisError, redis_timed};

use super::rank;

/// What a press on a draw's item did.
pub enum Entering {
    /// A new entry.
    Entered,
    /// The entry this user already had.
    Again,
    /// No entry: the draw is closed, not open yet, not loaded, being reloaded or paused.
    Refused(GrabOutcome),
}

/// Why a press on a draw's item could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum EntryError {
    #[error(transparent)]
    Redis(#[from] RedisError),
    #[error(transparent)]
    Internal(anyhow::Error),
}

/// Enters `user` into the item's draw (once: a second press finds the same entry).
pub async fn enter(
    redis: &RedisConns,
    keys: &Keys,
    item: &CatalogItem,
    user: UserId,
) -> Result<Entering, EntryError> {
    let seed = item.record.draw_seed.as_deref().ok_or_else(|| {
        EntryError::Internal(anyhow::anyhow!("draw item {} has no seed", item.record.id))
    })?;
    let rank = rank::rank(seed, user)
        .map_err(|e| EntryError::Internal(anyhow::anyhow!("draw item {}: {e}", item.record.id)))?;
    let home = item.home(user);
    let mut conn = redis.hot().await?;
    let outcome: String = redis_timed(
        ENTER
            .key(&home.meta)
            .key(keys.entries(home.bucket))
            .arg(user.get())
            .arg(rank)
            .invoke_async(&mut conn),
    )
    .await?;
    Ok(match outcome.as_str() {
        "entered" => {
            tracing::info!(outcome = "entered", "draw_entry");
            Entering::Entered
        }
        "again" => Entering::Again,
        "closed" => Entering::Refused(GrabOutcome::Ended),
        "not_started" => Entering::Refused(GrabOutcome::NotStarted),
        "not_loaded" => Entering::Refused(GrabOutcome::NotLoaded),
        "reloading" => Entering::Refused(GrabOutcome::Reloading),
        "paused" => Entering::Refused(GrabOutcome::Paused),
        other => {
            return Err(EntryError::Internal(anyhow::anyhow!(
                "enter.lua answered {other:?}"
            )));
        }
    })
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EntryStatus {
    /// Entered; the draw has not been made.
    Entered,
    /// Given a unit: `order_sn` is the order.
    Won,
    /// Drawn, and not given a unit (yet: a winner's unit given back passes to the next
    /// entry by rank until `end_at`).
    NotDrawn,
}

/// A buyer's entry in a draw.
#[derive(Serialize, ToSchema)]
pub struct MyEntry {
    status: EntryStatus,
    /// The entry's rank (lowest wins), shown once the draw is made: anyone can check it as
    /// the first six bytes of HMAC-SHA256(seed, user id) once `draw_seed` is published.
    rank: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    order_sn: Option<OrderSn>,
}

/// How `user`'s entry in the draw of `item` fared; `None` when they did not enter.
pub async fn standing(
    redis: &RedisConns,
    keys: &Keys,
    item: &CatalogItem,
    user: UserId,
) -> Result<Option<MyEntry>, RedisError> {
    let home = item.home(user).bucket;
    let mut conn = redis.hot().await?;
    let (rank, won): (Option<u64>, Option<String>) = redis_timed(
        redis::pipe()
            .zscore(keys.entries(home), user.get())
            .hget(keys.awarded(home), user.get())
            .query_async(&mut conn),
    )
    .await?;
    let Some(rank) = rank else {
        return Ok(None);
    };
    let drawn = item.record.drawn_at.is_some();
    let order_sn = won.as_deref().and_then(OrderSn::parse);
    let status = match (&order_sn, drawn) {
        (Some(_), _) => EntryStatus::Won,
        (None, true) => EntryStatus::NotDrawn,
        (None, false) => EntryStatus::Entered,
    };
    let shown = drawn || order_sn.is_some();
    Ok(Some(MyEntry {
        status,
        rank: shown.then_some(rank),
        order_sn,
    }))
}
