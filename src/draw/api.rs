//! `GET /api/items/{item_id}/my-entry`: how a buyer's entry in a draw fared.

use axum::extract::State;
use axum::response::Response;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::deps::Deps;
use crate::domain::ItemId;
use crate::http::error::{ApiError, Refusal};
use crate::http::extract::{ApiPath, OrderSeeker};
use crate::http::reply::ok;
use crate::http::request_id;
use crate::state::AppState;

use super::entry::{self, MyEntry};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(my_entry))
}

#[utoipa::path(
    get,
    path = "/api/items/{item_id}/my-entry",
    tag = "orders",
    summary = "The user's entry in a draw",
    security(("user" = [])),
    params(("item_id" = ItemId, Path)),
    responses(
        (status = 200, description = "`ok`: `entered`, `won` (with `order_sn`) or `not_drawn`", body = MyEntry),
        (status = 404, description = "`entry_not_found`: the user did not enter (or there is no such draw)", body = Refusal),
        (status = 429, description = "`rate_limited`", body = Refusal),
    )
)]
/// `GET /api/items/{item_id}/my-entry`
async fn my_entry(
    State(state): State<AppState>,
    OrderSeeker(user): OrderSeeker,
    ApiPath(item_id): ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    let Deps { redis, keys, .. } = &state.deps;
    let catalog = &state.catalog;
    request_id::record_user(user, Some(item_id));
    // No such item, or not a draw: no entry either.
    let item = catalog
        .get(item_id)
        .await?
        .filter(|item| item.record.draw_at.is_some())
        .ok_or(ApiError::EntryNotFound)?;
    let entry = entry::standing(redis, keys, &item, user)
        .await?
        .ok_or(ApiError::EntryNotFound)?;
    Ok(ok("ok", entry))
}
