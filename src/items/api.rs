//! `GET /api/items/{id}`: what a storefront shows (from the catalogue; its stock read again
//! when older than half a second).

use axum::Router;
use axum::extract::State;
use axum::response::Response;
use axum::routing::get;
use chrono::Utc;
use serde_json::json;

use crate::domain::ItemId;
use crate::error::ApiError;
use crate::http::extract::{ApiPath, Reader};
use crate::http::reply::ok;
use crate::state::{AppState, Shared};

/// What a storefront shows of an item.
pub fn router() -> Router<AppState> {
    Router::new().route("/api/items/{item_id}", get(get_item))
}

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
        json!({
            "item_id": item.id,
            "name": item.name,
            "shop_id": item.shop_id,
            "status": entry.status(Utc::now()),
            "total": item.total,
            "remaining": entry.remaining(),
            "start_at": item.start_at,
            "end_at": item.end_at,
            "price_cents": item.price_cents,
            "pay_timeout_s": item.pay_timeout_s,
        }),
    ))
}
