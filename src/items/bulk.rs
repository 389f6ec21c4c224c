//! Operators' bulk calls for a big sale day: `PUT /admin/items` (up to 10,000 items per
//! call, written 500 per transaction), and what it shares with the bulk warm-up
//! (`crate::warmup::admin`): each answers what happened to every item, so a script knows
//! exactly which ones to look at; one refused item never fails the others.

use axum::extract::State;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::ItemId;
use crate::http::error::{ApiError, Refusal};
use crate::http::extract::{Admin, ApiJson};
use crate::http::reply::ok;
use crate::state::AppState;

use super::body::ItemBody;
use super::repo::{ItemDraft, Upserted};
use super::write::ItemWriter;

/// The bulk calls' bodies: 10,000 items of a few hundred bytes.
pub const BODY_LIMIT: usize = 8 * 1024 * 1024;

/// Most items one bulk call takes.
pub const MOST_PER_CALL: usize = 10_000;

/// Many items at once, each with its `id`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ItemsBody {
    #[schema(min_items = 1, max_items = 10_000)]
    items: Vec<ItemBody>,
}

/// One item's outcome in a bulk answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Outcome {
    pub item_id: ItemId,
    /// As the call for one item would answer (`created`, `updated`, `loaded`, `already_loaded`, …).
    pub code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// What a bulk write did.
#[derive(Serialize, ToSchema)]
struct Written {
    created: usize,
    updated: usize,
    items: Vec<Outcome>,
}

/// `PUT /admin/items` `{"items":[{"id":…, …as PUT /admin/items/{id}…}, …]}`: every item
/// checked first (a bad one refuses the call, naming it), then written.
#[utoipa::path(
    put,
    path = "/admin/items",
    tag = "items",
    summary = "Create or update up to 10,000 items in one call",
    security(("admin" = [])),
    request_body = ItemsBody,
    responses(
        (status = 200, description = "`ok`: each item's outcome, in the order sent", body = Written),
        (status = 409, description = "`release_started` / `mode_fixed` / `price_fixed` / `draw_fixed` / `stock_committed` / `warmup_running`: a loaded item's tranche already on sale may not change, a loaded item keeps its mode and its price, a draw under way or made keeps its mode and `draw_at`, a wave may not hold back more units than are unsold, or a warm-up or another write of an item is running (the detail names the item); nothing is written", body = Refusal),
    )
)]
pub(super) async fn put_items(
    _: Admin,
    State(state): State<AppState>,
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
    let writer = ItemWriter {
        deps: &state.deps,
        catalog: &state.catalog,
    };
    let done = writer.put_many_honoured(&drafts).await?;

    let (created, updated) = (
        count(&done, Upserted::Created),
        count(&done, Upserted::Updated),
    );
    let outcomes: Vec<Outcome> = done.iter().map(written).collect();
    Ok(ok(
        "ok",
        Written {
            created,
            updated,
            items: outcomes,
        },
    ))
}

/// The first id met a second time.
pub fn first_repeated(ids: impl Iterator<Item = ItemId>) -> Option<ItemId> {
    let mut seen = std::collections::HashSet::new();
    ids.into_iter().find(|id| !seen.insert(*id))
}

fn count(done: &[(ItemId, Upserted)], what: Upserted) -> usize {
    done.iter().filter(|(_, outcome)| *outcome == what).count()
}

/// One written item's outcome as the bulk answer names it.
fn written((item_id, outcome): &(ItemId, Upserted)) -> Outcome {
    let (code, detail) = match outcome {
        Upserted::Created => ("created", None),
        Upserted::Updated => ("updated", None),
        Upserted::BucketsFixed { buckets } => (
            "buckets_fixed",
            Some(format!(
                "units, buyers or orders in its {buckets} bucket(s), or a warm-up running: send \"buckets\": {buckets}"
            )),
        ),
    };
    Outcome {
        item_id: *item_id,
        code,
        detail,
    }
}
