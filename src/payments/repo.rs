//! Payment events, the orders they change, and the event outbox in MySQL.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{MySql, Transaction};
use utoipa::ToSchema;

use crate::orders::repo::OrderStatus;
use crate::store::{Db, DbError, mysql_timed};

use super::event::PaymentEvent;

type Tx = Transaction<'static, MySql>;

/// What an event did, as its row keeps it: a repeat of its `event_id` is answered this.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Recorded {
    pub order_sn: String,
    pub outcome: String,
    pub answered: u16,
}

/// The event's row, if it was received before.
pub async fn recorded(db: &Db, event_id: &str) -> Result<Option<Recorded>, DbError> {
    mysql_timed(
        sqlx::query_as("SELECT order_sn, outcome, answered FROM payment_events WHERE event_id = ?")
            .bind(event_id)
            .fetch_optional(db),
    )
    .await
}

/// Records the event with a first outcome; `false` when its `event_id` is recorded
/// already (a repeat: the caller rolls back and answers from that row).
pub async fn insert(
    tx: &mut Tx,
    event: &PaymentEvent,
    outcome: &str,
    answered: u16,
) -> Result<bool, DbError> {
    let inserted = mysql_timed(
        sqlx::query(
            "INSERT INTO payment_events (event_id, type, order_sn, amount_cents, currency,
                                         occurred_at, provider_ref, outcome, answered)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&event.event_id)
        .bind(event.kind.as_str())
        .bind(&event.order_sn)
        .bind(event.amount_cents)
        .bind(&event.currency)
        .bind(crate::store::to_millis(event.occurred_at))
        .bind(&event.provider_ref)
        .bind(outcome)
        .bind(answered)
        .execute(&mut **tx),
    )
    .await;
    match inserted {
        Ok(_) => Ok(true),
        Err(DbError::Sql(sqlx::Error::Database(e))) if e.is_unique_violation() => Ok(false),
        Err(e) => Err(e),
    }
}

/// A held event's row, locked for applying it: when it arrived; `None` once applied (by
/// another scheduler).
pub async fn lock_held(tx: &mut Tx, event_id: &str) -> Result<Option<DateTime<Utc>>, DbError> {
    mysql_timed(
        sqlx::query_scalar(
            "SELECT received_at FROM payment_events
             WHERE event_id = ? AND outcome = 'held' FOR UPDATE",
        )
        .bind(event_id)
        .fetch_optional(&mut **tx),
    )
    .await
}

pub async fn set_outcome(
    tx: &mut Tx,
    event_id: &str,
    outcome: &str,
    answered: u16,
) -> Result<(), DbError> {
    mysql_timed(
        sqlx::query("UPDATE payment_events SET outcome = ?, answered = ? WHERE event_id = ?")
            .bind(outcome)
            .bind(answered)
            .bind(event_id)
            .execute(&mut **tx),
    )
    .await?;
    Ok(())
}

/// Events held for an order that was not yet in MySQL, oldest first, from after the row
/// `after`.
pub async fn held(db: &Db, after: u64, most: u32) -> Result<Vec<(u64, PaymentEvent)>, DbError> {
    let rows: Vec<HeldRow> = mysql_timed(
        sqlx::query_as(
            "SELECT id, event_id, type, order_sn, amount_cents, currency, occurred_at,
                    provider_ref
             FROM payment_events WHERE outcome = 'held' AND id > ? ORDER BY id LIMIT ?",
        )
        .bind(after)
        .bind(most)
        .fetch_all(db),
    )
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|row| Some((row.id, row.event()?)))
        .collect())
}

#[derive(sqlx::FromRow)]
struct HeldRow {
    id: u64,
    event_id: String,
    #[sqlx(rename = "type")]
    kind: String,
    order_sn: String,
    amount_cents: u64,
    currency: String,
    occurred_at: DateTime<Utc>,
    provider_ref: String,
}

impl HeldRow {
    fn event(&self) -> Option<PaymentEvent> {
        let kind = serde_json::from_value(serde_json::Value::String(self.kind.clone())).ok()?;
        Some(PaymentEvent {
            event_id: self.event_id.clone(),
            kind,
            order_sn: self.order_sn.clone(),
            amount_cents: self.amount_cents,
            currency: self.currency.clone(),
            occurred_at: self.occurred_at,
            provider_ref: self.provider_ref.clone(),
        })
    }
}

/// A charge owed back, as a refund finds it.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct OwedRow {
    pub event_id: String,
    pub outcome: String,
    pub amount_cents: u64,
    pub currency: String,
}

/// Whether a charge of this order owed back goes by the event's provider reference.
pub async fn owes_charge(tx: &mut Tx, event: &PaymentEvent) -> Result<bool, DbError> {
    let owed: Option<u64> = mysql_timed(
        sqlx::query_scalar(
            "SELECT id FROM payment_events
             WHERE provider_ref = ? AND order_sn = ? AND type = 'payment.succeeded'
               AND outcome IN ('refund_due', 'charged_twice', 'order_not_found',
                               'amount_mismatch')
               AND settled_at IS NULL
             LIMIT 1",
        )
        .bind(&event.provider_ref)
        .bind(&event.order_sn)
        .fetch_optional(&mut **tx),
    )
    .await?;
    Ok(owed.is_some())
}

