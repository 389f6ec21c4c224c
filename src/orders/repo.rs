//! Orders in MySQL.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use serde::Serialize;
use sqlx::QueryBuilder;

use crate::domain::{ItemId, OrderPlaced, OrderSn, UserId};
use crate::store::{Db, DbError, mysql_timed, mysql_timed_within, retrying_deadlocks};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OrderStatus {
    Unpaid,
    Paid,
    Cancelled,
    /// Money taken for an order that cannot have its unit (a late payment): owed back.
    RefundDue,
    /// Its payment returned by the provider.
    Refunded,
}

/// Read and written as text: how MariaDB describes an ENUM column varies with its
/// collation and flags, and sqlx's derived enum type insists on one description.
impl OrderStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Unpaid => "unpaid",
            OrderStatus::Paid => "paid",
            OrderStatus::Cancelled => "cancelled",
            OrderStatus::RefundDue => "refund_due",
            OrderStatus::Refunded => "refunded",
        }
    }

    /// Whether an order of this status holds a unit (invariant 4 counts it): unpaid or
    /// paid. A cancelled, `refund_due` or refunded order's unit went back.
    pub fn holds_unit(self) -> bool {
        matches!(self, OrderStatus::Unpaid | OrderStatus::Paid)
    }
}

impl TryFrom<String> for OrderStatus {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        match s.as_str() {
            "unpaid" => Ok(OrderStatus::Unpaid),
            "paid" => Ok(OrderStatus::Paid),
            "cancelled" => Ok(OrderStatus::Cancelled),
            "refund_due" => Ok(OrderStatus::RefundDue),
            "refunded" => Ok(OrderStatus::Refunded),
            _ => Err(format!("unknown order status {s:?}")),
        }
    }
}

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct OrderRow {
    #[sqlx(try_from = "String")]
    pub order_sn: OrderSn,
    #[sqlx(try_from = "u64")]
    pub item_id: ItemId,
    pub user_id: u64,
    #[sqlx(try_from = "String")]
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

/// The user's orders of the item: those holding a unit first, newest first; at most `most`.
pub async fn orders_of_user(
    db: &Db,
    item: ItemId,
    user: UserId,
    most: u32,
) -> Result<Vec<OrderRow>, DbError> {
    mysql_timed(
        sqlx::query_as(
            "SELECT order_sn, item_id, user_id, status, created_at, pay_deadline
             FROM orders WHERE user_id = ? AND item_id = ?
             ORDER BY status NOT IN ('unpaid', 'paid'), created_at DESC LIMIT ?",
        )
        .bind(user.get())
        .bind(item.get())
        .bind(most)
        .fetch_all(db),
    )
    .await
}

/// The users with an order of the item, in any state.
pub async fn users_with_orders(db: &Db, item: ItemId) -> Result<Vec<u64>, DbError> {
    mysql_timed(
        sqlx::query_scalar("SELECT DISTINCT user_id FROM orders WHERE item_id = ?")
            .bind(item.get())
            .fetch_all(db),
    )
    .await
}

/// Many orders by number, in one query (absent ones are simply not in the answer).
pub async fn find_many(db: &Db, sns: &[&str]) -> Result<Vec<OrderRow>, DbError> {
    if sns.is_empty() {
        return Ok(Vec::new());
    }
    mysql_timed(rows_of(sns).build_query_as().fetch_all(db)).await
}

/// The rows of these orders, as [`OrderRow`] reads them.
fn rows_of(sns: &[&str]) -> QueryBuilder<sqlx::MySql> {
    in_list(
        "SELECT order_sn, item_id, user_id, status, created_at, pay_deadline
         FROM orders WHERE order_sn IN (",
        sns,
    )
}

/// These orders' rows, locked (`FOR UPDATE`) until `tx` ends: a late payment reviving one
/// holds its lock from before it takes a unit until MySQL says `paid`
/// (`src/payments/apply.rs`), so what a locked read says stays true while it is acted on.
pub async fn lock_many(
    tx: &mut sqlx::Transaction<'static, sqlx::MySql>,
    sns: &[&str],
    wait: Wait,
) -> Result<Vec<OrderRow>, DbError> {
    if sns.is_empty() {
        return Ok(Vec::new());
    }
    let mut query = rows_of(sns);
    query.push(match wait {
        Wait::Yes => " FOR UPDATE",
        Wait::No => " FOR UPDATE NOWAIT",
    });
    mysql_timed(query.build_query_as().fetch_all(&mut **tx)).await
}

/// Whether a locked read waits for rows another transaction holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Within the store time limit.
    Yes,
    /// An error at once (`NOWAIT`).
    No,
}

/// Why an order was cancelled (the `cancel_reason` column).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelReason {
    /// The owner cancelled it.
    User,
    /// Its pay deadline passed.
    Timeout,
    /// An end-of-sale reconciliation found it could no longer be paid.
    Reconcile,
    /// MySQL refused it as a second live order of its user for the item: written
    /// cancelled at once ([`insert_batch`]).
    Refused,
}

