//! The owner's order endpoints: `GET /api/orders/{order_sn}` (`pending` while the order
//! is on its way to MySQL), `POST …/pay` and `…/cancel`, and a buyer's orders of an item;
//! the operations behind them are in `owner.rs`.

use axum::extract::State;
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::breaker::Action;
use crate::config::Payments;
use crate::domain::{ItemId, OrderSn, UserId};
use crate::http::error::{ApiError, Conflict, Refusal};
use crate::http::extract::{ApiPath, AuthUser, OrderSeeker};
use crate::http::reply::ok;
use crate::http::request_id;
use crate::state::AppState;

use super::owner::{Checkout, OrderError, OrderView, Owner};

impl From<OrderError> for ApiError {
    fn from(e: OrderError) -> Self {
        match e {
            OrderError::NotFound => ApiError::OrderNotFound,
            OrderError::Cancelled => ApiError::Conflict {
                code: Conflict::OrderCancelled,
                detail: "the order is cancelled (by its owner, or because its pay deadline passed)"
                    .into(),
            },
            OrderError::Paid => ApiError::Conflict {
                code: Conflict::OrderPaid,
                detail: "the order is paid".into(),
            },
            OrderError::NotYetSafe => ApiError::Unavailable(
                "the order is not yet safe on Redis's replicas; try again shortly".into(),
            ),
            OrderError::Store(e) => e.into(),
            OrderError::Internal(e) => ApiError::Internal(e),
        }
    }
}

/// The owner's order operations, over this instance's stores.
fn owner(state: &AppState) -> Owner<'_> {
    Owner {
        deps: &state.deps,
        catalog: &state.catalog,
    }
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
    request_id::record_user(user, None);
    // Not even an order number: unknown, like any order that is not yours.
    let sn = OrderSn::parse(&order_sn).ok_or(ApiError::OrderNotFound)?;
    Ok(ok("ok", owner(&state).order(&sn, user).await?))
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
    let orders = owner(&state).orders_of(item, user, 1).await?;
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
    let orders = owner(&state).orders_of(item, user, MOST_LISTED).await?;
    Ok(ok("ok", MyOrders { orders }))
}

#[utoipa::path(
    post,
    path = "/api/orders/{order_sn}/pay",
    tag = "orders",
    summary = "Checkout: what the storefront hands its payment provider (marks nothing paid)",
    security(("user" = [])),
    params(("order_sn" = OrderSn, Path)),
    responses(
        (status = 200, description = "`checkout`: the amount, currency, deadline and payment reference; the order is paid when the provider's signed event says so (`POST /api/payments/events`). Under `SECKILL_PAYMENTS=trust_buyer` (development only): `paid`, with the order", body = Checkout),
        (status = 404, description = "`order_not_found`", body = Refusal),
        (status = 409, description = "`order_paid`, or `order_cancelled`: cancelled, or its pay deadline passed", body = Refusal),
        (status = 503, description = "`circuit_open` / `unavailable`", body = Refusal),
    )
)]
/// `POST /api/orders/{order_sn}/pay`: `200 checkout` — what the storefront hands its
/// payment provider; `409 order_paid` / `order_cancelled` when it cannot be paid. Under
/// `SECKILL_PAYMENTS=trust_buyer`: `200 paid` (again on a repeat), as before payments came
/// by signed events.
async fn pay_order(
    State(state): State<AppState>,
    AuthUser(user): AuthUser,
    ApiPath(order_sn): ApiPath<String>,
) -> Result<Response, ApiError> {
    let sn = order_change(&state, user, &order_sn)?;
    let owner = owner(&state);
    match state.deps.settings.payments {
        Payments::Events => Ok(ok("checkout", owner.checkout(&sn, user).await?)),
        Payments::TrustBuyer => Ok(ok("paid", owner.pay(&sn, user).await?)),
    }
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
    Ok(ok("cancelled", owner(&state).cancel(&sn, user).await?))
}

/// The order number of a pay or cancel, if the breakers let order changes through.
fn order_change(state: &AppState, user: UserId, order_sn: &str) -> Result<OrderSn, ApiError> {
    request_id::record_user(user, None);
    let sn = OrderSn::parse(order_sn).ok_or(ApiError::OrderNotFound)?;
    state.breakers.admit(sn.item(), Action::OrderChange)?;
    Ok(sn)
}
