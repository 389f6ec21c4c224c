//! What the orders say about an item's sale, for operators:
//! `GET /admin/items/{id}/stats` (stock against orders) and `POST /admin/items/{id}/reconcile`.

use axum::Router;
use axum::extract::State;
use axum::response::Response;
use axum::routing::{get, post};
use serde_json::json;

use crate::domain::ItemId;
use crate::error::ApiError;
use crate::http::extract::{Admin, ApiPath};
use crate::http::reply::ok;
use crate::items::{self, stock};
use crate::state::{AppState, Shared};

use super::reconcile::reconcile;
use super::repo;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/admin/items/{item_id}/stats", get(item_stats))
        .route("/admin/items/{item_id}/reconcile", post(reconcile_item))
}

/// `GET /admin/items/{id}/stats`
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
        json!({
            "item_id": id,
            "total": item.total,
            "loaded": stock.loaded,
            "sold": stock.sold,
            "remaining": stock.remaining,
            "pending": stock.pending,
            "orders": counts,
            "consistent": accounted == u64::from(item.total),
        }),
    ))
}

/// `POST /admin/items/{id}/reconcile`: what the end-of-sale reconciliation does, now.
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