impl CancelReason {
    pub fn as_str(self) -> &'static str {
        match self {
            CancelReason::User => "user",
            CancelReason::Timeout => "timeout",
            CancelReason::Reconcile => "reconcile",
            CancelReason::Refused => "refused",
        }
    }
}

/// `unpaid` → `paid`, only for the owner and only before the deadline. Returns whether
/// this call paid it (a conditional update: racing a cancel, exactly one of them wins).
/// Run again while MySQL picks it as a deadlock's victim, or Galera fails its commit's
/// certification (both 1213): it was rolled back whole, and the condition makes running
/// it again harmless.
pub async fn pay(db: &Db, sn: &OrderSn, user: UserId) -> Result<bool, DbError> {
    retrying_deadlocks("order pay", || async {
        let done = mysql_timed(
            sqlx::query(
                "UPDATE orders SET status = 'paid', paid_at = UTC_TIMESTAMP(3)
                 WHERE order_sn = ? AND user_id = ? AND status = 'unpaid'
                   AND pay_deadline > UTC_TIMESTAMP(3)",
            )
            .bind(sn.as_str())
            .bind(user.get())
            .execute(db),
        )
        .await?;
        Ok(done.rows_affected() == 1)
    })
    .await
}

/// `unpaid` → `cancelled` for the owner. Returns whether this call cancelled it. Run
/// again after a deadlock or a certification failure, as [`pay`].
pub async fn cancel_own(db: &Db, sn: &OrderSn, user: UserId) -> Result<bool, DbError> {
    retrying_deadlocks("order cancel", || async {
        let done = mysql_timed(
            sqlx::query(
                "UPDATE orders SET status = 'cancelled', cancel_reason = ?
                 WHERE order_sn = ? AND user_id = ? AND status = 'unpaid'",
            )
            .bind(CancelReason::User.as_str())
            .bind(sn.as_str())
            .bind(user.get())
            .execute(db),
        )
        .await?;
        Ok(done.rows_affected() == 1)
    })
    .await
}

/// `unpaid` → `cancelled` for those of these orders whose deadline has passed (by
/// MySQL's clock). Returns how many this call cancelled. Run again after a deadlock or a
/// certification failure, as [`pay`] (a late pay cancels through here).
pub async fn set_overdue_cancelled(
    db: &Db,
    sns: &[&str],
    reason: CancelReason,
) -> Result<u64, DbError> {
    if sns.is_empty() {
        return Ok(0);
    }
    retrying_deadlocks("overdue orders' cancel", || async {
        let mut query =
            QueryBuilder::new("UPDATE orders SET status = 'cancelled', cancel_reason = ");
        query.push_bind(reason.as_str()).push(
            " WHERE status = 'unpaid' AND pay_deadline <= UTC_TIMESTAMP(3) AND order_sn IN (",
        );
        let mut list = query.separated(", ");
        for sn in sns {
            list.push_bind(*sn);
        }
        query.push(")");
        let done = mysql_timed(query.build().execute(db)).await?;
        Ok(done.rows_affected())
    })
    .await
}

