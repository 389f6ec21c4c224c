//! `GET /api/shops/{id}/status`: whether a shop is open now, from the nearest layer.

use axum::Router;
use axum::extract::State;
use axum::response::Response;
use axum::routing::get;
use chrono::Utc;
use serde_json::json;

use crate::error::ApiError;
use crate::http::extract::{ApiPath, Reader};
use crate::http::reply::ok;
use crate::state::{AppState, Shared};

use super::repo::Shop;

pub fn router() -> Router<AppState> {
    Router::new().route("/api/shops/{shop_id}/status", get(status))
}

/// `GET /api/shops/{id}/status`: `{"shop_id","open","updated_at"}` from the nearest layer.
async fn status(
    _: Reader,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<u64>,
) -> Result<Response, ApiError> {
    let Shared { shops, .. } = &*state;
    let shop = shops
        .lookup(id)
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))?
        .ok_or(ApiError::ShopNotFound)?;
    Ok(ok("ok", view(&shop)))
}

/// A shop as both the public and the operators' calls show it.
pub(super) fn view(shop: &Shop) -> serde_json::Value {
    json!({
        "shop_id": shop.id,
        "open": shop.open_at(Utc::now()),
        "updated_at": shop.updated_at,
    })
}
