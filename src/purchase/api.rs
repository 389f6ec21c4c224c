//! `POST /api/flashbuy`: the hot path.
//!
//! Extractors have checked the IP and user rates, the token, the client clock and the
//! body. What is left: the item's window, pause and sold-out flag and the circuit breakers,
//! all from memory (a "no" costs no network round trip), then one `EVALSHA grab.lua`, then
//! `202` — the outbox already guarantees the order reaches MySQL, so the broker is not
//! waited for.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::breaker::Action;
use crate::broker::Outgoing;
use crate::domain::{ItemId, OrderPlaced, OrderSn, UserId};
use crate::http::error::{ApiError, Refusal};
use crate::http::extract::{ApiJson, Buyer, ClientTime, Idempotency};
use crate::http::reply::{Code, envelope};
use crate::http::request_id;
use crate::items::catalog::CatalogItem;
use crate::items::transfer::{self, Lending};
use crate::keys::ItemKeys;
use crate::orders::placed;
use crate::state::AppState;
use crate::store::{RedisConn, RedisError, Replication, ShortOfReplicas, redis_timed};

use super::grab::{GrabOutcome, IdempotencyKey, give_back, grab};
use super::refusal::refusal;

/// Units a buyer of a split item may borrow into their bucket and lose to others of it
/// before being told to press again (each round moves a unit: the sale goes on).
const MOST_REFILLS: usize = 8;

/// How near a wave's time a purchase that memory would refuse asks Redis instead: more
/// than the catalogue's stock refresh (half a second) and a host's clock error.
const WAVE_MARGIN: chrono::Duration = chrono::Duration::seconds(2);

/// `POST /api/flashbuy`, counted, timed and shed (see [`count_and_shed`]).
pub fn router(state: &AppState) -> OpenApiRouter<AppState> {
    let (schemas, paths, method) = routes!(flashbuy);
    let counted = axum::middleware::from_fn_with_state(state.clone(), count_and_shed);
    OpenApiRouter::new().routes((schemas, paths, method.layer(counted)))
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
/// shed ones too: beyond `SECKILL_MAX_INFLIGHT` purchases at once, a purchase is answered
/// `503 unavailable` at once rather than queued. (One middleware, not tower's load-shed and
/// concurrency layers: those cost a boxed service clone and a semaphore handle per request.)
async fn count_and_shed(
    State(state): State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let started = Instant::now();
    state.meters.started.increment(1);
    let response = match state.inflight.try_acquire() {
        // Held until the answer is ready.
        Ok(_permit) => next.run(request).await,
        Err(_) => {
            state.meters.shed.increment(1);
            ApiError::Overloaded.into_response()
        }
    };
    let code = response
        .extensions()
        .get::<Code>()
        .map_or("unknown", |c| c.0);
    state.meters.purchase_answered(code, started.elapsed());
    response
}

/// Buy one unit: the first `total` buyers win, each at most one unit of an item.
#[utoipa::path(
    post,
    path = "/api/flashbuy",
    tag = "purchase",
    operation_id = "flashbuy",
    security(("user" = [])),
    params(("X-Client-Time" = i64, Header, description = "The client's clock, ms since the epoch")),
    request_body = FlashbuyRequest,
    responses(
        (status = 202, description = "`queued`: the user won one unit; the order is being written", body = Queued),
        (status = 400, description = "`bad_request` / `clock_skew`: body or headers malformed, or `X-Client-Time` too far from the server's clock", body = Refusal),
        (status = 403, description = "`not_started` / `ended`: outside the item's sale window", body = Refusal),
        (status = 404, description = "`item_not_found`", body = Refusal),
        (status = 409, description = "`duplicate` / `limit_reached` / `between_releases`: the user already holds a unit of this item (`order_sn` names its order), or as many as `per_user` allows (`order_sns`); or everything released so far is sold and a wave is still to come (`next_release_at`, `Retry-After`)", body = Refusal),
        (status = 410, description = "`sold_out`: no units left", body = Refusal),
        (status = 429, description = "`rate_limited`: the user's or the IP's rate", body = Refusal),
        (status = 503, description = "`paused` / `circuit_open` / `shop_closed` / `unavailable`: paused by an operator, a breaker open, the shop closed, a dependency down or the server at its limit; `Retry-After` set", body = Refusal),
    )
)]
async fn flashbuy(
    State(state): State<AppState>,
    Buyer(user): Buyer,
    _: ClientTime,
    Idempotency(key): Idempotency,
    ApiJson(request): ApiJson<FlashbuyRequest>,
) -> Result<Response, ApiError> {
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
    if let Some(refused) = from_memory(&item, now) {
        // A retry whose key bought a unit hears its 202 again, sold out or not.
        if let Some(key) = &key
            && let Some(order_sn) = bought_with(&state, &item, user, key).await
        {
            return Ok(queued(order_sn, item_id));
        }
        return Err(refusal(refused, &item));
    }
    // From this instance's cache (filled from Redis on a miss).
    if !state.shops.open_now(item.record.shop_id).await {
        return Err(ApiError::ShopClosed);
    }
    // After "sold out", so that a throttle's budget goes to purchases that can still win.
    state.breakers.admit(item_id, Action::Purchase)?;

    // Into the request span only now: every line logged from here on carries them, and a
    // request refused from memory (which logs nothing at info) skips the cost (measured:
    // the log formatter re-encodes the span's fields, about 13% of that path).
    request_id::record_user(user, Some(item_id));
    if item.record.draw_at.is_some() {
        return Box::pin(super::entry::enter(&state, &item, user)).await;
    }
    // Boxed: the Redis step's future is kilobytes, and every request's future (moved
    // several times through the layers) would otherwise carry it, refused or not.
    Box::pin(sell(&state, item, user, now, key)).await
}

