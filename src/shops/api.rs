//! `GET /api/shops/{id}/status`: whether a shop is open now, from the nearest layer.

use axum::extract::State;
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::error::{ApiError, Refusal};
use crate::http::extract::{ApiPath, Reader};
use crate::http::reply::ok;
use crate::state::{AppState, Shared};

use super::repo::Shop;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(status))
}

/// Whether a shop is open now.
#[derive(Serialize, ToSchema)]
pub(super) struct ShopView {
    shop_id: u64,
    open: bool,
    updated_at: DateTime<Utc>,
}

/// `GET /api/shops/{id}/status`: `{"shop_id","open","updated_at"}` from the nearest layer.
#[utoipa::path(
    get,
    path = "/api/shops/{shop_id}/status",
    tag = "catalogue",
    operation_id = "shop_status",
    summary = "Whether a shop is open now (no token needed)",
    params(("shop_id" = u64, Path)),
    responses(
        (status = 200, description = "`ok`", body = ShopView),
        (status = 404, description = "`shop_not_found`", body = Refusal),
        (status = 429, description = "`rate_limited`: the IP's read rate", body = Refusal),
    )
)]
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
pub(super) fn view(shop: &Shop) -> ShopView {
    ShopView {
        shop_id: shop.id,
        open: shop.open_at(crate::clock::now()),
        updated_at: shop.updated_at,
    }
}
