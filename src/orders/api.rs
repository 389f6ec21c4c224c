//! `GET /api/orders/{order_sn}`: the owner's view of an order, `pending` while it is on
//! its way to MySQL.

use axum::extract::State;
use axum::response::Response;
use chrono::{DateTime, Utc};
use redis::AsyncCommands;
use serde::Serialize;

use crate::app::AppState;
use crate::domain::{ItemId, OrderPlaced, OrderSn, UserId};
use crate::error::ApiError;
use crate::http::extract::{ApiPath, AuthUser};
use crate::http::reply::ok;
use crate::http::request_id;
use crate::store::{RedisError, redis_timed};

use super::repo::{self, OrderStatus, from_millis};

#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
enum ShownStatus {
    Pending,
    #[serde(untagged)]
    Stored(OrderStatus),
}

#[derive(Serialize)]
struct OrderView {
    order_sn: OrderSn,
    item_id: ItemId,
    user_id: UserId,
    status: ShownStatus,
    created_at: DateTime<Utc>,
    pay_deadline: DateTime<Utc>,
}

pub async fn get_order(
    State(AppState {
        db, redis, keys, ..
    }): State<AppState>,
    AuthUser(user): AuthUser,
    ApiPath(order_sn): ApiPath<String>,
) -> Result<Response, ApiError> {
    request_id::record_user(user, None);
    // Not even an order number: unknown, like any order that is not yours.
    let sn = OrderSn::parse(&order_sn).ok_or(ApiError::OrderNotFound)?;
    // Redis first, MySQL second: the consumer clears `pending` only after its commit, so
    // an order moving between them is seen in one or the other, never in neither.
    let pending: Option<String> = {
        let mut conn = redis.hot.clone();
        redis_timed(conn.hget(keys.pending(sn.item()), sn.as_str())).await?
    };
    let view = match pending {
        Some(json) => {
            let order: OrderPlaced = serde_json::from_str(&json)
                .map_err(|e| RedisError::Unexpected(format!("pending order JSON: {e}")))?;
            OrderView {
                order_sn: order.order_sn,
                item_id: order.item_id,
                user_id: order.user_id,
                status: ShownStatus::Pending,
                created_at: from_millis(order.created_at_ms),
                pay_deadline: from_millis(order.pay_deadline_ms),
            }
        }
        None => {
            let row = repo::find(&db, &sn).await?.ok_or(ApiError::OrderNotFound)?;
            OrderView {
                user_id: row.user(),
                order_sn: row.order_sn,
                item_id: row.item_id,
                status: ShownStatus::Stored(row.status),
                created_at: row.created_at,
                pay_deadline: row.pay_deadline,
            }
        }
    };
    if view.user_id != user {
        return Err(ApiError::OrderNotFound);
    }
    Ok(ok("ok", view))
}