/// The order a buyer's `Idempotency-Key` bought, if it did (`None` too when Redis cannot
/// say: the refusal memory gave stands).
async fn bought_with(
    state: &AppState,
    item: &CatalogItem,
    user: UserId,
    key: &str,
) -> Option<OrderSn> {
    let record = IdempotencyKey::of(&state.keys, item, user, key.to_owned()).record;
    let mut conn = state.redis.hot().await.ok()?;
    let sn: Option<String> = redis_timed(redis::AsyncCommands::get(&mut conn, record))
        .await
        .ok()?;
    sn.as_deref().and_then(OrderSn::parse)
}

/// `202 queued`: a won unit (or, for a repeated `Idempotency-Key`, the one it won).
fn queued(order_sn: OrderSn, item_id: ItemId) -> Response {
    envelope(StatusCode::ACCEPTED, "queued", Queued { order_sn, item_id })
}

/// The Redis step and its answer, for a purchase memory could not refuse.
async fn sell(
    state: &AppState,
    item: Arc<CatalogItem>,
    user: UserId,
    now: chrono::DateTime<Utc>,
    key: Option<String>,
) -> Result<Response, ApiError> {
    let item_id = item.record.id;
    let idempotency = key.map(|key| IdempotencyKey::of(&state.keys, &item, user, key));
    // Before the grab (`SECKILL_REDIS_WAIT_REPLICAS`): the replicas a win will wait for,
    // on the master serving the buyer's bucket now. While that master is short of them no
    // unit is taken there — it could never be confirmed.
    let replication = match state.redis.replicas_for(&item.home(user).replicated).await {
        Ok(replication) => replication,
        Err(short) => return Err(short_of_replicas(state, &item, user, short).await),
    };
    let order = order_for(&item, user, now.timestamp_millis());
    let order_json = serde_json::to_string(&order).map_err(anyhow::Error::from)?;
    let idempotency = idempotency.as_ref();
    match run_grab(state, &item, user, &order, &order_json, idempotency).await? {
        GrabOutcome::Won { slot } => {
            let won = Won {
                order,
                order_json,
                slot,
                idempotency,
            };
            accept(state, &item, won, replication).await
        }
        GrabOutcome::Repeat(order_sn) => Ok(queued(order_sn, item_id)),
        GrabOutcome::SoldOut => {
            if item.mark_sold_out() {
                // Other instances learn it from the announcement rather than waiting for
                // their refresh to come round to this item (in the background: the buyer
                // does not wait for it).
                let catalog = state.catalog.clone();
                tokio::spawn(async move {
                    if let Err(e) = catalog.announce(item_id).await {
                        tracing::debug!(error = %e, "could not announce a sell-out; other instances find it themselves");
                    }
                });
            }
            Err(ApiError::SoldOut)
        }
        other => Err(refusal(other, &item)),
    }
}

