//! Operators' waiting-room endpoints: its figures, and holding or letting go admission.

use axum::extract::State;
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::ItemId;
use crate::http::error::{ApiError, Refusal};
use crate::http::extract::{Admin, ApiPath};
use crate::http::reply::ok;
use crate::state::AppState;

use super::line;
use crate::items::queue_plan::QueuePlan;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(queue_figures))
        .routes(routes!(pause_queue))
        .routes(routes!(resume_queue))
}

/// A waiting room as operators see it.
#[derive(Serialize, ToSchema)]
struct QueueReport {
    item_id: ItemId,
    queue: QueuePlan,
    /// Buyers who took a place.
    joined: u64,
    /// In line, not yet let in.
    waiting: u64,
    /// Let in so far.
    admitted: u64,
    /// Passes live now.
    passes_outstanding: u64,
    /// Units the live passes may still buy (never more than the units unsold).
    reserved_units: u64,
    /// Units bought with a pass.
    bought: u64,
    /// Passes that ran out unused.
    expired: u64,
    /// Units bought per buyer let in (`null` before anyone was let in).
    conversion: Option<f64>,
    /// Admissions per second over the last measured window.
    admission_rate_per_s: f64,
    /// Admission held by an operator.
    paused: bool,
    /// No unit can come back: those still waiting were told `sold_out`.
    sold_out: bool,
}

#[utoipa::path(
    get,
    path = "/admin/items/{item_id}/queue",
    tag = "waiting room",
    summary = "An item's waiting room: waiting, admitted, passes, conversion, rate",
    security(("admin" = [])),
    params(("item_id" = ItemId, Path)),
    responses(
        (status = 200, description = "`ok`", body = QueueReport),
        (status = 404, description = "`item_not_found` / `queue_not_found`", body = Refusal),
    )
)]
/// `GET /admin/items/{item_id}/queue`
async fn queue_figures(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    let plan = plan_of(&state, id).await?;
    let mut conn = state.deps.redis.bulk().await?;
    let figures = line::figures(&mut conn, &state.deps.keys.queue(id)).await?;
    #[allow(clippy::cast_precision_loss)]
    let ratio = |a: u64, b: u64| a as f64 / b as f64;
    Ok(ok(
        "ok",
        QueueReport {
            item_id: id,
            queue: plan,
            joined: figures.joined,
            waiting: figures.joined.saturating_sub(figures.admitted),
            admitted: figures.admitted,
            passes_outstanding: figures.passes_outstanding,
            reserved_units: figures.reserved,
            bought: figures.bought,
            expired: figures.expired,
            conversion: (figures.admitted > 0).then(|| ratio(figures.bought, figures.admitted)),
            admission_rate_per_s: ratio(figures.rate_milli, 1000),
            paused: figures.paused,
            sold_out: figures.sold_out,
        },
    ))
}

/// The item's queue settings, or why there are none.
async fn plan_of(state: &AppState, id: ItemId) -> Result<QueuePlan, ApiError> {
    let item = crate::items::repo::get(&state.deps.db, id)
        .await?
        .ok_or(ApiError::ItemNotFound)?;
    item.queue.0.ok_or(ApiError::QueueNotFound)
}

/// An item's admission held or let go.
#[derive(Serialize, ToSchema)]
struct QueueSwitched {
    item_id: ItemId,
}

#[utoipa::path(
    post,
    path = "/admin/items/{item_id}/queue/pause",
    tag = "waiting room",
    summary = "Hold admission: nobody more is let in; places and live passes are kept",
    security(("admin" = [])),
    params(("item_id" = ItemId, Path)),
    responses(
        (status = 200, description = "`paused`", body = QueueSwitched),
        (status = 404, description = "`item_not_found` / `queue_not_found`", body = Refusal),
    )
)]
/// `POST /admin/items/{item_id}/queue/pause`
async fn pause_queue(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    switch(&state, id, true).await
}

#[utoipa::path(
    post,
    path = "/admin/items/{item_id}/queue/resume",
    tag = "waiting room",
    summary = "Let admission go on",
    security(("admin" = [])),
    params(("item_id" = ItemId, Path)),
    responses(
        (status = 200, description = "`resumed`", body = QueueSwitched),
        (status = 404, description = "`item_not_found` / `queue_not_found`", body = Refusal),
    )
)]
/// `POST /admin/items/{item_id}/queue/resume`
async fn resume_queue(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    switch(&state, id, false).await
}

async fn switch(state: &AppState, id: ItemId, paused: bool) -> Result<Response, ApiError> {
    plan_of(state, id).await?;
    let mut conn = state.deps.redis.bulk().await?;
    line::set_paused(&mut conn, &state.deps.keys.queue(id), paused).await?;
    let code = if paused { "paused" } else { "resumed" };
    Ok(ok(code, QueueSwitched { item_id: id }))
}
