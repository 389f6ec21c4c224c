//! A press on a draw's item (`"mode": "draw"`) before `draw_at`: an entry, not a purchase
//! (`crate::draw::entry`). Rate limits, the shop, the breakers and the pause apply as they
//! do to purchases.

use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::{ItemId, UserId};
use crate::draw::entry::{self, Entering, EntryError};
use crate::http::error::ApiError;
use crate::http::reply::{envelope, ok};
use crate::items::catalog::CatalogItem;
use crate::state::AppState;

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
    let entering = entry::enter(&state.deps.redis, &state.deps.keys, item, user)
        .await
        .map_err(|e| match e {
            EntryError::Redis(e) => ApiError::Redis(e),
            EntryError::Internal(e) => ApiError::Internal(e),
        })?;
    let entry = Entered {
        entry_id: format!("{}:{user}", item.record.id),
        item_id: item.record.id,
    };
    match entering {
        Entering::Entered => Ok(envelope(StatusCode::ACCEPTED, "entered", entry)),
        Entering::Again => Ok(ok("entered", entry)),
        Entering::Refused(outcome) => Err(refusal(outcome, item)),
    }
}
