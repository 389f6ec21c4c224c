//! `POST /api/flashbuy`: the hot path.
//!
//! Extractors have checked the IP and user rates, the token, the client clock and the
//! body. What is left: the item's window, pause and sold-out flag and the circuit breakers,
//! all from memory (a "no" costs no network round trip), then one `FCALL` of `grab.lua`, then
//! `202` — the outbox already guarantees the order reaches MySQL, so the broker is not
//! waited for.

use std::time::Instant;

use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::breaker::{Action, Level};
use crate::domain::{ItemId, OrderSn, UserId};
use crate::http::error::{ApiError, Refusal};
use crate::http::extract::{ApiJson, Buyer, ClientTime, Idempotency};
use crate::http::reply::envelope;
use crate::http::request_id;
use crate::items::catalog::CatalogItem;
use crate::queue::pass::PassRefused;
use crate::state::AppState;

use super::refusal::{not_sold, refusal};
use super::sell::{Seller, bought_with, from_memory};

/// `POST /api/flashbuy`, counted, timed and shed (see [`Counted`]).
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(flashbuy))
}

/// A press of "buy".
#[derive(Debug, Deserialize, ToSchema)]
pub struct FlashbuyRequest {
    item_id: ItemId,
}

/// A won unit.
#[derive(Serialize, ToSchema)]
struct Queued {
    /// The order being written (≤ 40 characters, unique).
    order_sn: OrderSn,
    item_id: ItemId,
}

/// Counts and times every purchase answer (the funnel's `started`, and answers by code),
/// shed ones too. (Counted in the handler rather than by a layer on its route: a route's
/// middleware cost every purchase boxed clones of the route and a boxed future, about a
/// twentieth of a sold-out answer's instructions; tower's load-shed and concurrency layers
/// cost more still.)
struct Counted<'a> {
    state: &'a AppState,
    started: Instant,
}

impl<'a> Counted<'a> {
    fn start(state: &'a AppState) -> Self {
        state.deps.meters.started.increment(1);
        Self {
            state,
            started: Instant::now(),
        }
    }

    /// Beyond `SECKILL_MAX_INFLIGHT` purchases at once, a purchase is answered `503
    /// unavailable` at once rather than queued, before its token is even read.
    fn shed(&self) -> Response {
        self.state.deps.meters.shed.increment(1);
        ApiError::Overloaded.into_response()
    }

    fn answered(self, response: Response) -> Response {
        let code = request_id::answer_code().unwrap_or("unknown");
        self.state
            .deps
            .meters
            .purchase_answered(code, self.started.elapsed());
        response
    }
}

/// Buy one unit: the first `total` buyers win, each at most one unit of an item.
#[utoipa::path(
    post,
    path = "/api/flashbuy",
    tag = "purchase",
    operation_id = "flashbuy",
    security(("user" = [])),
    params(
        ("X-Client-Time" = i64, Header, description = "The client's clock, ms since the epoch"),
        ("X-Queue-Pass" = Option<String>, Header, description = "An item with a waiting room: the pass `GET /api/items/{item_id}/queue/me` gave the buyer"),
    ),
    request_body = FlashbuyRequest,
    responses(
        (status = 202, description = "`queued`: the user won one unit; the order is being written", body = Queued),
        (status = 400, description = "`bad_request` / `clock_skew`: body or headers malformed, or `X-Client-Time` too far from the server's clock", body = Refusal),
        (status = 403, description = "`not_started` / `ended`: outside the item's sale window; an item with a waiting room: `queue_required` (no `X-Queue-Pass`), `pass_expired`, `pass_invalid` (not this server's, or another user's or item's), `pass_used` (it bought what it allows)", body = Refusal),
        (status = 404, description = "`item_not_found`", body = Refusal),
        (status = 409, description = "`duplicate` / `limit_reached` / `between_releases`: the user already holds a unit of this item (`order_sn` names its order), or as many as `per_user` allows (`order_sns`); or everything released so far is sold and a wave is still to come (`next_release_at`, `Retry-After`)", body = Refusal),
        (status = 410, description = "`sold_out`: no units left", body = Refusal),
        (status = 429, description = "`rate_limited`: the user's or the IP's rate", body = Refusal),
        (status = 503, description = "`paused` / `circuit_open` / `shop_closed` / `unavailable`: paused by an operator, a breaker open, the shop closed, a dependency down or the server at its limit; `Retry-After` set", body = Refusal),
    )
)]
async fn flashbuy(State(state): State<AppState>, request: Request) -> Response {
    // Written out rather than wrapped around a future handed in: an `async fn` given a
    // future keeps it twice, and this one's future is moved on its way through the layers.
    let counted = Counted::start(&state);
    let response = match state.inflight.try_acquire() {
        // Held until the answer is ready.
        Ok(_permit) => answer(&state, request)
            .await
            .unwrap_or_else(IntoResponse::into_response),
        Err(_) => counted.shed(),
    };
    counted.answered(response)
}

