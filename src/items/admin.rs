//! Operators' item endpoints: create/update (one or many), pause and resume.

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{post, put};
use serde_json::json;

use crate::domain::ItemId;
use crate::error::ApiError;
use crate::http::extract::{Admin, ApiJson, ApiPath};
use crate::http::reply::{envelope, ok};
use crate::keys::Keys;
use crate::state::{AppState, Shared};
use crate::store::{Db, RedisConns};

use super::body::ItemBody;
use super::bulk;
use super::catalog::Catalog;
use super::repo::{self, Item, Upserted};
use super::stock;

/// The operators' item calls: write one or many, pause, resume. (Warm-ups: `crate::warmup`;
/// stats and reconciliation: `crate::orders::admin`.)
pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/admin/items",
            put(bulk::put_items).layer(DefaultBodyLimit::max(bulk::BODY_LIMIT)),
        )
        .route("/admin/items/{item_id}", put(put_item))
        .route("/admin/items/{item_id}/pause", post(pause_item))
        .route("/admin/items/{item_id}/resume", post(resume_item))
}

/// `PUT /admin/items/{id}`: MySQL is the record; the sale window is copied to Redis for
/// `grab.lua`. A changed `total` takes effect with `warmup?force=true`.
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
    let (status, code) = match repo::upsert(db, id, &draft).await? {
        Upserted::Created => (StatusCode::CREATED, "created"),
        Upserted::Updated => (StatusCode::OK, "updated"),
        Upserted::BucketsFixed { buckets } => {
            return Err(ApiError::Conflict {
                code: "buckets_fixed",
                detail: format!(
                    "the item was loaded with {buckets} bucket(s), and its orders live in them: send \"buckets\": {buckets}, or use a new item id"
                ),
            });
        }
    };
    let item = spread_rules(db, redis, keys, catalog, id).await?;
    Ok(envelope(status, code, json!({ "item": item })))
}

/// `POST /admin/items/{id}/pause`
async fn pause_item(
    admin: Admin,
    state: State<AppState>,
    id: ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    set_paused(admin, state, id, true).await
}

/// `POST /admin/items/{id}/resume`
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
    Ok(ok(code, json!({ "item_id": id })))
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
