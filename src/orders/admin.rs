//! What the orders say about an item's sale, for operators:
//! `GET /admin/items/{id}/stats` (stock against orders) and `POST /admin/items/{id}/reconcile`.

use axum::extract::State;
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::ItemId;
use crate::error::{ApiError, Refusal};
use crate::http::extract::{Admin, ApiPath};
use crate::http::reply::ok;
use crate::items::{self, stock};
use crate::state::{AppState, Shared};

use super::reconcile::{Report, reconcile};
use super::repo::{self, StatusCounts};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(item_stats))
        .routes(routes!(reconcile_item))
}

/// An item's stock against its orders, right now.
#[derive(Serialize, ToSchema)]
struct Stats {
    item_id: ItemId,
    total: u32,
    /// Whether the units are in Redis.
    loaded: bool,
    /// Units won, from Redis.
    sold: u64,
    /// Units on sale, from Redis.
    remaining: u64,
    /// Units won whose order is not yet in MySQL.
    pending: u64,
    /// Orders in MySQL by status.
    orders: StatusCounts,
    /// remaining + pending + unpaid + paid = total, right now.
    consistent: bool,
}

/// `GET /admin/items/{id}/stats`
#[utoipa::path(
    get,
    path = "/admin/items/{item_id}/stats",
    tag = "items",
    summary = "An item's stock against its orders",
    security(("admin" = [])),
    params(("item_id" = ItemId, Path)),
    responses(
        (status = 200, description = "`ok`", body = Stats),
        (status = 404, description = "`item_not_found`", body = Refusal),
    )
)]
async fn item_stats(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    let Shared {
        db, redis, keys, ..
    } = &*state;
    let item = items::repo::get(db, id)
        .await?
        .ok_or(ApiError::ItemNotFound)?;
    let mut conn = redis.bulk().await?;
    let stock = stock::item_snapshot(&mut conn, keys, item.stocks()).await?;
    let counts = repo::count_by_status(db, id).await?;
    let accounted = stock.remaining + stock.pending + counts.unpaid + counts.paid;
    Ok(ok(
        "ok",
        Stats {
            item_id: id,
            total: item.total,
            loaded: stock.loaded,
            sold: stock.sold,
            remaining: stock.remaining,
            pending: stock.pending,
            orders: counts,
            consistent: accounted == u64::from(item.total),
        },
    ))
}

/// `POST /admin/items/{id}/reconcile`: what the end-of-sale reconciliation does, now.
#[utoipa::path(
    post,
    path = "/admin/items/{item_id}/reconcile",
    tag = "items",
    summary = "Return the units of orders that can no longer be paid",
    security(("admin" = [])),
    params(("item_id" = ItemId, Path)),
    responses(
        (status = 200, description = "`reconciled`", body = Report),
        (status = 404, description = "`item_not_found`", body = Refusal),
    )
)]
async fn reconcile_item(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    let Shared {
        db,
        redis,
        keys,
        meters,
        ..
    } = &*state;
    if items::repo::get(db, id).await?.is_none() {
        return Err(ApiError::ItemNotFound);
    }
    let report = reconcile(db, redis, keys, meters, id).await?;
    Ok(ok("reconciled", report))
}
