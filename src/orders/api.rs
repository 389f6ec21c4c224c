//! The owner's order endpoints: `GET /api/orders/{order_sn}` (`pending` while the order
//! is on its way to MySQL), and `POST …/pay` and `…/cancel`.
//!
//! Paying or cancelling an order that is still pending works: the order is first written
//! to MySQL here (the same idempotent write the consumer makes; its own write later
//! changes nothing), so every change of state is one conditional `UPDATE` on the row, and
//! a pay racing a cancel ends in exactly one of the two.

use axum::extract::State;
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::breaker::Action;
use crate::domain::{BucketId, ItemId, OrderPlaced, OrderSn, UserId};
use crate::http::error::{ApiError, Conflict, Refusal};
use crate::http::extract::{ApiPath, AuthUser, OrderSeeker};
use crate::http::reply::ok;
use crate::http::request_id;
use crate::outbox::cleared_to_send;
use crate::state::{AppState, Shared};

use crate::delay_queue::Plan;

use super::ending::{self, Held};
use super::placed;
use super::repo::{self, CancelReason, OrderRow, OrderStatus, from_millis};

/// The order statuses a buyer sees: MySQL's three, and `pending`.
#[derive(Clone, Copy, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum OrderStatusShown {
    /// Won, not yet in MySQL.
    Pending,
    Unpaid,
    Paid,
    Cancelled,
}

impl From<OrderStatus> for OrderStatusShown {
    fn from(status: OrderStatus) -> Self {
        match status {
            OrderStatus::Unpaid => OrderStatusShown::Unpaid,
            OrderStatus::Paid => OrderStatusShown::Paid,
            OrderStatus::Cancelled => OrderStatusShown::Cancelled,
        }
    }
}

/// An order as its owner sees it.
#[derive(Serialize, ToSchema)]
struct OrderView {
    order_sn: OrderSn,
    item_id: ItemId,
    user_id: UserId,
    status: OrderStatusShown,
    created_at: DateTime<Utc>,
    /// When an unpaid order is cancelled and its unit goes back on sale.
    pay_deadline: DateTime<Utc>,
}

/// The owner's order, its payment and cancel, and a buyer's order for an item.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_order))
        .routes(routes!(pay_order))
        .routes(routes!(cancel_order))
        .routes(routes!(my_order))
        .routes(routes!(my_orders))
}

/// The owner's order; another user's or an unknown one is `404`.
#[utoipa::path(
    get,
    path = "/api/orders/{order_sn}",
    tag = "orders",
    security(("user" = [])),
    params(("order_sn" = OrderSn, Path)),
    responses(
        (status = 200, description = "`ok`", body = OrderView),
        (status = 404, description = "`order_not_found`", body = Refusal),
    )
)]
async fn get_order(
    State(state): State<AppState>,
    AuthUser(user): AuthUser,
    ApiPath(order_sn): ApiPath<String>,
) -> Result<Response, ApiError> {
    let Shared {
        db, redis, keys, ..
    } = &*state;
    request_id::record_user(user, None);
    // Not even an order number: unknown, like any order that is not yours.
    let sn = OrderSn::parse(&order_sn).ok_or(ApiError::OrderNotFound)?;
    let pending = placed::pending(redis, keys, &sn).await?;
    let view = match pending {
        Some(order) => OrderView::pending(order),
        None => repo::find(db, &sn)
            .await?
            .ok_or(ApiError::OrderNotFound)?
            .into(),
    };
    if view.user_id != user {
        return Err(ApiError::OrderNotFound);
    }
    Ok(ok("ok", view))
}

#[utoipa::path(
    get,
    path = "/api/items/{item_id}/my-order",
    tag = "orders",
    summary = "The user's live or latest order of an item",
    security(("user" = [])),
    params(("item_id" = ItemId, Path)),
    responses(
        (status = 200, description = "`ok`: the order, `pending` included", body = OrderView),
        (status = 404, description = "`order_not_found`: the user has no order of this item", body = Refusal),
        (status = 429, description = "`rate_limited`", body = Refusal),
    )
)]
/// `GET /api/items/{item_id}/my-order`: the newest order the user holds of the item (the
/// buyer record in Redis names it; `pending` included), or else their latest one in MySQL
/// — so a buyer whose `202` was lost, and who hears `410` after the sell-out, finds it.
async fn my_order(
    State(state): State<AppState>,
    OrderSeeker(user): OrderSeeker,
    ApiPath(item): ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    request_id::record_user(user, Some(item));
    let orders = orders_of(&state, item, user, 1).await?;
    let view = orders.into_iter().next().ok_or(ApiError::OrderNotFound)?;
    Ok(ok("ok", view))
}

/// A buyer's orders of an item.
#[derive(Serialize, ToSchema)]
struct MyOrders {
    /// Newest first: live ones (`pending` included), then cancelled ones (at most
    /// [`MOST_LISTED`] in all).
    orders: Vec<OrderView>,
}

/// Orders `my-orders` lists at most.
const MOST_LISTED: u32 = 100;

