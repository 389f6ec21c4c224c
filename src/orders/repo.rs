//! Orders in MySQL.

use chrono::{DateTime, TimeZone, Utc};
use serde::Serialize;
use sqlx::QueryBuilder;

use crate::domain::{ItemId, OrderPlaced, OrderSn, UserId};
use crate::store::{Db, DbError, mysql_timed};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, sqlx::Type)]
#[serde(rename_all = "lowercase")]
#[sqlx(rename_all = "lowercase")]
pub enum OrderStatus {
    Unpaid,
    Paid,
    Cancelled,
}

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct OrderRow {
    #[sqlx(try_from = "String")]
    pub order_sn: OrderSn,
    #[sqlx(try_from = "u64")]
    pub item_id: ItemId,
    pub user_id: u64,
    pub status: OrderStatus,
    pub created_at: DateTime<Utc>,
    pub pay_deadline: DateTime<Utc>,
}

pub async fn find(db: &Db, sn: &OrderSn) -> Result<Option<OrderRow>, DbError> {
    mysql_timed(
        sqlx::query_as(
            "SELECT order_sn, item_id, user_id, status, created_at, pay_deadline
             FROM orders WHERE order_sn = ?",
        )
        .bind(sn.as_str())
        .fetch_optional(db),
    )
    .await
}

/// Orders of an item by status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StatusCounts {
    pub unpaid: u64,
    pub paid: u64,
    pub cancelled: u64,
}

pub async fn count_by_status(db: &Db, item: ItemId) -> Result<StatusCounts, DbError> {
    let rows: Vec<(OrderStatus, i64)> = mysql_timed(
        sqlx::query_as("SELECT status, COUNT(*) FROM orders WHERE item_id = ? GROUP BY status")
            .bind(item.get())
            .fetch_all(db),
    )
    .await?;
    let mut counts = StatusCounts::default();
    for (status, n) in rows {
        let n = u64::try_from(n).unwrap_or(0);
        match status {
            OrderStatus::Unpaid => counts.unpaid = n,
            OrderStatus::Paid => counts.paid = n,
            OrderStatus::Cancelled => counts.cancelled = n,
        }
    }
    Ok(counts)
}

/// Users holding a unit of the item (unpaid or paid) and their order numbers.
pub async fn live_holders(db: &Db, item: ItemId) -> Result<Vec<(u64, String)>, DbError> {
    mysql_timed(
        sqlx::query_as(
            "SELECT user_id, order_sn FROM orders
             WHERE item_id = ? AND status IN ('unpaid', 'paid')",
        )
        .bind(item.get())
        .fetch_all(db),
    )
    .await
}

/// Which of these order numbers MySQL has.
pub async fn existing(db: &Db, sns: &[&str]) -> Result<Vec<String>, DbError> {
    if sns.is_empty() {
        return Ok(Vec::new());
    }
    let mut query = QueryBuilder::new("SELECT order_sn FROM orders WHERE order_sn IN (");
    let mut list = query.separated(", ");
    for sn in sns {
        list.push_bind(*sn);
    }
    query.push(")");
    mysql_timed(query.build_query_scalar().fetch_all(db)).await
}

/// Inserts a batch in one statement, idempotently: an order already there (a message
/// delivered twice) is left as it is. Returns how many rows were new.
///
/// `ON DUPLICATE KEY UPDATE order_sn = order_sn` rather than `INSERT IGNORE`, which would
/// also turn bad data into warnings. It fires on either unique key, so a second *live*
/// order of the same user and item is not inserted either: the consumer then records it
/// with [`OrderStatus::Cancelled`] (possible only if Redis lost its buyer records), so that
/// every `202` still has its row and nobody holds two units.
pub async fn insert_batch<'a>(
    db: &Db,
    orders: impl IntoIterator<Item = &'a OrderPlaced>,
    status: OrderStatus,
) -> Result<u64, sqlx::Error> {
    let mut orders = orders.into_iter().peekable();
    if orders.peek().is_none() {
        return Ok(0);
    }
    let mut query = QueryBuilder::new(
        "INSERT INTO orders (order_sn, item_id, user_id, status, created_at, pay_deadline) ",
    );
    query.push_values(orders, |mut row, order| {
        row.push_bind(order.order_sn.as_str())
            .push_bind(order.item_id.get())
            .push_bind(order.user_id.get())
            .push_bind(status)
            .push_bind(from_millis(order.created_at_ms))
            .push_bind(from_millis(order.pay_deadline_ms));
    });
    query.push(" ON DUPLICATE KEY UPDATE order_sn = order_sn");
    Ok(query.build().execute(db).await?.rows_affected())
}

pub fn from_millis(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
}

impl OrderRow {
    pub fn user(&self) -> UserId {
        UserId::new(self.user_id)
    }
}
