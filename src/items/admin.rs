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
use crate::keys::Keys;
use crate::state::{AppState, Shared};
use crate::store::{Db, RedisConns};

use super::body::ItemBody;
use super::bulk;
use super::catalog::Catalog;
use super::regroup::Regrouping;
use super::repo::{self, Item, Upserted};
use super::stock;

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
        (status = 409, description = "`buckets_fixed` / `release_started`: an item with units, buyers or orders keeps its buckets; a loaded item's tranche already on sale may not change", body = Refusal),
    )
)]
async fn put_item(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<ItemId>,
    ApiJson(body): ApiJson<ItemBody>,
) -> Result<Response, ApiError> {
    let Shared {
        db,
        redis,
        keys,
        catalog,
        ..
    } = &*state;
    if body.id().is_some_and(|body_id| body_id != id) {
        return Err(ApiError::bad_request("`id` differs from the path's"));
    }
    let draft = body.validate()?;
    if let Some(live) = repo::get(db, id).await? {
        super::body::fixed_waves(&live, &draft.release)?;
    }
    let regrouping = Regrouping::hold(db, redis, keys, &[(id, draft.clone())]).await?;
    let upserted = repo::upsert(db, id, &draft, &regrouping.kept).await;
    regrouping.let_go(redis).await;
    let (status, code) = match upserted? {
        Upserted::Created => (StatusCode::CREATED, "created"),
        Upserted::Updated => (StatusCode::OK, "updated"),
        Upserted::BucketsFixed { buckets } => {
            return Err(ApiError::Conflict {
                code: Conflict::BucketsFixed,
                detail: format!(
                    "the item has units, buyers or orders in its {buckets} bucket(s), or a warm-up of it is running: send \"buckets\": {buckets}, or use a new item id"
                ),
            });
        }
    };
    let item = spread_rules(db, redis, keys, catalog, id).await?;
    Ok(envelope(status, code, WrittenItem { item }))
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
    let Shared {
        db,
        redis,
        keys,
        catalog,
        ..
    } = &*state;
    if !repo::set_paused(db, id, paused).await? {
        return Err(ApiError::ItemNotFound);
    }
    spread_rules(db, redis, keys, catalog, id).await?;
    let code = if paused { "paused" } else { "resumed" };
    Ok(ok(code, Switched { item_id: id }))
}

/// After the MySQL record changed: copies what `grab.lua` checks (window, pause) to Redis
/// and has every instance's catalogue reload the item. Returns the item as recorded.
async fn spread_rules(
    db: &Db,
    redis: &RedisConns,
    keys: &Keys,
    catalog: &Catalog,
    id: ItemId,
) -> Result<Item, ApiError> {
    let item = repo::get(db, id).await?.ok_or(ApiError::ItemNotFound)?;
    let mut conn = redis.bulk().await?;
    for bucket in item.stocks() {
        stock::sync_rules(&mut conn, &keys.stock(bucket), &item).await?;
    }
    let mut pipe = redis::pipe();
    crate::draw::schedule::note_in(&mut pipe, keys, id, item.draw_at);
    crate::store::redis_timed(pipe.query_async::<()>(&mut conn)).await?;
    refresh_everywhere(catalog, id).await;
    Ok(item)
}

/// This instance at once, the others through the item-events channel.
async fn refresh_everywhere(catalog: &Catalog, id: ItemId) {
    catalog.forget_unknown();
    if let Err(e) = catalog.announce(id).await {
        tracing::warn!(error = %e, "could not announce an item change; other instances catch up within a second");
    }
    if let Err(e) = catalog.refresh_item(id).await {
        tracing::warn!(error = %crate::error::cause_chain(&e), "item catalogue refresh failed");
    }
}
