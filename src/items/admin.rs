//! Operators' item endpoints: create/update, warm-up, pause/resume, stats, reconcile.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;

use crate::app::AppState;
use crate::delay_queue::Plan;
use crate::domain::{ItemId, Stock};
use crate::error::ApiError;
use crate::http::extract::{Admin, ApiJson, ApiPath, ApiQuery};
use crate::http::reply::{envelope, ok};
use crate::keys::Keys;
use crate::orders::reconcile::{ReconcileError, reconcile};
use crate::orders::repo as orders;
use crate::store::{Db, RedisConns};

use super::catalog::Catalog;
use super::repo::{self, Item, ItemDraft, Upserted};
use super::stock;
use super::warmup::{Warmup, WarmupError};

/// The most units one item may have (a million units is about 60 MB of Redis).
const MAX_TOTAL: u32 = 10_000_000;
const MAX_PAY_TIMEOUT_S: u32 = 7 * 24 * 3600;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ItemBody {
    /// Needed in a bulk `PUT /admin/items`; in `PUT /admin/items/{id}` it may repeat the
    /// path's.
    #[serde(default)]
    id: Option<ItemId>,
    name: String,
    shop_id: u64,
    total: u32,
    start_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
    price_cents: u64,
    #[serde(default = "default_pay_timeout")]
    pay_timeout_s: u32,
    /// Redis buckets for a hot item (1–64).
    #[serde(default = "default_buckets")]
    buckets: u8,
}

fn default_buckets() -> u8 {
    1
}

fn default_pay_timeout() -> u32 {
    1800
}

impl ItemBody {
    pub(super) fn id(&self) -> Option<ItemId> {
        self.id
    }

    pub(super) fn validate(self) -> Result<ItemDraft, ApiError> {
        let name = self.name.trim().to_owned();
        if name.is_empty() || name.chars().count() > 200 {
            return Err(ApiError::bad_request("`name`: 1 to 200 characters"));
        }
        if self.shop_id == 0 {
            return Err(ApiError::bad_request("`shop_id`: must be positive"));
        }
        if !(1..=MAX_TOTAL).contains(&self.total) {
            return Err(ApiError::bad_request(format!("`total`: 1 to {MAX_TOTAL}")));
        }
        if self.start_at >= self.end_at {
            return Err(ApiError::bad_request("`end_at` must be after `start_at`"));
        }
        if !(1..=MAX_PAY_TIMEOUT_S).contains(&self.pay_timeout_s) {
            return Err(ApiError::bad_request(format!(
                "`pay_timeout_s`: 1 to {MAX_PAY_TIMEOUT_S}"
            )));
        }
        if !(1..=Stock::MAX_BUCKETS).contains(&self.buckets) {
            return Err(ApiError::bad_request(format!(
                "`buckets`: 1 to {}",
                Stock::MAX_BUCKETS
            )));
        }
        Ok(ItemDraft {
            name,
            shop_id: self.shop_id,
            total: self.total,
            start_at: self.start_at,
            end_at: self.end_at,
            price_cents: self.price_cents,
            pay_timeout_s: self.pay_timeout_s,
            buckets: self.buckets,
        })
    }
}