/// The purchase behind [`flashbuy`]'s counting: its request read as the extractors read
/// it (in this order: the buyer and their rates, the client's clock, the key, the body),
/// then decided.
async fn answer(state: &AppState, request: Request) -> Result<Response, ApiError> {
    let (mut parts, body) = request.into_parts();
    let Buyer(user) = Buyer::from_request_parts(&mut parts, state).await?;
    ClientTime::from_request_parts(&mut parts, state).await?;
    let Idempotency(key) = Idempotency::from_request_parts(&mut parts, state).await?;
    let pass = parts
        .headers
        .get(QUEUE_PASS)
        .map(|value| value.to_str().unwrap_or_default().to_owned());
    let ApiJson(request) =
        ApiJson::<FlashbuyRequest>::from_request(Request::from_parts(parts, body), state).await?;
    let item_id = request.item_id;
    // Debug, not info: most requests of a sale are refused from memory, and a log line
    // each cost a quarter of that path's throughput (measured).
    tracing::debug!(
        user_id = user.get(),
        item_id = item_id.get(),
        "flashbuy_start"
    );
    let now = crate::clock::now();
    let item = state
        .catalog
        .get(item_id)
        .await?
        .ok_or(ApiError::ItemNotFound)?;
    if let Some(refused) = refused_before_redis(state, &item, user, pass.as_deref(), now).await? {
        return match key.as_deref() {
            None => Err(refused),
            // Boxed, as the rare case it is: inline, its future doubled every purchase's.
            Some(key) => Box::pin(unless_repeated(state, &item, user, key, refused)).await,
        };
    }

    // Named in the request's log lines from here on: every line logged from now carries
    // them. (Only now: while a tracing span held them, recording cost a request refused
    // from memory, which logs nothing at info, 13% of its path.)
    request_id::record_user(user, Some(item_id));
    if item.record.draw_at.is_some() {
        return Box::pin(super::entry::enter(state, &item, user)).await;
    }
    // Boxed: the Redis step's future is kilobytes, and every request's future (moved
    // several times through the layers) would otherwise carry it, refused or not.
    let seller = Seller {
        deps: &state.deps,
        catalog: &state.catalog,
        publisher: &state.publisher,
        signals: &state.signals,
    };
    let queued_item = item.record.queue.0.is_some();
    if queued_item && let Err(refused) = Box::pin(take_pass(state, item_id, user)).await {
        return match key.as_deref() {
            Some(key) if matches!(refused, ApiError::PassUsed) => {
                Box::pin(unless_repeated(state, &item, user, key, refused)).await
            }
            _ => Err(refused),
        };
    }
    let sold = Box::pin(seller.sell(&item, user, now, key)).await;
    if queued_item {
        settle_pass(state, item_id, user, sold.as_ref().ok());
    }
    match sold {
        Ok(order_sn) => Ok(queued(order_sn, item_id)),
        Err(refused) => Err(not_sold(refused, &item)),
    }
}

