//! `GET /api/items/{item_id}/my-entry`: how a buyer's entry in a draw fared.

use axum::extract::State;
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::{ItemId, OrderSn};
use crate::http::error::{ApiError, Refusal};
use crate::http::extract::{ApiPath, OrderSeeker};
use crate::http::reply::ok;
use crate::http::request_id;
use crate::state::{AppState, Shared};
use crate::store::redis_timed;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(my_entry))
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum EntryStatus {
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
struct MyEntry {
    status: EntryStatus,
    /// The entry's rank (lowest wins), shown once the draw is made: anyone can check it as
    /// the first six bytes of HMAC-SHA256(seed, user id) once `draw_seed` is published.
    rank: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    order_sn: Option<OrderSn>,
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
    let Shared {
        redis,
        keys,
        catalog,
        ..
    } = &*state;
    request_id::record_user(user, Some(item_id));
    // No such item, or not a draw: no entry either.
    let item = catalog
        .get(item_id)
        .await?
        .filter(|item| item.record.draw_at.is_some())
        .ok_or(ApiError::EntryNotFound)?;
    let home = item.home(user).bucket;
    let mut conn = redis.hot().await?;
    let (rank, won): (Option<u64>, Option<String>) = redis_timed(
        redis::pipe()
            .zscore(keys.entries(home), user.get())
            .hget(keys.awarded(home), user.get())
            .query_async(&mut conn),
    )
    .await?;
    let rank = rank.ok_or(ApiError::EntryNotFound)?;
    let drawn = item.record.drawn_at.is_some();
    let order_sn = won.as_deref().and_then(OrderSn::parse);
    let status = match (&order_sn, drawn) {
        (Some(_), _) => EntryStatus::Won,
        (None, true) => EntryStatus::NotDrawn,
        (None, false) => EntryStatus::Entered,
    };
    let shown = drawn || order_sn.is_some();
    Ok(ok(
        "ok",
        MyEntry {
            status,
            rank: shown.then_some(rank),
            order_sn,
        },
    ))
}