/// `PUT /admin/items/{id}`: MySQL is the record; the sale window is copied to Redis for
/// `grab.lua`. A changed `total` takes effect with `warmup?force=true`.
pub async fn put_item(
    _: Admin,
    State(AppState {
        db,
        redis,
        keys,
        catalog,
        ..
    }): State<AppState>,
    ApiPath(id): ApiPath<ItemId>,
    ApiJson(body): ApiJson<ItemBody>,
) -> Result<Response, ApiError> {
    if body.id.is_some_and(|body_id| body_id != id) {
        return Err(ApiError::bad_request("`id` differs from the path's"));
    }
    let draft = body.validate()?;
    let (status, code) = match repo::upsert(&db, id, &draft).await? {
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
    let item = spread_rules(&db, &redis, &keys, &catalog, id).await?;
    Ok(envelope(status, code, json!({ "item": item })))
}

/// `POST /admin/items/{id}/warmup[?force=true]`
#[derive(Debug, Deserialize)]
pub struct WarmupQuery {
    #[serde(default)]
    force: bool,
}

pub async fn warmup_item(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<ItemId>,
    ApiQuery(query): ApiQuery<WarmupQuery>,
) -> Result<Response, ApiError> {
    let plan = Plan::from_settings(&state.settings);
    let report = warmup_with(&state, &plan)
        .run(id, query.force, &|_| {})
        .await
        .map_err(warmup_refused)?;
    // The warm-up announced itself to every instance; this one need not wait for that.
    let _ = state.catalog.refresh_item(id).await;
    Ok(ok("loaded", report))
}

/// A warm-up working with this instance's stores.
pub(super) fn warmup_with<'a>(state: &'a AppState, plan: &'a Plan) -> Warmup<'a> {
    Warmup {
        db: &state.db,
        redis: &state.redis,
        broker: &state.broker,
        keys: &state.keys,
        plan,
    }
}

/// How a warm-up that did not load is answered.
pub(super) fn warmup_refused(e: WarmupError) -> ApiError {
    match e {
        WarmupError::NotFound => ApiError::ItemNotFound,
        WarmupError::Busy => conflict("warmup_running", &e),
        WarmupError::AlreadyLoaded { .. } => conflict("already_loaded", &e),
        WarmupError::LiveSale => conflict("sale_live", &e),
        WarmupError::InFlight(_) => conflict("orders_in_flight", &e),
        WarmupError::OverHeld { .. } => conflict("over_held", &e),
        WarmupError::Raced => conflict("raced", &e),
        WarmupError::Verify { .. } => ApiError::Internal(e.into()),
        WarmupError::Redis(e) => ApiError::Redis(e),
        WarmupError::Database(e) => ApiError::Database(e),
    }
}

fn conflict(code: &'static str, e: &WarmupError) -> ApiError {
    ApiError::Conflict {
        code,
        detail: e.to_string(),
    }
}

/// `POST /admin/items/{id}/pause`
pub async fn pause_item(
    admin: Admin,
    state: State<AppState>,
    id: ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    set_paused(admin, state, id, true).await
}

/// `POST /admin/items/{id}/resume`
pub async fn resume_item(
    admin: Admin,
    state: State<AppState>,
    id: ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    set_paused(admin, state, id, false).await
}

async fn set_paused(
    _: Admin,
    State(AppState {
        db,
        redis,
        keys,
        catalog,
        ..
    }): State<AppState>,
    ApiPath(id): ApiPath<ItemId>,
    paused: bool,
) -> Result<Response, ApiError> {
    if !repo::set_paused(&db, id, paused).await? {
        return Err(ApiError::ItemNotFound);
    }
    spread_rules(&db, &redis, &keys, &catalog, id).await?;
    let code = if paused { "paused" } else { "resumed" };
    Ok(ok(code, json!({ "item_id": id })))
}

/// `GET /admin/items/{id}/stats`
pub async fn item_stats(
    _: Admin,
    State(AppState {
        db, redis, keys, ..
    }): State<AppState>,
    ApiPath(id): ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    let item = repo::get(&db, id).await?.ok_or(ApiError::ItemNotFound)?;
    let mut conn = redis.bulk().await?;
    let stock = stock::item_snapshot(&mut conn, &keys, item.stocks()).await?;
    let counts = orders::count_by_status(&db, id).await?;
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
pub async fn reconcile_item(
    _: Admin,
    State(AppState {
        db,
        redis,
        keys,
        meters,
        ..
    }): State<AppState>,
    ApiPath(id): ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    if repo::get(&db, id).await?.is_none() {
        return Err(ApiError::ItemNotFound);
    }
    let report = reconcile(&db, &redis, &keys, &meters, id)
        .await
        .map_err(|e| match e {
            ReconcileError::Busy => ApiError::Conflict {
                code: "reconciling",
                detail: e.to_string(),
            },
            ReconcileError::Store(e) => e.into(),
        })?;
    Ok(ok("reconciled", report))
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