/// An item's unpaid orders whose deadline passed at least `grace` ago, oldest first (by
/// `idx_orders_item_status`).
pub async fn overdue_unpaid(
    db: &Db,
    item: ItemId,
    grace: std::time::Duration,
    limit: u32,
) -> Result<Vec<OrderRow>, DbError> {
    mysql_timed(
        sqlx::query_as(
            "SELECT order_sn, item_id, user_id, status, created_at, pay_deadline
             FROM orders
             WHERE item_id = ? AND status = 'unpaid'
               AND pay_deadline <= UTC_TIMESTAMP(3) - INTERVAL ? MICROSECOND
             ORDER BY pay_deadline LIMIT ?",
        )
        .bind(item.get())
        .bind(grace.as_micros() as u64)
        .bind(limit)
        .fetch_all(db),
    )
    .await
}

/// Items with an unpaid order whose deadline is more than `grace` behind: one probe per
/// item that has orders at all (a loose scan of `idx_orders_item_status`), not per item.
pub async fn items_with_overdue(
    db: &Db,
    grace: std::time::Duration,
) -> Result<Vec<ItemId>, DbError> {
    let ids: Vec<u64> = mysql_timed(
        sqlx::query_scalar(
            "SELECT item_id FROM orders WHERE status = 'unpaid' GROUP BY item_id
             HAVING MIN(pay_deadline) <= UTC_TIMESTAMP(3) - INTERVAL ? MICROSECOND",
        )
        .bind(grace.as_micros() as u64)
        .fetch_all(db),
    )
    .await?;
    Ok(ids.into_iter().filter_map(ItemId::new).collect())
}

/// Which of these items have any order at all (of any status).
pub async fn items_having_orders<'e>(
    db: impl sqlx::MySqlExecutor<'e>,
    items: &[ItemId],
) -> Result<Vec<ItemId>, DbError> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let mut query = QueryBuilder::new("SELECT DISTINCT item_id FROM orders WHERE item_id IN (");
    let mut list = query.separated(", ");
    for item in items {
        list.push_bind(item.get());
    }
    query.push(")");
    let ids: Vec<u64> = mysql_timed(query.build_query_scalar().fetch_all(db)).await?;
    Ok(ids.into_iter().filter_map(ItemId::new).collect())
}

/// Orders of an item by status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct StatusCounts {
    pub unpaid: u64,
    pub paid: u64,
    pub cancelled: u64,
    /// Holding no unit: money owed back (a late payment), and money returned.
    pub refund_due: u64,
    pub refunded: u64,
}

impl StatusCounts {
    /// Every order of the item, whatever its status.
    pub fn rows(&self) -> u64 {
        self.unpaid + self.paid + self.cancelled + self.refund_due + self.refunded
    }
}

pub async fn count_by_status(db: &Db, item: ItemId) -> Result<StatusCounts, DbError> {
    let (unpaid, paid, cancelled, refund_due, refunded): (i64, i64, i64, i64, i64) = mysql_timed(
        sqlx::query_as(
            "SELECT COUNT(CASE WHEN status = 'unpaid' THEN 1 END),
                    COUNT(CASE WHEN status = 'paid' THEN 1 END),
                    COUNT(CASE WHEN status = 'cancelled' THEN 1 END),
                    COUNT(CASE WHEN status = 'refund_due' THEN 1 END),
                    COUNT(CASE WHEN status = 'refunded' THEN 1 END)
             FROM orders WHERE item_id = ?",
        )
        .bind(item.get())
        .fetch_one(db),
    )
    .await?;
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(StatusCounts {
        unpaid: count(unpaid),
        paid: count(paid),
        cancelled: count(cancelled),
        refund_due: count(refund_due),
        refunded: count(refunded),
    })
}

/// An item's unpaid orders: how many, and the latest pay deadline among them (what a
/// waiting room tells those waiting: when the units they hold are known).
pub async fn unpaid_outlook(
    db: &Db,
    item: ItemId,
) -> Result<(u64, Option<DateTime<Utc>>), DbError> {
    let (count, latest): (i64, Option<DateTime<Utc>>) = mysql_timed(
        sqlx::query_as(
            "SELECT COUNT(*), MAX(pay_deadline) FROM orders
              WHERE item_id = ? AND status = 'unpaid'",
        )
        .bind(item.get())
        .fetch_one(db),
    )
    .await?;
    Ok((u64::try_from(count).unwrap_or(0), latest))
}