/// What the catalogue already says no to: the window, the pause, the sold-out flag.
fn from_memory(item: &CatalogItem, now: chrono::DateTime<Utc>) -> Option<GrabOutcome> {
    if now < item.record.start_at {
        Some(GrabOutcome::NotStarted)
    } else if now >= item.record.end_at || item.record.draw_at.is_some_and(|at| now >= at) {
        // A draw takes no entry after its time (`lua/enter.lua` holds to Redis's clock).
        Some(GrabOutcome::Ended)
    } else if item.record.paused {
        Some(GrabOutcome::Paused)
    } else if item.sold_out() {
        // Near a wave Redis decides, by its own clock: a host whose clock runs behind must
        // not keep a wave shut, and the memory of "nothing left" is older than the wave.
        let waves = &item.record.release;
        let near = |at: chrono::DateTime<Utc>| (at - now).abs() <= WAVE_MARGIN;
        match waves.next_at(now) {
            Some(at) if near(at) => None,
            Some(at) => Some(GrabOutcome::BetweenReleases(at.timestamp_millis())),
            None if waves.last_at().is_some_and(near) => None,
            None => Some(GrabOutcome::SoldOut),
        }
    } else {
        None
    }
}

/// The order the buyer gets if they win: numbered in their home bucket, where every
/// purchase of theirs goes ("one per user" is decided there).
fn order_for(item: &CatalogItem, user: UserId, now_ms: i64) -> OrderPlaced {
    OrderPlaced {
        order_sn: OrderSn::generate(item.home(user).bucket, item.record.split()),
        item_id: item.record.id,
        user_id: user,
        created_at_ms: now_ms,
        pay_deadline_ms: now_ms + i64::from(item.record.pay_timeout_s) * 1000,
        slot: 0,
    }
}

/// The Redis step: `grab.lua` in the buyer's bucket (borrowing from the others of a split
/// item while it is empty), timed, counted and logged.
async fn run_grab(
    state: &AppState,
    item: &CatalogItem,
    user: UserId,
    order: &OrderPlaced,
    order_json: &str,
    idempotency: Option<&IdempotencyKey>,
) -> Result<GrabOutcome, ApiError> {
    let started = Instant::now();
    let mut conn = state.redis.hot().await?;
    let home = item.home(user);
    let attempt = Attempt {
        order,
        per_user: item.record.per_user,
        order_json,
        idempotency,
    };
    let mut outcome = attempt.grab(&mut conn, home).await;
    if item.record.split() {
        let lending = Lending {
            redis: &state.redis,
            keys: &state.keys,
        };
        outcome = refill_and_grab(&mut conn, item, &attempt, outcome, lending).await;
    }
    let took = started.elapsed();
    state.signals.purchase(took, outcome.is_err());
    state.meters.redis_grab_seconds.record(took);
    let duration_ms = took.as_secs_f64() * 1e3;
    // Every unit sold leaves an info line (as many as the stock); the crowd of refusals
    // does not flood the log unless asked for (`RUST_LOG=seckill=debug`).
    match &outcome {
        Ok(GrabOutcome::Won { .. }) => tracing::info!(outcome = "won", duration_ms, "redis_grab"),
        Ok(o) => tracing::debug!(outcome = o.as_str(), duration_ms, "redis_grab"),
        // The failure itself is logged once, at the edge (`ApiError`), with its cause.
        Err(_) => tracing::debug!(outcome = "error", duration_ms, "redis_grab"),
    }
    Ok(outcome?)
}

/// A press while the buyer's master is short of replicas: the truth where it costs one
/// read (they hold a unit already: `409`), else `503` until the replicas are back.
async fn short_of_replicas(
    state: &AppState,
    item: &CatalogItem,
    user: UserId,
    short: ShortOfReplicas,
) -> ApiError {
    tracing::debug!(reason = %short, "purchase refused before the grab");
    let mut held = placed::held_by(&state.redis, item.home(user), user)
        .await
        .unwrap_or_default();
    let limit = usize::from(item.record.per_user.max(1));
    if held.len() < limit {
        return ApiError::Unavailable(
            "the sale is waiting for a Redis replica to come back; try again shortly".into(),
        );
    }
    match held.pop() {
        Some(order_sn) if limit == 1 => ApiError::Duplicate { order_sn },
        last => ApiError::LimitReached {
            order_sns: held.into_iter().chain(last).collect(),
        },
    }
}

