//! Operators' item endpoints: create/update (one or many), pause and resume.

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::ItemId;
use crate::http::budget;
use crate::http::error::{ApiError, Conflict, Refusal};
use crate::http::extract::{Admin, ApiJson, ApiPath};
use crate::http::reply::{envelope, ok};
use crate::state::AppState;

use super::body::ItemBody;
use super::bulk;
use super::repo::Item;
use super::write::{ItemWriter, Put, WriteError};

/// The item writes, over this instance's stores.
fn writer(state: &AppState) -> ItemWriter<'_> {
    ItemWriter {
        deps: &state.deps,
        catalog: &state.catalog,
    }
}

/// How an item write that did nothing is answered (here and in `bulk.rs`).
impl From<WriteError> for ApiError {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::NotFound => ApiError::ItemNotFound,
            WriteError::ReleaseStarted { at, index } => ApiError::Conflict {
                code: Conflict::ReleaseStarted,
                detail: format!(
                    "{}the tranche of {} is on sale already: it may not be changed, removed or added; only tranches still to come may",
                    in_bulk(index),
                    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ),
            },
            WriteError::DrawFixed { field, index } => ApiError::Conflict {
                code: Conflict::DrawFixed,
                detail: format!(
                    "{}`{field}`: the draw is under way or made (its time came, or units were given): its mode, `draw_at`, seed and entries are final",
                    in_bulk(index)
                ),
            },
            WriteError::QueueFixed { field, index } => ApiError::Conflict {
                code: Conflict::QueueFixed,
                detail: format!(
                    "{}`{field}`: buyers hold places in the item's waiting room; removing it or moving `start_at` would reorder them",
                    in_bulk(index)
                ),
            },
            WriteError::ModeFixed { index } => ApiError::Conflict {
                code: Conflict::ModeFixed,
                detail: format!(
                    "{}`mode`: the item was loaded, or has buyers, entries or orders: it keeps its mode; use a new item id",
                    in_bulk(index)
                ),
            },
            WriteError::PriceFixed { price_cents, index } => ApiError::Conflict {
                code: Conflict::PriceFixed,
                detail: format!(
                    "{}`price_cents`: the item was loaded, or has buyers, entries or orders: it keeps its price ({price_cents}), which the payment of every order is judged against; use a new item id",
                    in_bulk(index)
                ),
            },
            WriteError::StockCommitted {
                held,
                listed,
                bucket,
                index,
            } => ApiError::Conflict {
                code: Conflict::StockCommitted,
                detail: format!(
                    "{}`release`: {}; units sold cannot be held back (more go on sale with a larger `total` and a forced warm-up)",
                    in_bulk(index),
                    match bucket {
                        None => format!("{held} units held back, but only {listed} are unsold"),
                        Some(bucket) => format!(
                            "bucket {bucket} would hold back {held} units, but only {listed} of its units are unsold (each bucket of a split item holds back its share of a wave)"
                        ),
                    }
                ),
            },
            WriteError::Busy { id, index } => ApiError::Conflict {
                code: Conflict::WarmupRunning,
                detail: format!(
                    "{}a warm-up or another write of item {id} is running; try again when it is done",
                    in_bulk(index)
                ),
            },
            WriteError::Store(e) => e.into(),
        }
    }
}

/// `items[N]: ` for the item at `index` of a bulk call.
fn in_bulk(index: Option<usize>) -> String {
    index.map(|n| format!("items[{n}]: ")).unwrap_or_default()
}

/// The operators' item calls: write one or many, pause, resume. (Warm-ups: `crate::warmup`;
/// stats and reconciliation: `crate::orders::admin`.)
pub fn router() -> OpenApiRouter<AppState> {
    let (schemas, paths, bulk_put) = budget::bulk(routes!(bulk::put_items));
    OpenApiRouter::new()
        .routes((
            schemas,
            paths,
            bulk_put.layer(DefaultBodyLimit::max(bulk::BODY_LIMIT)),
        ))
        .routes(routes!(put_item))
        .routes(routes!(pause_item))
        .routes(routes!(resume_item))
}

/// An item as written.
#[derive(Serialize, ToSchema)]
struct WrittenItem {
    item: Item,
}

/// An item paused or resumed.
#[derive(Serialize, ToSchema)]
struct Switched {
    item_id: ItemId,
}

/// `PUT /admin/items/{id}`: MySQL is the record; the sale window is copied to Redis for
/// `grab.lua`. A changed `total` takes effect with `warmup?force=true`.
#[utoipa::path(
    put,
    path = "/admin/items/{item_id}",
    tag = "items",
    summary = "Create or update an item",
    security(("admin" = [])),
    params(("item_id" = ItemId, Path)),
    request_body = ItemBody,
    responses(
        (status = 200, description = "`updated`", body = WrittenItem),
        (status = 201, description = "`created`", body = WrittenItem),
        (status = 409, description = "`buckets_fixed` / `release_started` / `mode_fixed` / `price_fixed` / `draw_fixed` / `queue_fixed` / `stock_committed` / `warmup_running`: an item with units, buyers or orders keeps its buckets; a loaded item's tranche already on sale may not change; a loaded item keeps its mode and its price; a draw under way or made keeps its mode and `draw_at`; a queue with buyers in it stays, and so does `start_at`; a wave may not hold back more units than are unsold (the detail names the limit); a warm-up or another write of the item is running", body = Refusal),
    )
)]
async fn put_item(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<ItemId>,
    ApiJson(body): ApiJson<ItemBody>,
) -> Result<Response, ApiError> {
    if body.id().is_some_and(|body_id| body_id != id) {
        return Err(ApiError::bad_request("`id` differs from the path's"));
    }
    let draft = body.validate()?;
    match writer(&state).put_honoured(id, draft).await? {
        Put::Created(item) => Ok(envelope(
            StatusCode::CREATED,
            "created",
            WrittenItem { item },
        )),
        Put::Updated(item) => Ok(envelope(StatusCode::OK, "updated", WrittenItem { item })),
        Put::BucketsFixed { buckets } => Err(ApiError::Conflict {
            code: Conflict::BucketsFixed,
            detail: format!(
                "the item has units, buyers or orders in its {buckets} bucket(s), or a warm-up of it is running: send \"buckets\": {buckets}, or use a new item id"
            ),
        }),
    }
}

/// `POST /admin/items/{id}/pause`
#[utoipa::path(
    post,
    path = "/admin/items/{item_id}/pause",
    tag = "items",
    summary = "Stop selling an item",
    security(("admin" = [])),
    params(("item_id" = ItemId, Path)),
    responses(
        (status = 200, description = "`paused`", body = Switched),
        (status = 404, description = "`item_not_found`", body = Refusal),
    )
)]
async fn pause_item(
    admin: Admin,
    state: State<AppState>,
    id: ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    set_paused(admin, state, id, true).await
}

/// `POST /admin/items/{id}/resume`
#[utoipa::path(
    post,
    path = "/admin/items/{item_id}/resume",
    tag = "items",
    summary = "Sell a paused item again",
    security(("admin" = [])),
    params(("item_id" = ItemId, Path)),
    responses(
        (status = 200, description = "`resumed`", body = Switched),
        (status = 404, description = "`item_not_found`", body = Refusal),
    )
)]
async fn resume_item(
    admin: Admin,
    state: State<AppState>,
    id: ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    set_paused(admin, state, id, false).await
}

async fn set_paused(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<ItemId>,
    paused: bool,
) -> Result<Response, ApiError> {
    writer(&state).set_paused(id, paused).await?;
    let code = if paused { "paused" } else { "resumed" };
    Ok(ok(code, Switched { item_id: id }))
}