/// What an item's orders held over time, as MySQL's rows tell it (the contract's §7 judged
/// over the history, not only its end): each order held a unit from its win (`created_at`)
/// until its cancel (a cancelled row's last change, `updated_at`).
#[derive(Clone, Debug, Default)]
pub struct HeldOverTime {
    /// The most orders that held a unit at one moment.
    pub most_at_once: u64,
    /// Users who at one moment held more orders than the limit asked about (the first few).
    pub over_limit: Vec<u64>,
    /// Orders written `cancelled` at once (a second live order of a user that MySQL
    /// refused): a `202` among them is a lost one.
    pub written_cancelled: Vec<String>,
}

/// Users over the limit a report names, at most.
const OVER_LIMIT_SHOWN: u32 = 5;

/// [`HeldOverTime`] of an item, for a buyer limit of `per_user`: each row an edge up at its
/// win and, for a cancelled one, an edge down at its cancel, summed in time order (a down
/// before an up at one instant). A cancel's time is MySQL's clock and a win's its API
/// host's (kept to Redis's): a cancel is taken 100 ms early, so that the clocks'
/// disagreement never shows as a unit held twice — a real oversell lasts until someone
/// cancels, seconds at least.
pub async fn held_over_time(db: &Db, item: ItemId, per_user: u8) -> Result<HeldOverTime, DbError> {
    // An order revived by a late payment held no unit between its cancel (`lapsed_at`)
    // and its revival; one that holds none now stopped at its last change (a late payment
    // owed back keeps its cancel's time: src/payments/apply.rs).
    const EDGES: &str = "SELECT user_id, created_at AS t, 1 AS d FROM orders WHERE item_id = ?
         UNION ALL
         SELECT user_id, GREATEST(created_at, updated_at - INTERVAL 100000 MICROSECOND), -1
           FROM orders WHERE item_id = ? AND status IN ('cancelled', 'refund_due', 'refunded')
         UNION ALL
         SELECT user_id, GREATEST(created_at, lapsed_at - INTERVAL 100000 MICROSECOND), -1
           FROM orders WHERE item_id = ? AND lapsed_at IS NOT NULL
         UNION ALL
         SELECT user_id, revived_at, 1 FROM orders WHERE item_id = ? AND revived_at IS NOT NULL";
    let most: Option<i64> = mysql_timed(
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT CAST(MAX(held) AS SIGNED) FROM (
               SELECT SUM(d) OVER (ORDER BY t, d ROWS UNBOUNDED PRECEDING) AS held
                 FROM ({EDGES}) edges) running"
        )))
        .bind(item.get())
        .bind(item.get())
        .bind(item.get())
        .bind(item.get())
        .fetch_one(db),
    )
    .await?;
    let over_limit: Vec<u64> = mysql_timed(
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT user_id FROM (
               SELECT user_id, SUM(d) OVER (PARTITION BY user_id ORDER BY t, d
                                            ROWS UNBOUNDED PRECEDING) AS held
                 FROM ({EDGES}) edges) running
              GROUP BY user_id HAVING MAX(held) > ? ORDER BY user_id LIMIT ?"
        )))
        .bind(item.get())
        .bind(item.get())
        .bind(item.get())
        .bind(item.get())
        .bind(per_user)
        .bind(OVER_LIMIT_SHOWN)
        .fetch_all(db),
    )
    .await?;
    let written_cancelled = mysql_timed(
        sqlx::query_scalar(
            "SELECT order_sn FROM orders
              WHERE item_id = ? AND status = 'cancelled' AND cancel_reason = 'refused'",
        )
        .bind(item.get())
        .fetch_all(db),
    )
    .await?;
    Ok(HeldOverTime {
        // A running sum never ends below zero: its last value counts the live orders.
        most_at_once: most.unwrap_or(0).max(0).unsigned_abs(),
        over_limit,
        written_cancelled,
    })
}