/// The unsettled charge of this order owed back under the event's provider reference,
/// locked. A refund names its charge and its order: one naming another order settles
/// nothing (the order owed would stay `refund_due` off the list).
pub async fn owed_charge(tx: &mut Tx, event: &PaymentEvent) -> Result<Option<OwedRow>, DbError> {
    mysql_timed(
        sqlx::query_as(
            "SELECT event_id, outcome, amount_cents, currency FROM payment_events
             WHERE provider_ref = ? AND order_sn = ? AND type = 'payment.succeeded'
               AND outcome IN ('refund_due', 'charged_twice', 'order_not_found',
                               'amount_mismatch')
               AND settled_at IS NULL
             ORDER BY id LIMIT 1 FOR UPDATE",
        )
        .bind(&event.provider_ref)
        .bind(&event.order_sn)
        .fetch_optional(&mut **tx),
    )
    .await
}

pub async fn settle(tx: &mut Tx, event_id: &str) -> Result<(), DbError> {
    mysql_timed(
        sqlx::query("UPDATE payment_events SET settled_at = UTC_TIMESTAMP(3) WHERE event_id = ?")
            .bind(event_id)
            .execute(&mut **tx),
    )
    .await?;
    Ok(())
}

/// A charge owed back, as `GET /admin/payments/refunds-due` lists it.
#[derive(Clone, Debug, Serialize, ToSchema, sqlx::FromRow)]
pub struct OwedCharge {
    pub event_id: String,
    pub order_sn: String,
    /// `refund_due` (paid after its order was cancelled, no unit left for it),
    /// `charged_twice` (the order was paid by another charge), `order_not_found` (no such
    /// order), `amount_mismatch` (not the order's amount or currency).
    pub reason: String,
    pub amount_cents: u64,
    pub currency: String,
    pub provider_ref: String,
    pub received_at: DateTime<Utc>,
}

/// Charges owed back, oldest first.
pub async fn owed(db: &Db, most: u32) -> Result<Vec<OwedCharge>, DbError> {
    mysql_timed(
        sqlx::query_as(
            "SELECT event_id, order_sn, outcome AS reason, amount_cents, currency, provider_ref,
                    received_at
             FROM payment_events
             WHERE outcome IN ('refund_due', 'charged_twice', 'order_not_found',
                               'amount_mismatch')
               AND type = 'payment.succeeded' AND settled_at IS NULL
             ORDER BY id LIMIT ?",
        )
        .bind(most)
        .fetch_all(db),
    )
    .await
}

/// Whether another event told of this charge of the order before: `payment.succeeded`
/// (taken, whatever it did), or `payment.refunded` of at least this event's amount
/// (returned already, whole).
pub async fn charge_seen(tx: &mut Tx, event: &PaymentEvent, kind: &str) -> Result<bool, DbError> {
    let seen: Option<u64> = mysql_timed(
        sqlx::query_scalar(
            "SELECT id FROM payment_events
             WHERE order_sn = ? AND provider_ref = ? AND type = ? AND event_id <> ?
               AND outcome NOT IN ('amount_mismatch', 'partial_refund')
               AND (type = 'payment.succeeded' OR amount_cents >= ?)
             LIMIT 1",
        )
        .bind(&event.order_sn)
        .bind(&event.provider_ref)
        .bind(kind)
        .bind(&event.event_id)
        .bind(event.amount_cents)
        .fetch_optional(&mut **tx),
    )
    .await?;
    Ok(seen.is_some())
}

/// What earlier refunds of this charge of the order (`provider_ref`) returned that acted
/// on nothing yet, in the event's currency — parts (`partial_refund`), and refunds that
/// came before the charge was told of (`ignored`, `order_not_found`): refunds add up, so
/// the last of several parts completes the whole, and a charge returned in parts before
/// it was told of is returned already.
///
/// A plain read: callers hold the order's row, or the charge owed, locked first, so that
/// a refund of the same charge committed meanwhile is in what it reads.
pub async fn refunded_before(tx: &mut Tx, event: &PaymentEvent) -> Result<u64, DbError> {
    let before: Option<u64> = mysql_timed(
        sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(amount_cents), 0) AS UNSIGNED) FROM payment_events
             WHERE provider_ref = ? AND order_sn = ? AND type = 'payment.refunded'
               AND currency = ? AND event_id <> ?
               AND outcome IN ('partial_refund', 'ignored', 'order_not_found')",
        )
        .bind(&event.provider_ref)
        .bind(&event.order_sn)
        .bind(&event.currency)
        .bind(&event.event_id)
        .fetch_optional(&mut **tx),
    )
    .await?;
    Ok(before.unwrap_or(0))
}

