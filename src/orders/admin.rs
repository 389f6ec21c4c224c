//! What the orders say about an item's sale, for operators:
//! `GET /admin/items/{id}/stats` (stock against orders) and `POST /admin/items/{id}/reconcile`.

use axum::extract::State;
use axum::response::Response;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::deps::Deps;
use crate::domain::ItemId;
use crate::http::budget;
use crate::http::error::{ApiError, Conflict, Refusal};
use crate::http::extract::{Admin, ApiPath};
use crate::http::reply::ok;
use crate::items;
use crate::state::AppState;

use super::reconcile::{ReconcileError, Report, reconcile};
use super::stats::{self, Stats};

/// How a reconciliation that did not run is answered.
impl From<ReconcileError> for ApiError {
    fn from(e: ReconcileError) -> Self {
        match e {
            ReconcileError::Busy => ApiError::Conflict {
                code: Conflict::Reconciling,
                detail: e.to_string(),
            },
            ReconcileError::Store(e) => e.into(),
        }
    }
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(item_stats))
        .routes(budget::bulk(routes!(reconcile_item)))
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
    let stats = stats::of(&state.deps, id)
        .await?
        .ok_or(ApiError::ItemNotFound)?;
    Ok(ok("ok", stats))
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
        (status = 409, description = "`reconciling`: a reconciliation of this item is already running", body = Refusal),
    )
)]
async fn reconcile_item(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    let Deps {
        db,
        redis,
        keys,
        meters,
        ..
    } = &state.deps;
    if items::repo::get(db, id).await?.is_none() {
        return Err(ApiError::ItemNotFound);
    }
    let report = reconcile(db, redis, keys, meters, id).await?;
    Ok(ok("reconciled", report))
}
