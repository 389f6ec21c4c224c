//! `GET /api/items/{id}`: what a storefront shows (from the catalogue; its stock read again
//! when older than half a second).

use axum::extract::State;
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::ItemId;
use crate::error::{ApiError, Refusal};
use crate::http::extract::{ApiPath, Reader};
use crate::http::reply::ok;
use crate::state::{AppState, Shared};

use super::catalog::ItemStatus;

/// What a storefront shows of an item.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_item))
}

/// An item as a storefront shows it.
#[derive(Serialize, ToSchema)]
struct ItemView<'a> {
    item_id: ItemId,
    name: &'a str,
    shop_id: u64,
    status: ItemStatus,
    total: u32,
    /// Units still on sale (read again when older than half a second).
    remaining: u64,
    start_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
    price_cents: u64,
    pay_timeout_s: u32,
}

/// What a storefront shows of an item (no token needed).
#[utoipa::path(
    get,
    path = "/api/items/{item_id}",
    tag = "catalogue",
    params(("item_id" = ItemId, Path)),
    responses(
        (status = 200, description = "`ok`", body = ItemView),
        (status = 404, description = "`item_not_found`", body = Refusal),
        (status = 429, description = "`rate_limited`: the IP's read rate", body = Refusal),
    )
)]
async fn get_item(
    _: Reader,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    let Shared { catalog, .. } = &*state;
    let entry = catalog.get(id).await?.ok_or(ApiError::ItemNotFound)?;
    catalog.fresh_stock(&entry).await;
    let item = &entry.item;
    Ok(ok(
        "ok",
        ItemView {
            item_id: item.id,
            name: &item.name,
            shop_id: item.shop_id,
            status: entry.status(Utc::now()),
            total: item.total,
            remaining: entry.remaining(),
            start_at: item.start_at,
            end_at: item.end_at,
            price_cents: item.price_cents,
            pay_timeout_s: item.pay_timeout_s,
        },
    ))
}
