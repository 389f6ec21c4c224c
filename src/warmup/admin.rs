//! The operators' warm-ups: `POST /admin/items/{id}/warmup[?force=true]`, and
//! `POST /admin/items/warmup` for many items (fresh ones through [`super::fresh`]).

use std::collections::HashMap;

use axum::extract::{DefaultBodyLimit, State};
use axum::response::Response;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::delay_queue::Plan;
use crate::domain::ItemId;
use crate::http::budget;
use crate::http::error::{ApiError, Conflict, Refusal};
use crate::http::extract::{Admin, ApiJson, ApiPath, ApiQuery};
use crate::http::reply::ok;
use crate::items::bulk::{self, MOST_PER_CALL, Outcome, first_repeated};
use crate::state::AppState;

use super::{Warmup, WarmupError, WarmupReport, fresh};

/// Warm-ups a bulk call runs at once: each holds a pooled Redis connection and briefly
/// takes a second one, and the pool (16) also serves the relay, the consumer and stats.
const WARMUPS_AT_ONCE: usize = 4;

/// How a warm-up that did not load is answered.
impl From<WarmupError> for ApiError {
    fn from(e: WarmupError) -> Self {
        let conflict = |code| ApiError::Conflict {
            code,
            detail: e.to_string(),
        };
        match e {
            WarmupError::NotFound => ApiError::ItemNotFound,
            WarmupError::Busy => conflict(Conflict::WarmupRunning),
            WarmupError::AlreadyLoaded { .. } => conflict(Conflict::AlreadyLoaded),
            WarmupError::LiveSale => conflict(Conflict::SaleLive),
            WarmupError::InFlight(_) => conflict(Conflict::OrdersInFlight),
            WarmupError::OverHeld { .. } => conflict(Conflict::OverHeld),
            WarmupError::Raced => conflict(Conflict::Raced),
            WarmupError::Verify { .. } => ApiError::Internal(e.into()),
            WarmupError::Redis(e) => ApiError::Redis(e),
            WarmupError::Database(e) => ApiError::Database(e),
        }
    }
}

/// A warm-up working with this instance's stores.
fn warmup<'a>(state: &'a AppState, plan: &'a Plan) -> Warmup<'a> {
    Warmup {
        db: &state.deps.db,
        redis: &state.deps.redis,
        broker: &state.deps.broker,
        keys: &state.deps.keys,
        plan,
    }
}

pub fn router() -> OpenApiRouter<AppState> {
    let (schemas, paths, bulk_warmup) = budget::bulk(routes!(warmup_items));
    OpenApiRouter::new()
        .routes((
            schemas,
            paths,
            bulk_warmup.layer(DefaultBodyLimit::max(bulk::BODY_LIMIT)),
        ))
        .routes(budget::bulk(routes!(warmup_item)))
}

/// `POST /admin/items/{id}/warmup[?force=true]`
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WarmupQuery {
    /// Load again although loaded (keeps every unit orders hold).
    #[serde(default)]
    force: bool,
}

/// Load an item's units into Redis, and read them back.
#[utoipa::path(
    post,
    path = "/admin/items/{item_id}/warmup",
    tag = "items",
    security(("admin" = [])),
    params(("item_id" = ItemId, Path), WarmupQuery),
    responses(
        (status = 200, description = "`loaded`: the counts read back", body = WarmupReport),
        (status = 404, description = "`item_not_found`", body = Refusal),
        (status = 409, description = "`already_loaded` / `sale_live` / `warmup_running` / `orders_in_flight` / `over_held` / `raced`: loaded already (send `force=true`), the sale is live (pause it first), another warm-up runs, orders are on their way, more units held by orders and waves still to come than the total (the detail names the least), or the item changed meanwhile", body = Refusal),
    )
)]
async fn warmup_item(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<ItemId>,
    ApiQuery(query): ApiQuery<WarmupQuery>,
) -> Result<Response, ApiError> {
    let plan = Plan::from_settings(&state.deps.settings);
    let report = warmup(&state, &plan).run(id, query.force, &|_| {}).await?;
    // The warm-up announced itself to every instance; this one need not wait for that.
    let _ = state.catalog.refresh_item(id).await;
    Ok(ok("loaded", report))
}

/// Items to load.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WarmupsBody {
    #[schema(min_items = 1, max_items = 10_000)]
    ids: Vec<ItemId>,
    #[serde(default)]
    force: bool,
}

/// What a bulk warm-up did.
#[derive(Serialize, ToSchema)]
struct Loaded {
    loaded: usize,
    items: Vec<Outcome>,
}

/// `POST /admin/items/warmup` `{"ids":[…],"force":false}`: fresh items (never loaded, no
/// orders) go the fast path, 500 at a time (`fresh.rs`); every other item is loaded as
/// `POST /admin/items/{id}/warmup` would, 4 at a time. The answer lists every item's code,
/// in the order asked.
#[utoipa::path(
    post,
    path = "/admin/items/warmup",
    tag = "items",
    summary = "Load up to 10,000 items' units at once",
    security(("admin" = [])),
    request_body = WarmupsBody,
    responses((status = 200, description = "`ok`: each item's outcome, in the order asked", body = Loaded))
)]
async fn warmup_items(
    _: Admin,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<WarmupsBody>,
) -> Result<Response, ApiError> {
    if body.ids.is_empty() || body.ids.len() > MOST_PER_CALL {
        return Err(ApiError::bad_request(format!(
            "`ids`: 1 to {MOST_PER_CALL} item ids"
        )));
    }
    if let Some(id) = first_repeated(body.ids.iter().copied()) {
        return Err(ApiError::bad_request(format!(
            "`ids`: item {id} is listed twice"
        )));
    }
    let plan = Plan::from_settings(&state.deps.settings);
    let warmup = warmup(&state, &plan);
    let mut decided: HashMap<ItemId, Outcome> = HashMap::new();
    let mut one_by_one = Vec::new();
    let mut fresh_loaded = false;
    for chunk in body.ids.chunks(fresh::CHUNK) {
        let loaded = fresh::load(&warmup, chunk).await?;
        for (id, result) in loaded.decided {
            fresh_loaded |= result.is_ok();
            decided.insert(id, outcome(id, result.map(drop)));
        }
        one_by_one.extend(loaded.not_fresh);
    }
    let outcomes: Vec<Outcome> = futures::stream::iter(one_by_one)
        .map(|id| {
            let warmup = &warmup;
            async move { outcome(id, warmup.run(id, body.force, &|_| {}).await.map(drop)) }
        })
        .buffer_unordered(WARMUPS_AT_ONCE)
        .collect()
        .await;
    decided.extend(outcomes.into_iter().map(|o| (o.item_id, o)));
    if fresh_loaded {
        // The fast path announces nothing per item: every instance reads everything again.
        state.catalog.announce_all().await;
    } else {
        let _ = state.catalog.refresh().await;
    }
    let outcomes: Vec<Outcome> = body
        .ids
        .iter()
        .filter_map(|id| decided.remove(id))
        .collect();
    let loaded = outcomes.iter().filter(|o| o.code == "loaded").count();
    Ok(ok(
        "ok",
        Loaded {
            loaded,
            items: outcomes,
        },
    ))
}

/// One warm-up's outcome as the bulk answer names it.
fn outcome(item_id: ItemId, result: Result<(), WarmupError>) -> Outcome {
    match result {
        Ok(()) => Outcome {
            item_id,
            code: "loaded",
            detail: None,
        },
        Err(e) => {
            let refused = ApiError::from(e);
            Outcome {
                item_id,
                code: refused.code(),
                detail: Some(refused.detail()),
            }
        }
    }
}
