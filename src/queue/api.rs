//! The waiting room's buyer routes: join (`POST /api/items/{id}/queue`), the join's
//! proof-of-work challenge, where one stands (`GET …/queue/me`) and its live stream
//! (`GET …/queue/me/events`, Server-Sent Events).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use futures::Stream;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::{ItemId, UserId};
use crate::http::error::{ApiError, Refusal};
use crate::http::extract::{ApiPath, Buyer, OrderSeeker};
use crate::http::reply::ok;
use crate::http::request_id;
use crate::items::catalog::CatalogItem;
use crate::state::AppState;

use super::line::{self, Joined, Standing, Window};
use super::pass::CHALLENGE_TTL_MS;
use super::view::{QueueState, QueueView, view};
use crate::items::queue_plan::QueuePlan;

const WAITING_FOR_REPLICA: &str =
    "the waiting room is waiting for a Redis replica to come back; join again shortly";

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(join))
        .routes(routes!(challenge))
        .routes(routes!(me))
        .routes(routes!(me_events))
}

/// A join's proof-of-work, when the queue asks for one (`pow_bits` > 0).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct JoinRequest {
    /// As `GET …/queue/challenge` gave it.
    challenge: Option<String>,
    /// Any string for which SHA-256(`<challenge>:<nonce>`) begins with `pow_bits` zero bits.
    nonce: Option<String>,
}

/// A challenge to solve before joining.
#[derive(Serialize, ToSchema)]
struct Challenge {
    challenge: String,
    /// Leading zero bits SHA-256(`<challenge>:<nonce>`) must have.
    pow_bits: u8,
    expires_at: DateTime<Utc>,
}

/// A joined buyer's place, and whether it was taken before.
#[derive(Serialize, ToSchema)]
struct JoinedView {
    /// Joined before: this is the place taken then.
    again: bool,
    #[serde(flatten)]
    place: QueueView,
}

/// The item and its waiting room: `queue_not_found` for an item without one.
async fn queued(state: &AppState, id: ItemId) -> Result<(Arc<CatalogItem>, QueuePlan), ApiError> {
    let item = state.catalog.get(id).await?.ok_or(ApiError::ItemNotFound)?;
    let plan = item.record.queue.0.ok_or(ApiError::QueueNotFound)?;
    Ok((item, plan))
}

#[utoipa::path(
    post,
    path = "/api/items/{item_id}/queue",
    tag = "waiting room",
    summary = "Take a place in the item's waiting room (again: the same place)",
    security(("user" = [])),
    params(("item_id" = ItemId, Path)),
    request_body(content = Option<JoinRequest>, description = "The proof-of-work, when the queue asks for one"),
    responses(
        (status = 200, description = "`joined`: the buyer's place", body = JoinedView),
        (status = 403, description = "`queue_not_open` (before `start_at − opens_before_s`), `ended`, or `pow_failed`", body = Refusal),
        (status = 404, description = "`item_not_found` / `queue_not_found`", body = Refusal),
        (status = 429, description = "`rate_limited`", body = Refusal),
        (status = 503, description = "`unavailable`", body = Refusal),
    )
)]
/// `POST /api/items/{item_id}/queue`
async fn join(
    State(state): State<AppState>,
    Buyer(user): Buyer,
    ApiPath(item_id): ApiPath<ItemId>,
    body: Bytes,
) -> Result<Response, ApiError> {
    request_id::record_user(user, Some(item_id));
    let (item, plan) = queued(&state, item_id).await?;
    let record = &item.record;
    if plan.pow_bits > 0 {
        let body: JoinRequest = if body.is_empty() {
            JoinRequest::default()
        } else {
            serde_json::from_slice(&body)
                .map_err(|e| ApiError::bad_request(format!("body: {e}")))?
        };
        let (Some(challenge), Some(nonce)) = (body.challenge, body.nonce) else {
            return Err(ApiError::PowFailed(
                "this queue asks for a proof-of-work: GET …/queue/challenge, then send `challenge` and `nonce`".into(),
            ));
        };
        let now_ms = crate::clock::now().timestamp_millis();
        state
            .waiting
            .signer
            .check_solution(&challenge, &nonce, plan.pow_bits, item_id, user, now_ms)
            .map_err(|e| ApiError::PowFailed(e.to_string()))?;
    }
    let seed = record
        .queue_seed
        .as_deref()
        .ok_or_else(|| anyhow::anyhow!("item {item_id} has a queue and no seed"))?;
    let rank = crate::draw::rank::rank(seed, user).map_err(anyhow::Error::from)?;
    let start_ms = record.start_at.timestamp_millis();
    let window = Window {
        opens_ms: start_ms - i64::from(plan.opens_before_s) * 1000,
        start_ms,
        end_ms: record.end_at.timestamp_millis(),
    };
    let keys = state.deps.keys.queue(item_id);
    // A place is promised once the queue's replicas hold it, as a won unit is: a failover
    // after the answer must not take it back.
    let replication = state
        .deps
        .redis
        .replicas_for(&keys.replicated)
        .await
        .map_err(|_| ApiError::Unavailable(WAITING_FOR_REPLICA.into()))?;
    let mut conn = state.deps.redis.hot().await?;
    let joined = line::join(&mut conn, &keys, user, rank, window).await?;
    // A place found again is held to the same rule: the first join may have been answered
    // `503` because its replicas had not confirmed it yet.
    if matches!(joined, Joined::Placed { .. }) && !replication.held().await {
        return Err(ApiError::Unavailable(
            "the place is not yet held by the queue's Redis replicas: join again (the same place is kept if it was)".into(),
        ));
    }
    match joined {
        Joined::NotOpen => Err(ApiError::QueueNotOpen {
            opens_at: DateTime::from_timestamp_millis(window.opens_ms).unwrap_or(record.start_at),
        }),
        Joined::Ended => Err(ApiError::Ended),
        Joined::Placed { again, standing } => {
            let place = seen(&state, record, &plan, user, &standing)?;
            if !again {
                state.deps.meters.queue_joined(item_id);
            }
            Ok(ok("joined", JoinedView { again, place }))
        }
    }
}

