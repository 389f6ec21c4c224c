//! A press on a draw's item (`"mode": "draw"`) before `draw_at`: an entry, not a purchase
//! (`lua/enter.lua`). Rate limits, the shop, the breakers and the pause apply as they do
//! to purchases; the rank is fixed now, by the seed and the user (`crate::draw::rank`).

use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::{ItemId, UserId};
use crate::draw::rank;
use crate::http::error::ApiError;
use crate::http::reply::{envelope, ok};
use crate::items::catalog::CatalogItem;
use crate::lua::ENTER;
use crate::state::AppState;
use crate::store::redis_timed;

use super::grab::GrabOutcome;
use super::refusal::refusal;

/// An entry in a draw.
#[derive(Serialize, ToSchema)]
pub struct Entered {
    /// The same for every press of this user on this item.
    entry_id: String,
    item_id: ItemId,
}

/// Enters `user` into the item's draw: `202 entered`, or `200 entered` with the same entry
/// when pressed again.
pub async fn enter(
    state: &AppState,
    item: &CatalogItem,
    user: UserId,
) -> Result<Response, ApiError> {
    let seed = item
        .record
        .draw_seed
        .as_deref()
        .ok_or_else(|| anyhow::anyhow!("draw item {} has no seed", item.record.id))?;
    let home = item.home(user);
    let mut conn = state.redis.hot().await?;
    let outcome: String = redis_timed(
        ENTER
            .key(&home.meta)
            .key(state.keys.entries(home.bucket))
            .arg(user.get())
            .arg(rank::rank(seed, user))
            .invoke_async(&mut conn),
    )
    .await?;
    let entry = Entered {
        entry_id: format!("{}:{user}", item.record.id),
        item_id: item.record.id,
    };
    match outcome.as_str() {
        "entered" => {
            tracing::info!(outcome = "entered", "draw_entry");
            Ok(envelope(StatusCode::ACCEPTED, "entered", entry))
        }
        "again" => Ok(ok("entered", entry)),
        "closed" => Err(ApiError::Ended),
        "not_started" => Err(refusal(GrabOutcome::NotStarted, item)),
        "not_loaded" => Err(refusal(GrabOutcome::NotLoaded, item)),
        "reloading" => Err(refusal(GrabOutcome::Reloading, item)),
        "paused" => Err(ApiError::Paused),
        other => Err(anyhow::anyhow!("enter.lua answered {other:?}").into()),
    }
}