/// What refuses the purchase before Redis: its pass, memory (the window, the pause, sold
/// out), the shop closed, or a breaker — after "sold out", so that a throttle's budget goes
/// to purchases that can still win. Levels 1 and 2 of a breaker stop new purchases, not
/// the answer a retried key is owed (`Ok(Some)`); level 3 stops everything (`Err`).
async fn refused_before_redis(
    state: &AppState,
    item: &CatalogItem,
    user: UserId,
    pass: Option<&str>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Option<ApiError>, ApiError> {
    if let Err(refused) = passed(state, item, user, pass, now) {
        return Ok(Some(refused));
    }
    if let Some(refused) = from_memory(item, now) {
        return Ok(Some(refusal(refused, item)));
    }
    // (From this instance's cache, filled from Redis on a miss.)
    if !state.shops.open_now(item.record.shop_id).await {
        return Ok(Some(ApiError::ShopClosed));
    }
    match state.breakers.admit(item.record.id, Action::Purchase) {
        Ok(()) => Ok(None),
        Err(open) if open.level >= u8::from(Level::Stop) => Err(open.into()),
        Err(open) => Ok(Some(open.into())),
    }
}

/// The header a queued item's purchase carries its pass in.
const QUEUE_PASS: &str = "x-queue-pass";

/// Whether the purchase may go on as far as the waiting room is concerned: an item
/// without one lets anyone try; a queued item only the buyer its pass names, before the
/// pass expires (checked in memory: no Redis call).
fn passed(
    state: &AppState,
    item: &CatalogItem,
    user: UserId,
    pass: Option<&str>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), ApiError> {
    if item.record.queue.0.is_none() {
        return Ok(());
    }
    let pass = pass.ok_or(ApiError::QueueRequired)?;
    let checked =
        state
            .waiting
            .signer
            .check_pass(pass, item.record.id, user, now.timestamp_millis());
    match checked {
        Ok(_) => Ok(()),
        Err(PassRefused::Expired) => Err(ApiError::PassExpired),
        Err(PassRefused::Invalid) => Err(ApiError::PassInvalid),
    }
}

/// Takes one of the units the buyer's pass reserves, before the purchase tries to buy
/// it: a pass buys at most what it reserves (`per_user`), also after a cancel gave a
/// unit back (that unit goes to the next in line). `403 pass_used` once it reserves none.
async fn take_pass(state: &AppState, item: ItemId, user: UserId) -> Result<(), ApiError> {
    let keys = state.deps.keys.queue(item);
    let mut conn = state.deps.redis.hot().await?;
    if crate::queue::line::take(&mut conn, &keys, user).await? {
        Ok(())
    } else {
        Err(ApiError::PassUsed)
    }
}

/// The purchase that took a unit of the pass ended: won (`order_sn`), the unit is spent;
/// else it goes back to the pass. After the answer, not before it: until then the unit
/// stays reserved — fewer let in meanwhile, never more (and so for good, should this
/// fail, until the pass runs out).
fn settle_pass(state: &AppState, item: ItemId, user: UserId, order_sn: Option<&OrderSn>) {
    let (redis, keys, order_sn) = (
        state.deps.redis.clone(),
        state.deps.keys.queue(item),
        order_sn.cloned(),
    );
    tokio::spawn(async move {
        let settled = async {
            let mut conn = redis.bulk().await?;
            match &order_sn {
                Some(order_sn) => crate::queue::line::used(&mut conn, &keys, user, order_sn).await,
                None => crate::queue::line::give(&mut conn, &keys, user).await,
            }
        };
        if let Err(e) = settled.await {
            tracing::warn!(%item, ?order_sn, error = %e, "could not settle a pass's unit; it stays reserved until the pass runs out");
        }
    });
}

/// A purchase refused before Redis (`refused`), unless the buyer's `Idempotency-Key` bought
/// a unit before: then it hears that `202` again, as the contract promises a retried key,
/// sold out or not (once the order is safe: `bought_with`).
async fn unless_repeated(
    state: &AppState,
    item: &CatalogItem,
    user: UserId,
    key: &str,
    refused: ApiError,
) -> Result<Response, ApiError> {
    let bought = bought_with(&state.deps.redis, &state.deps.keys, item, user, key);
    match bought.await {
        Ok(Some(order_sn)) => Ok(queued(order_sn, item.record.id)),
        Ok(None) => Err(refused),
        Err(not_yet) => Err(not_sold(not_yet, item)),
    }
}

/// `202 queued`: a won unit (or, for a repeated `Idempotency-Key`, the one it won).
fn queued(order_sn: OrderSn, item_id: ItemId) -> Response {
    envelope(StatusCode::ACCEPTED, "queued", Queued { order_sn, item_id })
}