/// What `standing` tells `user`.
fn seen(
    state: &AppState,
    record: &crate::items::repo::Item,
    plan: &QueuePlan,
    user: UserId,
    standing: &Standing,
) -> Result<QueueView, ApiError> {
    view(standing, record, plan, user, &state.waiting.signer).ok_or(ApiError::NotInQueue)
}

#[utoipa::path(
    get,
    path = "/api/items/{item_id}/queue/challenge",
    tag = "waiting room",
    summary = "A proof-of-work challenge for joining the item's queue",
    security(("user" = [])),
    params(("item_id" = ItemId, Path)),
    responses(
        (status = 200, description = "`ok`: solve it within two minutes", body = Challenge),
        (status = 404, description = "`item_not_found` / `queue_not_found`", body = Refusal),
        (status = 429, description = "`rate_limited`", body = Refusal),
    )
)]
/// `GET /api/items/{item_id}/queue/challenge`: bound to the user, the item and an expiry;
/// nothing is stored (it is checked against its own signature).
async fn challenge(
    State(state): State<AppState>,
    OrderSeeker(user): OrderSeeker,
    ApiPath(item_id): ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    let (_, plan) = queued(&state, item_id).await?;
    let expires_ms = crate::clock::now().timestamp_millis() + CHALLENGE_TTL_MS;
    Ok(ok(
        "ok",
        Challenge {
            challenge: state.waiting.signer.challenge(item_id, user, expires_ms),
            pow_bits: plan.pow_bits,
            expires_at: DateTime::from_timestamp_millis(expires_ms).unwrap_or_default(),
        },
    ))
}

#[utoipa::path(
    get,
    path = "/api/items/{item_id}/queue/me",
    tag = "waiting room",
    summary = "Where the buyer stands in the item's waiting room",
    security(("user" = [])),
    params(("item_id" = ItemId, Path)),
    responses(
        (status = 200, description = "`ok`", body = QueueView),
        (status = 404, description = "`item_not_found` / `queue_not_found` / `not_in_queue`", body = Refusal),
        (status = 429, description = "`rate_limited`", body = Refusal),
        (status = 503, description = "`unavailable`", body = Refusal),
    )
)]
/// `GET /api/items/{item_id}/queue/me`
async fn me(
    State(state): State<AppState>,
    OrderSeeker(user): OrderSeeker,
    ApiPath(item_id): ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    let (item, plan) = queued(&state, item_id).await?;
    let standing = read_standing(&state, item_id, user).await?;
    Ok(ok(
        "ok",
        seen(&state, &item.record, &plan, user, &standing)?,
    ))
}

async fn read_standing(state: &AppState, item: ItemId, user: UserId) -> Result<Standing, ApiError> {
    let keys = state.deps.keys.queue(item);
    let mut conn = state.deps.redis.hot().await?;
    Ok(line::standing(&mut conn, &keys, user).await?)
}