#[utoipa::path(
    get,
    path = "/api/items/{item_id}/my-orders",
    tag = "orders",
    summary = "The user's orders of an item (items with more than one per buyer)",
    security(("user" = [])),
    params(("item_id" = ItemId, Path)),
    responses(
        (status = 200, description = "`ok`: the orders, live ones (`pending` included) first, newest first; empty when none", body = MyOrders),
        (status = 429, description = "`rate_limited`", body = Refusal),
    )
)]
/// `GET /api/items/{item_id}/my-orders`
async fn my_orders(
    State(state): State<AppState>,
    OrderSeeker(user): OrderSeeker,
    ApiPath(item): ApiPath<ItemId>,
) -> Result<Response, ApiError> {
    request_id::record_user(user, Some(item));
    let orders = orders_of(&state, item, user, MOST_LISTED).await?;
    Ok(ok("ok", MyOrders { orders }))
}

/// The user's orders of the item, live ones first (those the buyer record in Redis names
/// and still `pending` among them: a won order is in Redis or MySQL), newest first; at
/// most `most`.
async fn orders_of(
    state: &AppState,
    item: ItemId,
    user: UserId,
    most: u32,
) -> Result<Vec<OrderView>, ApiError> {
    let Shared {
        db,
        redis,
        keys,
        catalog,
        ..
    } = &**state;
    let buckets = catalog.get(item).await?.map_or(1, |c| c.record.buckets);
    let pending = async {
        let item_keys = keys.stock(BucketId::home(item, user, buckets));
        let mut views = Vec::new();
        for sn in placed::held_by(redis, &item_keys, user).await? {
            if let Some(order) = placed::pending(redis, keys, &sn).await? {
                views.push(OrderView::pending(order));
            }
        }
        Ok::<_, crate::store::RedisError>(views)
    }
    .await;
    let stored = repo::orders_of_user(db, item, user, most).await;
    let mut views = match (pending, stored) {
        // Redis cannot say whether an order is still on its way: MySQL may still know.
        (Err(e), Ok(rows)) if rows.is_empty() => return Err(ApiError::Redis(e)),
        (Err(_), Ok(rows)) => rows.into_iter().map(OrderView::from).collect(),
        (Ok(pending), stored) => {
            let rows = stored?;
            let mut views = pending;
            views.retain(|p| !rows.iter().any(|r| r.order_sn == p.order_sn));
            views.extend(rows.into_iter().map(OrderView::from));
            views
        }
        (Err(_), Err(e)) => return Err(e.into()),
    };
    views.retain(|view| view.user_id == user);
    views.sort_by_key(|view| (!view.is_live(), std::cmp::Reverse(view.created_at)));
    views.truncate(most as usize);
    Ok(views)
}

impl OrderView {
    /// Holding a unit: pending, unpaid or paid.
    fn is_live(&self) -> bool {
        self.status != OrderStatusShown::Cancelled
    }

    fn pending(order: OrderPlaced) -> Self {
        OrderView {
            order_sn: order.order_sn,
            item_id: order.item_id,
            user_id: order.user_id,
            status: OrderStatusShown::Pending,
            created_at: from_millis(order.created_at_ms),
            pay_deadline: from_millis(order.pay_deadline_ms),
        }
    }
}

impl From<OrderRow> for OrderView {
    fn from(row: OrderRow) -> Self {
        OrderView {
            user_id: row.user(),
            order_sn: row.order_sn,
            item_id: row.item_id,
            status: row.status.into(),
            created_at: row.created_at,
            pay_deadline: row.pay_deadline,
        }
    }
}

#[utoipa::path(
    post,
    path = "/api/orders/{order_sn}/pay",
    tag = "orders",
    summary = "Pay an order (harmless to repeat)",
    security(("user" = [])),
    params(("order_sn" = OrderSn, Path)),
    responses(
        (status = 200, description = "`paid`", body = OrderView),
        (status = 404, description = "`order_not_found`", body = Refusal),
        (status = 409, description = "`order_cancelled`: cancelled, or its pay deadline passed", body = Refusal),
        (status = 503, description = "`circuit_open` / `unavailable`", body = Refusal),
    )
)]
/// `POST /api/orders/{order_sn}/pay`: `200 paid` (again on a repeat); `409 order_cancelled`
/// for a cancelled order or one whose pay deadline has passed (which is then cancelled).
async fn pay_order(
    State(state): State<AppState>,
    AuthUser(user): AuthUser,
    ApiPath(order_sn): ApiPath<String>,
) -> Result<Response, ApiError> {
    let sn = order_change(&state, user, &order_sn)?;
    let db = &state.db;
    let paid_now = repo::pay(db, &sn, user).await?;
    let mut row = stored_order(&state, &sn, user).await?;
    // Not paid by the first try: the order was still pending (written to MySQL just now),
    // or its deadline passed.
    if !paid_now && row.status == OrderStatus::Unpaid {
        repo::pay(db, &sn, user).await?;
        row = stored_order(&state, &sn, user).await?;
    }
    match row.status {
        OrderStatus::Paid => {}
        OrderStatus::Cancelled => return Err(order_cancelled()),
        OrderStatus::Unpaid => {
            // Too late to pay: end it now rather than leave it to the scheduler.
            ending::cancel_overdue(
                db,
                &state.redis,
                &state.keys,
                &[sn.as_str()],
                CancelReason::Timeout,
            )
            .await?;
            return Err(order_cancelled());
        }
    }
    tracing::info!(order_sn = %sn, "order_paid");
    Ok(ok("paid", OrderView::from(row)))
}