/// An order holding a unit, as read for a warm-up or a check: its number as stored (not
/// parsed, so one malformed row cannot hide the others).
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct LiveOrder {
    pub order_sn: String,
    pub user_id: u64,
    /// Its place among the buyer's live orders of the item.
    pub slot: u8,
    pub unpaid: bool,
    pub created_at: DateTime<Utc>,
    pub pay_deadline: DateTime<Utc>,
}

/// The item's orders that hold a unit (unpaid or paid).
pub async fn live_orders(db: &Db, item: ItemId) -> Result<Vec<LiveOrder>, DbError> {
    mysql_timed(
        sqlx::query_as(
            "SELECT order_sn, user_id, slot, status = 'unpaid' AS unpaid, created_at, pay_deadline
             FROM orders WHERE item_id = ? AND status IN ('unpaid', 'paid')",
        )
        .bind(item.get())
        .fetch_all(db),
    )
    .await
}

/// Returns once the changes of these orders under way have committed: a locking read of
/// their rows waits for each row a change holds — a late payment holds its order's row
/// while it takes the unit in Redis, and commits `paid` after — and keeps no lock (one
/// statement). Locked by the order's number: a change of status rewrites the item's index
/// entries, so a shared lock on those would deadlock with the very change it waits for. A
/// deadlock with a cancel locking several rows is read again.
pub async fn await_changes(db: &Db, sns: &[String]) -> Result<(), DbError> {
    // A payment's whole budget (`budget::payment`: its replicas' `WAIT` and a loan between
    // buckets happen under its row lock), and a little more.
    const CHANGES_WITHIN: Duration = Duration::from_secs(10);
    for chunk in sns.chunks(500) {
        let chunk: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let mut tries = 0;
        loop {
            let mut query = in_list("SELECT user_id FROM orders WHERE order_sn IN (", &chunk);
            query.push(" LOCK IN SHARE MODE");
            match mysql_timed_within(CHANGES_WITHIN, query.build().execute(db)).await {
                Ok(_) => break,
                Err(e) if e.is_deadlock() && tries < 3 => tries += 1,
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Which of these order numbers MySQL has.
pub async fn existing(
    db: impl sqlx::MySqlExecutor<'_>,
    sns: &[&str],
) -> Result<Vec<String>, DbError> {
    if sns.is_empty() {
        return Ok(Vec::new());
    }
    let mut query = in_list("SELECT order_sn FROM orders WHERE order_sn IN (", sns);
    mysql_timed(query.build_query_scalar().fetch_all(db)).await
}

/// How many of these order numbers MySQL has (one number back instead of the list).
pub async fn count_existing(
    db: impl sqlx::MySqlExecutor<'_>,
    sns: &[&str],
) -> Result<u64, DbError> {
    if sns.is_empty() {
        return Ok(0);
    }
    let mut query = in_list("SELECT COUNT(*) FROM orders WHERE order_sn IN (", sns);
    let count: i64 = mysql_timed(query.build_query_scalar().fetch_one(db)).await?;
    Ok(u64::try_from(count).unwrap_or(0))
}

fn in_list(head: &str, sns: &[&str]) -> QueryBuilder<sqlx::MySql> {
    let mut query = QueryBuilder::new(head);
    let mut list = query.separated(", ");
    for sn in sns {
        list.push_bind(*sn);
    }
    query.push(")");
    query
}

/// Inserts a batch in one statement, idempotently: an order already there (a message
/// delivered twice) is left as it is.
///
/// `ON DUPLICATE KEY UPDATE order_sn = order_sn` rather than `INSERT IGNORE`, which would
/// also turn bad data into warnings. It fires on either unique key, so a second *live*
/// order of the same user and item is not inserted either: the consumer then records it
/// with [`OrderStatus::Cancelled`] (possible only if Redis lost its buyer records), so that
/// every `202` still has its row and nobody holds two units.
pub async fn insert_batch<'a>(
    db: impl sqlx::MySqlExecutor<'_>,
    orders: impl IntoIterator<Item = &'a OrderPlaced>,
    status: OrderStatus,
) -> Result<(), sqlx::Error> {
    // Every order's times first: one MySQL cannot store is an error, not a row with a
    // 1970 (or zero) deadline.
    let rows = orders
        .into_iter()
        .map(|order| Ok((order, stored_times(order)?)))
        .collect::<Result<Vec<_>, String>>()
        .map_err(|e| sqlx::Error::Encode(e.into()))?;
    if rows.is_empty() {
        return Ok(());
    }
    // Written cancelled only when refused (see above), and then it says so.
    let reason = (status == OrderStatus::Cancelled).then_some(CancelReason::Refused.as_str());
    let mut query = QueryBuilder::new(
        "INSERT INTO orders (order_sn, item_id, user_id, slot, status, cancel_reason, created_at, pay_deadline) ",
    );
    query.push_values(rows, |mut row, (order, (created_at, pay_deadline))| {
        row.push_bind(order.order_sn.as_str())
            .push_bind(order.item_id.get())
            .push_bind(order.user_id.get())
            .push_bind(order.slot)
            .push_bind(status.as_str())
            .push_bind(reason)
            .push_bind(created_at)
            .push_bind(pay_deadline);
    });
    query.push(" ON DUPLICATE KEY UPDATE order_sn = order_sn");
    query.build().execute(db).await?;
    Ok(())
}

/// The order's creation and pay deadline as MySQL stores them; what is wrong (naming the
/// order) when it cannot (`OrderPlaced::out_of_range`).
fn stored_times(order: &OrderPlaced) -> Result<(DateTime<Utc>, DateTime<Utc>), String> {
    let wrong = |what: &dyn std::fmt::Display| format!("order {}: {what}", order.order_sn);
    if let Some(why) = order.out_of_range() {
        return Err(wrong(&why));
    }
    let created_at = from_millis(order.created_at_ms).map_err(|e| wrong(&e))?;
    let pay_deadline = from_millis(order.pay_deadline_ms).map_err(|e| wrong(&e))?;
    Ok((created_at, pay_deadline))
}

/// A time given in ms since the epoch, as orders carry them, that is no time a date can
/// hold.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0} ms since 1970 is not a time")]
pub struct NotATime(pub i64);

/// An order's time from its ms since the epoch; an error, not 1970, when it is none.
pub fn from_millis(ms: i64) -> Result<DateTime<Utc>, NotATime> {
    Utc.timestamp_millis_opt(ms).single().ok_or(NotATime(ms))
}

impl OrderRow {
    pub fn user(&self) -> UserId {
        UserId::new(self.user_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::BucketId;

    fn order(created_at_ms: i64, pay_deadline_ms: i64) -> OrderPlaced {
        let item = ItemId::new(3).unwrap();
        OrderPlaced {
            order_sn: OrderSn::generate(BucketId::whole(item), false),
            item_id: item,
            user_id: UserId::new(9),
            created_at_ms,
            pay_deadline_ms,
            slot: 0,
        }
    }

    #[test]
    fn a_bad_time_is_an_error_not_1970() {
        assert_eq!(from_millis(0).unwrap(), DateTime::<Utc>::UNIX_EPOCH);
        assert_eq!(
            from_millis(1_700_000_000_123).unwrap().timestamp_millis(),
            1_700_000_000_123
        );
        assert_eq!(from_millis(i64::MAX), Err(NotATime(i64::MAX)));
        assert!(
            NotATime(i64::MAX)
                .to_string()
                .contains("9223372036854775807"),
            "names the value"
        );
    }

    #[test]
    fn an_order_whose_times_mysql_cannot_store_is_refused_naming_it() {
        let good = order(1_700_000_000_000, 1_700_000_600_000);
        let (created_at, pay_deadline) = stored_times(&good).unwrap();
        assert_eq!(pay_deadline - created_at, chrono::Duration::minutes(10));
        let late = order(1_700_000_000_000, i64::MAX);
        let why = stored_times(&late).unwrap_err();
        assert!(
            why.starts_with(&format!("order {}", late.order_sn)),
            "{why}"
        );
        assert!(why.contains("pay_deadline_ms"), "{why}");
    }
}