#[utoipa::path(
    get,
    path = "/api/items/{item_id}/queue/me/events",
    tag = "waiting room",
    summary = "Where the buyer stands, pushed as it changes (Server-Sent Events)",
    security(("user" = [])),
    params(("item_id" = ItemId, Path)),
    responses(
        (status = 200, description = "`text/event-stream`: one `place` event (a `QueueView` as JSON) now and at every change; the stream ends after `admitted`, `expired` or `done`", content_type = "text/event-stream", body = QueueView),
        (status = 404, description = "`item_not_found` / `queue_not_found` / `not_in_queue`", body = Refusal),
        (status = 429, description = "`rate_limited`", body = Refusal),
    )
)]
/// `GET /api/items/{item_id}/queue/me/events`
async fn me_events(
    State(state): State<AppState>,
    OrderSeeker(user): OrderSeeker,
    ApiPath(item_id): ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    let (item, plan) = queued(&state, item_id).await?;
    let first = read_standing(&state, item_id, user).await?;
    // Not in line: a plain 404, before any stream starts.
    seen(&state, &item.record, &plan, user, &first)?;
    let stream = places(state, item, plan, user, first);
    let mut response = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response();
    // Proxies pass each event on at once (nginx reads this header; nginx/seckill.conf
    // turns buffering off for this route as well).
    response.headers_mut().insert(
        "x-accel-buffering",
        axum::http::HeaderValue::from_static("no"),
    );
    Ok(response)
}

/// Whether a buyer in `state` has nothing more to wait for: let in, or the sale over
/// (before it is, `sold_out` may turn back to waiting: a refund puts a unit back).
fn settled(state: QueueState, item: &crate::items::repo::Item) -> bool {
    match state {
        QueueState::Admitted | QueueState::Expired | QueueState::Done => true,
        QueueState::SoldOut => crate::clock::now() >= item.end_at,
        QueueState::Waiting => false,
    }
}

/// How often a stream before `start_at` reads its buyer's place again: joins ranked ahead
/// move it, and the shared counters do not say by how much.
const PRE_QUEUE_READ_EVERY: Duration = Duration::from_secs(5);

/// A stream's buyer, followed (see [`places`]).
struct Follow {
    state: AppState,
    item: Arc<CatalogItem>,
    plan: QueuePlan,
    user: UserId,
    /// The buyer's place in the line, as last read.
    index: Option<u64>,
    read_at: std::time::Instant,
    counters: tokio::sync::watch::Receiver<super::watch::Counters>,
    next: Option<Standing>,
    last: Option<QueueView>,
    over: bool,
}

impl Follow {
    /// The buyer's standing at the next change of the item's counters: computed from
    /// them, or read again when the buyer was let in (for the pass) or, before
    /// `start_at`, every [`PRE_QUEUE_READ_EVERY`]. `None` at `until`, or once the watch
    /// is gone.
    async fn next_standing(&mut self, until: tokio::time::Instant) -> Option<Standing> {
        loop {
            tokio::time::timeout_at(until, self.counters.changed())
                .await
                .ok()?
                .ok()?;
            let Some(mut counters) = *self.counters.borrow_and_update() else {
                continue;
            };
            counters.index = self.index;
            counters.now_ms = crate::clock::now().timestamp_millis();
            let let_in = self.index.is_some_and(|index| index < counters.cursor);
            let pre_queue = counters.now_ms < self.item.record.start_at.timestamp_millis()
                && self.read_at.elapsed() >= PRE_QUEUE_READ_EVERY;
            if !(let_in || pre_queue) {
                return Some(counters);
            }
            // The buyer's own: the pass, or the place ranks ahead moved.
            if let Ok(standing) = read_standing(&self.state, self.item.record.id, self.user).await {
                self.index = standing.index;
                self.read_at = std::time::Instant::now();
                return Some(standing);
            }
        }
    }
}

/// The buyer's place now, then at every change of the item's counters (as this
/// instance's watch reads them); once let in, their standing is read again, for the pass.
/// The stream ends once nothing more can happen to the buyer, or an hour after the sale.
fn places(
    state: AppState,
    item: Arc<CatalogItem>,
    plan: QueuePlan,
    user: UserId,
    first: Standing,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let counters = state.waiting.watches.subscribe(item.record.id);
    let follow = Follow {
        index: first.index,
        read_at: std::time::Instant::now(),
        state,
        item,
        plan,
        user,
        counters,
        next: Some(first),
        last: None,
        over: false,
    };
    let ends_at = follow.item.record.end_at + chrono::Duration::hours(1);
    let until =
        tokio::time::Instant::now() + (ends_at - crate::clock::now()).to_std().unwrap_or_default();
    futures::stream::unfold(follow, move |mut f| async move {
        loop {
            if f.over {
                return None;
            }
            let standing = match f.next.take() {
                Some(standing) => standing,
                None => f.next_standing(until).await?,
            };
            let place = view(
                &standing,
                &f.item.record,
                &f.plan,
                f.user,
                &f.state.waiting.signer,
            )?;
            f.over = settled(place.state, &f.item.record);
            if f.last.as_ref() == Some(&place) {
                continue;
            }
            f.last = Some(place.clone());
            let event = Event::default()
                .event("place")
                .json_data(&place)
                .unwrap_or_else(|_| Event::default().event("place"));
            return Some((Ok(event), f));
        }
    })
}