#[utoipa::path(
    post,
    path = "/api/orders/{order_sn}/cancel",
    tag = "orders",
    summary = "Cancel an order: its unit goes back on sale at once (harmless to repeat)",
    security(("user" = [])),
    params(("order_sn" = OrderSn, Path)),
    responses(
        (status = 200, description = "`cancelled`", body = OrderView),
        (status = 404, description = "`order_not_found`", body = Refusal),
        (status = 409, description = "`order_paid`", body = Refusal),
        (status = 503, description = "`circuit_open` / `unavailable`", body = Refusal),
    )
)]
/// `POST /api/orders/{order_sn}/cancel`: `200 cancelled` (again on a repeat) with the unit
/// back on sale at once; `409 order_paid` for a paid order.
async fn cancel_order(
    State(state): State<AppState>,
    AuthUser(user): AuthUser,
    ApiPath(order_sn): ApiPath<String>,
) -> Result<Response, ApiError> {
    let sn = order_change(&state, user, &order_sn)?;
    let db = &state.db;
    // Unknown and other users' orders end here, before anything is recorded.
    let mut row = stored_order(&state, &sn, user).await?;
    let mut cancelled_now = false;
    let mut begun = None;
    if row.status == OrderStatus::Unpaid {
        begun = Some(ending::begin(&state.redis, &state.keys, &[&sn]).await?);
        cancelled_now = repo::cancel_own(db, &sn, user).await?;
        row = stored_order(&state, &sn, user).await?;
    }
    if cancelled_now {
        state.meters.cancelled("user", 1);
    }
    match row.status {
        OrderStatus::Cancelled => {}
        OrderStatus::Paid => {
            if let Some(begun) = &begun {
                // Paid in the meantime: nothing to return.
                ending::abandon(&state.redis, &state.keys, &[sn.as_str()], begun).await?;
            }
            return Err(ApiError::Conflict {
                code: Conflict::OrderPaid,
                detail: "the order is paid; it cannot be cancelled".into(),
            });
        }
        OrderStatus::Unpaid => {
            return Err(ApiError::Internal(anyhow::anyhow!(
                "order {sn} stayed unpaid through a cancel"
            )));
        }
    }
    // Also for a repeat: finishes a release that an earlier call did not get to.
    ending::release(&state.redis, &state.keys, &[Held::from(&row)]).await?;
    tracing::info!(order_sn = %sn, "order_cancelled");
    Ok(ok("cancelled", OrderView::from(row)))
}

/// The order number of a pay or cancel, if the breakers let order changes through.
fn order_change(state: &AppState, user: UserId, order_sn: &str) -> Result<OrderSn, ApiError> {
    request_id::record_user(user, None);
    let sn = OrderSn::parse(order_sn).ok_or(ApiError::OrderNotFound)?;
    state.breakers.admit(sn.item(), Action::OrderChange)?;
    Ok(sn)
}

fn order_cancelled() -> ApiError {
    ApiError::Conflict {
        code: Conflict::OrderCancelled,
        detail: "the order is cancelled (by its owner, or because its pay deadline passed)".into(),
    }
}

/// The user's order as MySQL has it, writing it there first if it is still pending in
/// Redis. Another user's or an unknown order: `order_not_found`.
async fn stored_order(state: &AppState, sn: &OrderSn, user: UserId) -> Result<OrderRow, ApiError> {
    let owned = |row: OrderRow| {
        if row.user() == user {
            Ok(row)
        } else {
            Err(ApiError::OrderNotFound)
        }
    };
    if let Some(row) = repo::find(&state.db, sn).await? {
        return owned(row);
    }
    let order = match placed::pending(&state.redis, &state.keys, sn).await? {
        Some(order) => order,
        // Written by the consumer between the two reads, or unknown.
        None => {
            let row = repo::find(&state.db, sn)
                .await?
                .ok_or(ApiError::OrderNotFound)?;
            return owned(row);
        }
    };
    if order.user_id != user {
        return Err(ApiError::OrderNotFound);
    }
    // Into MySQL only what a Redis failover cannot take back (as the relay does).
    let claim = [(sn, order.created_at_ms)];
    if !cleared_to_send(&state.redis, &state.keys, sn.bucket(), &claim).await? {
        return Err(ApiError::Unavailable(
            "the order is not yet safe on Redis's replicas; try again shortly".into(),
        ));
    }
    let orders = [order];
    placed::write(&state.db, &orders).await?;
    let plan = Plan::from_settings(&state.settings);
    placed::settle_in_redis(&state.redis, &state.keys, &plan, &orders).await?;
    repo::find(&state.db, sn)
        .await?
        .ok_or(ApiError::OrderNotFound)
}