/// The order as a payment event sees it, its row locked.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct LockedOrder {
    #[sqlx(try_from = "String")]
    pub status: OrderStatus,
    pub user_id: u64,
    pub item_id: u64,
    pub paid_ref: Option<String>,
    pub cancel_reason: Option<String>,
    /// Its deadline had passed when the event came, by MySQL's clock (as the deadline's
    /// cancel judges it).
    pub overdue: bool,
    /// When the event was judged to have come, by MySQL's clock.
    pub judged_at: DateTime<Utc>,
}

/// The order, locked; `overdue` judged at `arrived` (when its event came: a held one came
/// before it is applied), or now.
pub async fn lock_order(
    tx: &mut Tx,
    sn: &str,
    arrived: Option<DateTime<Utc>>,
) -> Result<Option<LockedOrder>, DbError> {
    mysql_timed(
        sqlx::query_as(
            "SELECT status, user_id, item_id, paid_ref, cancel_reason,
                    pay_deadline <= COALESCE(?, UTC_TIMESTAMP(3)) AS overdue,
                    COALESCE(?, UTC_TIMESTAMP(3)) AS judged_at
             FROM orders WHERE order_sn = ? FOR UPDATE",
        )
        .bind(arrived)
        .bind(arrived)
        .bind(sn)
        .fetch_optional(&mut **tx),
    )
    .await
}

/// `unpaid` → `paid` by the charge `paid_ref`.
pub async fn pay(tx: &mut Tx, sn: &str, paid_ref: &str) -> Result<(), DbError> {
    mysql_timed(
        sqlx::query(
            "UPDATE orders SET status = 'paid', paid_at = UTC_TIMESTAMP(3), paid_ref = ?
             WHERE order_sn = ? AND status = 'unpaid'",
        )
        .bind(paid_ref)
        .bind(sn)
        .execute(&mut **tx),
    )
    .await?;
    Ok(())
}

/// `cancelled` → `paid` in the buyer's place `slot` (revive.lua gave it a unit).
pub async fn revive(tx: &mut Tx, sn: &str, slot: u8, paid_ref: &str) -> Result<(), DbError> {
    mysql_timed(
        sqlx::query(
            "UPDATE orders SET status = 'paid', paid_at = UTC_TIMESTAMP(3), paid_ref = ?,
                               slot = ?, lapsed_at = updated_at, revived_at = UTC_TIMESTAMP(3),
                               cancel_reason = NULL
             WHERE order_sn = ? AND status = 'cancelled'",
        )
        .bind(paid_ref)
        .bind(slot)
        .bind(sn)
        .execute(&mut **tx),
    )
    .await?;
    Ok(())
}

/// → `refund_due`. An order that was cancelled keeps its last change's time (when its
/// unit went back: the contract's §7 is judged from it); one that held its unit until now
/// gets now.
pub async fn owe(tx: &mut Tx, sn: &str, was: OrderStatus) -> Result<(), DbError> {
    let query = if was == OrderStatus::Cancelled {
        "UPDATE orders SET status = 'refund_due', updated_at = updated_at WHERE order_sn = ?"
    } else {
        "UPDATE orders SET status = 'refund_due' WHERE order_sn = ?"
    };
    mysql_timed(sqlx::query(query).bind(sn).execute(&mut **tx)).await?;
    Ok(())
}

/// → `refunded`: as [`owe`], an order owed back keeps the time its unit went back.
pub async fn refund(tx: &mut Tx, sn: &str, was: OrderStatus) -> Result<(), DbError> {
    let query = if was == OrderStatus::Paid {
        "UPDATE orders SET status = 'refunded' WHERE order_sn = ?"
    } else {
        "UPDATE orders SET status = 'refunded', updated_at = updated_at WHERE order_sn = ?"
    };
    mysql_timed(sqlx::query(query).bind(sn).execute(&mut **tx)).await?;
    Ok(())
}

/// An event for other services, sent by the scheduler once this transaction commits.
pub async fn enqueue(
    tx: &mut Tx,
    routing_key: &str,
    message_id: &str,
    body: &str,
) -> Result<(), DbError> {
    mysql_timed(
        sqlx::query("INSERT INTO event_outbox (routing_key, message_id, body) VALUES (?, ?, ?)")
            .bind(routing_key)
            .bind(message_id)
            .bind(body)
            .execute(&mut **tx),
    )
    .await?;
    Ok(())
}

/// An event waiting in the outbox.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Queued {
    pub id: u64,
    pub routing_key: String,
    pub message_id: String,
    pub body: String,
}

pub async fn queued(db: &Db, most: u32) -> Result<Vec<Queued>, DbError> {
    mysql_timed(
        sqlx::query_as(
            "SELECT id, routing_key, message_id, body FROM event_outbox ORDER BY id LIMIT ?",
        )
        .bind(most)
        .fetch_all(db),
    )
    .await
}

pub async fn sent(db: &Db, ids: &[u64]) -> Result<(), DbError> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut query = sqlx::QueryBuilder::new("DELETE FROM event_outbox WHERE id IN (");
    let mut list = query.separated(", ");
    for id in ids {
        list.push_bind(*id);
    }
    query.push(")");
    mysql_timed(query.build().execute(db)).await?;
    Ok(())
}
