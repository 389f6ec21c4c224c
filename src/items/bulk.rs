//! Operators' bulk calls for a big sale day: `PUT /admin/items` (up to 10,000 items per
//! call, written 500 per transaction) and `POST /admin/items/warmup` (up to 10,000 ids;
//! fresh items 500 at a time, the others 4 warm-ups at a time). Each answers what happened to every item, so a script knows
//! exactly which ones to look at; one refused item never fails the others.

use std::collections::HashMap;

use axum::extract::State;
use axum::response::Response;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::app::AppState;
use crate::delay_queue::Plan;
use crate::domain::{ItemId, Stock};
use crate::error::ApiError;
use crate::http::extract::{Admin, ApiJson};
use crate::http::reply::ok;
use crate::store::Grouped;

use super::admin::{ItemBody, warmup_refused, warmup_with};
use super::fresh;
use super::repo::{self, ItemDraft, Upserted};
use super::stock;
use super::warmup::WarmupError;

/// Most items one bulk call takes.
const MOST_PER_CALL: usize = 10_000;
/// Warm-ups a bulk call runs at once: each holds a pooled Redis connection and briefly
/// takes a second one, and the pool (16) also serves the relay, the consumer and stats.
const WARMUPS_AT_ONCE: usize = 4;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ItemsBody {
    items: Vec<ItemBody>,
}

/// One item's outcome in a bulk answer.
#[derive(Debug, Serialize)]
struct Outcome {
    item_id: ItemId,
    code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
}

/// `PUT /admin/items` `{"items":[{"id":…, …as PUT /admin/items/{id}…}, …]}`: every item
/// checked first (a bad one refuses the call, naming it), then written.
pub async fn put_items(
    _: Admin,
    State(AppState {
        db,
        redis,
        keys,
        catalog,
        ..
    }): State<AppState>,
    ApiJson(body): ApiJson<ItemsBody>,
) -> Result<Response, ApiError> {
    if body.items.is_empty() || body.items.len() > MOST_PER_CALL {
        return Err(ApiError::bad_request(format!(
            "`items`: 1 to {MOST_PER_CALL} items"
        )));
    }
    let mut drafts: Vec<(ItemId, ItemDraft)> = Vec::with_capacity(body.items.len());
    for (n, item) in body.items.into_iter().enumerate() {
        let id = item
            .id()
            .ok_or_else(|| ApiError::bad_request(format!("items[{n}]: `id` is missing")))?;
        let draft = item.validate().map_err(|e| match e {
            ApiError::BadRequest(detail) => ApiError::bad_request(format!("items[{n}]: {detail}")),
            other => other,
        })?;
        drafts.push((id, draft));
    }
    if let Some(id) = first_repeated(drafts.iter().map(|(id, _)| *id)) {
        return Err(ApiError::bad_request(format!(
            "`items`: item {id} is listed twice"
        )));
    }
    let done = repo::upsert_many(&db, &drafts).await?;

    // The sale window grab.lua checks, into Redis for the items that existed (a PUT does
    // not change the pause; new items have nothing in Redis yet).
    let updated: std::collections::HashSet<ItemId> = done
        .iter()
        .filter(|(_, outcome)| *outcome == Upserted::Updated)
        .map(|(id, _)| *id)
        .collect();
    let mut grouped = Grouped::new(&redis);
    for (id, draft) in drafts.iter().filter(|(id, _)| updated.contains(id)) {
        for bucket in Stock::all(*id, draft.buckets) {
            stock::sync_window_in(grouped.group(), &keys.stock(bucket), draft);
        }
    }
    grouped.run(&redis).await?;
    catalog.announce_all().await;

    let (mut created, mut updated) = (0, 0);
    let outcomes: Vec<Outcome> = done
        .iter()
        .map(|(item_id, outcome)| match outcome {
            Upserted::Created => {
                created += 1;
                Outcome {
                    item_id: *item_id,
                    code: "created",
                    detail: None,
                }
            }
            Upserted::Updated => {
                updated += 1;
                Outcome {
                    item_id: *item_id,
                    code: "updated",
                    detail: None,
                }
            }
            Upserted::BucketsFixed { buckets } => Outcome {
                item_id: *item_id,
                code: "buckets_fixed",
                detail: Some(format!(
                    "loaded with {buckets} bucket(s): send \"buckets\": {buckets}"
                )),
            },
        })
        .collect();
    Ok(ok(
        "ok",
        json!({ "created": created, "updated": updated, "items": outcomes }),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmupsBody {
    ids: Vec<ItemId>,
    #[serde(default)]
    force: bool,
}

/// `POST /admin/items/warmup` `{"ids":[…],"force":false}`: fresh items (never loaded, no
/// orders) go the fast path, 500 at a time (`fresh.rs`); every other item is loaded as
/// `POST /admin/items/{id}/warmup` would, 4 at a time. The answer lists every item's code,
/// in the order asked.
pub async fn warmup_items(
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
    let plan = Plan::from_settings(&state.settings);
    let warmup = warmup_with(&state, &plan);
    let mut decided: HashMap<ItemId, Outcome> = HashMap::new();
    let mut one_by_one = Vec::new();
    let mut fresh_loaded = false;
    for chunk in body.ids.chunks(fresh::CHUNK) {
        let loaded = fresh::load(&warmup, chunk).await.map_err(warmup_refused)?;
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
    Ok(ok("ok", json!({ "loaded": loaded, "items": outcomes })))
}

/// The first id met a second time.
fn first_repeated(ids: impl Iterator<Item = ItemId>) -> Option<ItemId> {
    let mut seen = std::collections::HashSet::new();
    ids.into_iter().find(|id| !seen.insert(*id))
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
            let refused = warmup_refused(e);
            Outcome {
                item_id,
                code: refused.code(),
                detail: Some(refused.detail()),
            }
        }
    }
}
