//! `GET /api/items/{id}`: what a storefront shows (from the catalogue; its stock read again
//! when older than half a second).

use axum::extract::State;
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::ItemId;
use crate::http::error::{ApiError, Refusal};
use crate::http::extract::{ApiPath, Reader};
use crate::http::reply::ok;
use crate::state::{AppState, Shared};

use super::catalog::ItemStatus;
use crate::items::queue_plan::QueuePlan;

/// What a storefront shows of an item.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_item))
}

/// An item as a storefront shows it.
#[derive(Serialize, ToSchema)]
struct ItemView<'a> {
    item_id: ItemId,
    name: &'a str,
    shop_id: u64,
    status: ItemStatus,
    total: u32,
    /// Units on sale now (read again when older than half a second); for an item with
    /// waves, not counting those still to come.
    remaining: u64,
    start_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
    price_cents: u64,
    pay_timeout_s: u32,
    /// Live orders one buyer may hold.
    per_user: u8,
    /// Items with waves: units released so far (on sale from `start_at`, and every wave
    /// whose time has come).
    #[serde(skip_serializing_if = "Option::is_none")]
    released: Option<u64>,
    /// Items with waves: when the next one goes on sale (`null` once none is to come).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<DateTime<Utc>>)]
    next_release_at: Option<Option<DateTime<Utc>>>,
    /// Draws: when entries close and winners are drawn.
    #[serde(skip_serializing_if = "Option::is_none")]
    draw_at: Option<DateTime<Utc>>,
    /// Draws: SHA-256 of the draw's secret seed (hex), shown from the moment the item is
    /// on sale, so the seed revealed after the draw can be checked against it.
    #[serde(skip_serializing_if = "Option::is_none")]
    draw_commitment: Option<String>,
    /// Draws, once drawn: the seed. An entry's rank is the first six bytes of
    /// HMAC-SHA256(seed bytes, user id in decimal); the lowest ranks win.
    #[serde(skip_serializing_if = "Option::is_none")]
    draw_seed: Option<&'a str>,
    /// Draws, once drawn: the highest rank given a unit so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    draw_cutoff: Option<u64>,
    /// Items with a waiting room: its settings. Buyers join at `POST
    /// /api/items/{item_id}/queue` and buy with the pass they are given.
    #[serde(skip_serializing_if = "Option::is_none")]
    queue: Option<QueuePlan>,
    /// Items with a waiting room: SHA-256 of the seed that orders the pre-queue (hex),
    /// shown from the moment the queue is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    queue_commitment: Option<String>,
    /// Items with a waiting room, from `start_at`: the seed. A pre-queue place is ranked
    /// by the first six bytes of HMAC-SHA256(seed bytes, user id in decimal), lowest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    queue_seed: Option<&'a str>,
}

/// What a storefront shows of an item (no token needed).
#[utoipa::path(
    get,
    path = "/api/items/{item_id}",
    tag = "catalogue",
    params(("item_id" = ItemId, Path)),
    responses(
        (status = 200, description = "`ok`", body = ItemView),
        (status = 404, description = "`item_not_found`", body = Refusal),
        (status = 429, description = "`rate_limited`: the IP's read rate", body = Refusal),
    )
)]
async fn get_item(
    _: Reader,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    let Shared { catalog, .. } = &*state;
    let entry = catalog.get(id).await?.ok_or(ApiError::ItemNotFound)?;
    catalog.fresh_stock(&entry).await;
    let item = &entry.record;
    let now = crate::clock::now();
    let waves = (!item.release.is_empty()).then_some(&item.release);
    Ok(ok(
        "ok",
        ItemView {
            item_id: item.id,
            name: &item.name,
            shop_id: item.shop_id,
            status: entry.status(now),
            total: item.total,
            remaining: entry.on_sale(now),
            start_at: item.start_at,
            end_at: item.end_at,
            price_cents: item.price_cents,
            pay_timeout_s: item.pay_timeout_s,
            per_user: item.per_user,
            released: waves.map(|w| u64::from(item.total).saturating_sub(w.unreleased(now))),
            next_release_at: waves.map(|w| w.next_at(now)),
            draw_at: item.draw_at,
            draw_commitment: item.draw_seed.as_deref().and_then(|seed| {
                // A commitment to a seed that ranks nothing would promise nothing: none is
                // shown, and the seed's fault is logged (entries are refused likewise).
                crate::draw::rank::commitment(seed)
                    .inspect_err(|e| tracing::error!(item = %item.id, error = %e, "no draw commitment shown"))
                    .ok()
            }),
            draw_seed: item.drawn_at.and(item.draw_seed.as_deref()),
            draw_cutoff: item.drawn_at.and(item.draw_cutoff),
            queue: item.queue.0,
            queue_commitment: item.queue.0.and(item.queue_seed.as_deref()).and_then(|seed| {
                crate::draw::rank::commitment(seed)
                    .inspect_err(|e| tracing::error!(item = %item.id, error = %e, "no queue commitment shown"))
                    .ok()
            }),
            queue_seed: item
                .queue
                .0
                .filter(|_| now >= item.start_at)
                .and(item.queue_seed.as_deref()),
        },
    ))
}