/// A win: once its replicas hold it (with `SECKILL_REDIS_WAIT_REPLICAS`), the order goes
/// to the publisher and the buyer hears `202`.
async fn accept(
    state: &AppState,
    item: &CatalogItem,
    won: Won<'_>,
    replication: Replication,
) -> Result<Response, ApiError> {
    let Won {
        mut order,
        mut order_json,
        slot,
        idempotency,
    } = won;
    if slot > 0 {
        // As grab.lua stored it: the order's place goes with it to MySQL.
        order.slot = slot;
        order_json = serde_json::to_string(&order).map_err(anyhow::Error::from)?;
    }
    // Not answered, and not handed to the publisher, before the replicas hold it: a
    // failover could otherwise put the unit back on sale while MySQL gets its order.
    if !replication.held().await {
        // Given back while it is still where it was won, so that no unit waits for a
        // confirmation that may never come. Unless someone claimed it to send it (then it
        // is kept and sent), or a failover loses the give-back (then it is kept and waits
        // for its replicas): either way pressing again tells the buyer (409).
        let home = item.home(order.user_id);
        let given_back = async {
            let mut conn = state.redis.hot().await?;
            give_back(&mut conn, home, order.user_id, &order.order_sn, idempotency).await
        };
        let given_back = given_back.await;
        tracing::info!(order_sn = %order.order_sn, given_back = ?given_back.as_ref().ok(), "a win its Redis replicas did not confirm in time");
        return Err(ApiError::Unavailable(
            "your purchase could not be confirmed in time; press again to buy, or to find your order if it went through".into(),
        ));
    }
    state.meters.won.increment(1);
    let order_sn = order.order_sn;
    state.publisher.offer(Outgoing {
        order_sn: order_sn.clone(),
        payload: order_json,
    });
    Ok(queued(order_sn, order.item_id))
}

/// A won unit, as `accept` takes it.
struct Won<'a> {
    order: OrderPlaced,
    order_json: String,
    /// Its place in the buyer's record.
    slot: u8,
    idempotency: Option<&'a IdempotencyKey>,
}

/// One purchase's `grab.lua` call, made again after each unit borrowed.
struct Attempt<'a> {
    order: &'a OrderPlaced,
    /// The item's `per_user`, as this instance's catalogue has it.
    per_user: u8,
    order_json: &'a str,
    idempotency: Option<&'a IdempotencyKey>,
}

impl Attempt<'_> {
    async fn grab(&self, conn: &mut RedisConn, home: &ItemKeys) -> Result<GrabOutcome, RedisError> {
        let order = self.order;
        grab(
            conn,
            home,
            (order.user_id, self.per_user),
            &order.order_sn,
            self.order_json,
            self.idempotency,
        )
        .await
    }
}

/// Borrows from a split item's other buckets while the buyer's own bucket is empty, and
/// grabs again: "sold out" only once no bucket had a unit to lend.
async fn refill_and_grab(
    conn: &mut RedisConn,
    item: &CatalogItem,
    attempt: &Attempt<'_>,
    mut outcome: Result<GrabOutcome, RedisError>,
    lending: Lending<'_>,
) -> Result<GrabOutcome, RedisError> {
    let home = item.home(attempt.order.user_id);
    for _ in 0..MOST_REFILLS {
        // Nothing for sale in the buyer's bucket (or nothing until a wave): maybe in another.
        if !matches!(
            outcome,
            Ok(GrabOutcome::SoldOut | GrabOutcome::BetweenReleases(_))
        ) {
            return outcome;
        }
        item.mark_empty(home.bucket.index);
        // The fullest first, by the last refresh; every other bucket is asked in the end.
        let mut lenders: Vec<&ItemKeys> = item
            .buckets
            .iter()
            .filter(|b| b.bucket != home.bucket)
            .collect();
        lenders.sort_by_key(|b| std::cmp::Reverse(item.remaining_in(b.bucket.index)));
        let borrowed = transfer::borrow(conn, home, lenders.into_iter(), lending).await?;
        for bucket in borrowed.empty {
            item.mark_empty(bucket);
        }
        if borrowed.stalled {
            return Ok(GrabOutcome::StillMoving);
        }
        if !borrowed.moved {
            return outcome;
        }
        // Someone else of this bucket may take the unit first: then borrow again.
        outcome = attempt.grab(conn, home).await;
    }
    match outcome {
        Ok(GrabOutcome::SoldOut) => Ok(GrabOutcome::StillMoving),
        other => other,
    }
}
