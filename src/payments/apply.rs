//! Applying a verified payment event: one MySQL transaction per event — the event
//! recorded (unique `event_id`; a repeat answers from its row), the order's row locked,
//! the rule applied, the outcome stored with the event.
//!
//! | event | order | what happens |
//! |---|---|---|
//! | succeeded | unpaid, in time | `paid` |
//! | succeeded | unpaid, deadline passed, not yet cancelled | `honour`: `paid` (it still holds its unit); `refund`: `refund_due`, its unit back |
//! | succeeded | cancelled | `honour`: a unit taken as a purchase would (`lua/revive.lua`) → `paid` (`revived`), else `refund_due`; `refund`: `refund_due` |
//! | succeeded | paid by this charge | `already_paid` |
//! | succeeded | paid by another charge, `refund_due`, `refunded` | `charged_twice`: owed back |
//! | refunded | paid by this charge, whole (with its parts before) | `refunded`, its unit back |
//! | refunded | adding up to less than the price | `partial_refund`: recorded, nothing changes |
//! | refunded | a charge owed back, whole (with its parts before) | `settled`: off the list (its `refund_due` order `refunded`) |
//! | refunded | no such order, no charge owed | `order_not_found` |
//! | failed | any | `noted`: the order waits for its deadline |
//!
//! A unit that goes back, or is taken, is recorded in the bucket's `ending` before MySQL
//! decides (as a cancel is: `orders/ending.rs`), so a process that dies in between leaves
//! it to the scheduler's cut-off sweep, which follows what MySQL says. A cancel still
//! giving the order's unit back, or a warm-up replacing the units, makes the event wait a
//! moment and try again (at most [`BUSY_TRIES`] times, then `503`: the provider sends it
//! again).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;

use crate::config::LatePayment;
use crate::deps::Deps;
use crate::domain::{BucketId, OrderSn, UserId};
use crate::items::repo as items;
use crate::items::transfer::{self, Lending};
use crate::keys::ItemKeys;
use crate::lua::REVIVE;
use crate::marks::{self, Work};
use crate::orders::ending::{self, Begun, Held};
use crate::orders::owner::{Landed, land};
use crate::orders::repo::OrderStatus;
use crate::store::{DbError, RedisError, StoreError, mysql_begin, mysql_timed, redis_timed};

use super::event::{EventType, PaymentEvent};
use super::repo::{self, LockedOrder};

/// Tries of an event that found its order's unit busy, [`BUSY_PAUSE`] apart.
const BUSY_TRIES: u32 = 20;
const BUSY_PAUSE: Duration = Duration::from_millis(50);

/// The topic of the event a late payment owed back sends (through `event_outbox`).
pub const REFUND_DUE: &str = "order.refund_due";

/// Every outcome an event can have: the answer's `code`.
pub const OUTCOMES: [&str; 15] = [
    "paid",
    "revived",
    "already_paid",
    "already_recorded",
    "already_refunded",
    "charged_twice",
    "refund_due",
    "refunded",
    "partial_refund",
    "settled",
    "ignored",
    "noted",
    "held",
    "amount_mismatch",
    "order_not_found",
];

/// What an event did: its answer.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Applied {
    /// The answer's `code`: one of [`OUTCOMES`] (docs/contract.md, "Payments").
    #[serde(skip)]
    pub outcome: String,
    #[serde(skip)]
    pub status: u16,
    pub event_id: String,
    pub order_sn: String,
    /// Whether this `event_id` was received before (this is that answer again).
    pub repeat: bool,
}

impl Applied {
    /// The answer's `code`, one of [`OUTCOMES`] (a row written by another release may
    /// hold one this one does not know: `recorded`).
    pub fn code(&self) -> &'static str {
        OUTCOMES
            .iter()
            .find(|known| **known == self.outcome)
            .copied()
            .unwrap_or("recorded")
    }
}

/// Why an event could not be applied now (nothing changed: the provider sends it again).
#[derive(Debug, thiserror::Error)]
pub enum PaymentError {
    #[error("{0}")]
    Unavailable(&'static str),
    #[error(transparent)]
    Store(#[from] StoreError),
}

crate::store::from_either_store!(PaymentError);

/// One try's end short of an outcome.
enum Retry {
    /// The order's unit is busy (a cancel giving it back, a warm-up): a moment later.
    Busy,
    Failed(PaymentError),
}

impl From<PaymentError> for Retry {
    fn from(e: PaymentError) -> Self {
        Retry::Failed(e)
    }
}

impl From<StoreError> for Retry {
    fn from(e: StoreError) -> Self {
        Retry::Failed(e.into())
    }
}

impl From<RedisError> for Retry {
    fn from(e: RedisError) -> Self {
        Retry::Failed(e.into())
    }
}

/// Whether the event's row is new (received now) or held (received before its order
/// was in MySQL, applied by the scheduler).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    Fresh,
    Held,
}

/// What Redis must do once MySQL committed.
enum After {
    Nothing,
    /// The unit of this order goes back on sale (`ending` recorded before the commit).
    UnitBack(Held),
    /// The unit taken for a revived order stays: its `ending` record goes.
    Keep(Begun),
}

/// Receives a verified event: answered again if its `event_id` was; held if its order
/// is still on its way to MySQL; else applied.
pub async fn receive(deps: &Deps, event: &PaymentEvent) -> Result<Applied, PaymentError> {
    if let Some(recorded) = repo::recorded(&deps.db, &event.event_id).await? {
        return Ok(repeat(event, recorded));
    }
    let landed = match OrderSn::parse(&event.order_sn) {
        Some(sn) => land(deps, &sn).await?,
        None => Landed::Unknown,
    };
    match landed {
        Landed::Row(_) => apply(deps, event, Arrival::Fresh).await,
        Landed::NotYetSafe => record_only(deps, event, "held", 202).await,
        // Judged as for no order ([`no_order`]).
        Landed::Unknown => apply(deps, event, Arrival::Fresh).await,
    }
}

fn answer(event: &PaymentEvent, outcome: &str, status: u16, repeat: bool) -> Applied {
    Applied {
        outcome: outcome.to_owned(),
        status,
        event_id: event.event_id.clone(),
        order_sn: event.order_sn.clone(),
        repeat,
    }
}

fn repeat(event: &PaymentEvent, recorded: repo::Recorded) -> Applied {
    Applied {
        outcome: recorded.outcome,
        status: recorded.answered,
        event_id: event.event_id.clone(),
        order_sn: recorded.order_sn,
        repeat: true,
    }
}

/// Records an event held for later: its order is on its way.
async fn record_only(
    deps: &Deps,
    event: &PaymentEvent,
    outcome: &'static str,
    status: u16,
) -> Result<Applied, PaymentError> {
    let mut tx = mysql_begin(&deps.db).await?;
    if !repo::insert(&mut tx, event, outcome, status).await? {
        drop(tx);
        return answer_recorded(deps, event).await;
    }
    mysql_timed(tx.commit()).await?;
    deps.meters.payment_event(outcome);
    tracing::info!(event_id = %event.event_id, order_sn = %event.order_sn, outcome, "payment_event");
    Ok(answer(event, outcome, status, false))
}

async fn answer_recorded(deps: &Deps, event: &PaymentEvent) -> Result<Applied, PaymentError> {
    let recorded =
        repo::recorded(&deps.db, &event.event_id)
            .await?
            .ok_or(PaymentError::Unavailable(
                "the event was recorded and is not found: try again",
            ))?;
    Ok(repeat(event, recorded))
}

/// Applies the event to its order (in MySQL now); a held event another scheduler applied
/// meanwhile is answered as recorded.
pub async fn apply(
    deps: &Deps,
    event: &PaymentEvent,
    arrival: Arrival,
) -> Result<Applied, PaymentError> {
    let mut tries = 0;
    // A fresh event is judged late or not by when it came, not by a retry's moment.
    let mut came = None;
    loop {
        match attempt(deps, event, arrival, &mut came).await {
            Ok(applied) => return Ok(applied),
            Err(Retry::Failed(PaymentError::Store(StoreError::Database(e))))
                if e.is_deadlock() && tries < BUSY_TRIES => {}
            Err(Retry::Busy) if tries < BUSY_TRIES => {}
            Err(Retry::Busy) => {
                return Err(PaymentError::Unavailable(
                    "the order's unit is being given back or reloaded: send the event again shortly",
                ));
            }
            Err(Retry::Failed(e)) => return Err(e),
        }
        tries += 1;
        tokio::time::sleep(BUSY_PAUSE).await;
    }
}

/// One try; `came`: when a fresh event came, by MySQL's clock (set by the first try that
/// read its order).
async fn attempt(
    deps: &Deps,
    event: &PaymentEvent,
    arrival: Arrival,
    came: &mut Option<DateTime<Utc>>,
) -> Result<Applied, Retry> {
    // The item (its price) before the transaction: inside it, a second connection of the
    // pool would be asked for while this one holds the order's lock.
    let item = match OrderSn::parse(&event.order_sn) {
        Some(sn) => items::get(&deps.db, sn.item()).await?,
        None => None,
    };
    let mut tx = mysql_begin(&deps.db).await?;
    // When the event came (`None`: now).
    let arrived = match arrival {
        Arrival::Fresh => {
            if !repo::insert(&mut tx, event, "applying", 0).await? {
                drop(tx);
                return Ok(answer_recorded(deps, event).await?);
            }
            *came
        }
        Arrival::Held => {
            let Some(arrived) = repo::lock_held(&mut tx, &event.event_id).await? else {
                drop(tx);
                return Ok(answer_recorded(deps, event).await?);
            };
            Some(arrived)
        }
    };
    let sn = &event.order_sn;
    let found = match (
        OrderSn::parse(sn),
        repo::lock_order(&mut tx, sn, arrived).await?,
    ) {
        (Some(parsed), Some(order)) => Some((parsed, order)),
        _ => None,
    };
    if let Some((_, order)) = &found {
        came.get_or_insert(order.judged_at);
    }
    let Some((parsed, order)) = found else {
        let (outcome, status) = judge_without_order(deps, tx, event).await?;
        return Ok(answer(event, outcome, status, false));
    };
    let price = item.as_ref().map_or(0, |i| i.price_cents);
    let ctx = Ctx {
        deps,
        event,
        sn: &parsed,
        order: &order,
        price,
        buckets: item.as_ref().map_or(1, |i| i.buckets),
        retired: item.as_ref().is_some_and(|i| i.retired_at.is_some()),
    };
    let (outcome, status, after) = match ctx.decide(&mut tx).await {
        Ok(decided) => decided,
        Err(e) => {
            drop(tx);
            return Err(e);
        }
    };
    if let Err(e) = repo::set_outcome(&mut tx, &event.event_id, outcome, status).await {
        drop(tx);
        ctx.undo(after).await;
        return Err(e.into());
    }
    let committed = mysql_timed(tx.commit()).await;
    if let Err(e) = committed {
        // Whether it committed is unknown: the `ending` record leaves the unit to the
        // cut-off sweep, which follows what MySQL says.
        return Err(e.into());
    }
    ctx.after(after).await;
    deps.meters.payment_event(outcome);
    tracing::info!(event_id = %event.event_id, order_sn = %sn, outcome, "payment_event");
    Ok(answer(event, outcome, status, false))
}

type Tx = sqlx::Transaction<'static, sqlx::MySql>;

/// What deciding an event works with.
struct Ctx<'a> {
    deps: &'a Deps,
    event: &'a PaymentEvent,
    sn: &'a OrderSn,
    order: &'a LockedOrder,
    price: u64,
    buckets: u8,
    /// The sale left Redis: nothing of it is written there again.
    retired: bool,
}

impl Ctx<'_> {
    /// The outcome, its HTTP status, and what Redis does after the commit. Writes the
    /// order's change (and an outbox event) into `tx`.
    async fn decide(&self, tx: &mut Tx) -> Result<(&'static str, u16, After), Retry> {
        let (event, order) = (self.event, self.order);
        let sn = self.sn.as_str();
        let currency_ok = event.currency == self.deps.settings.currency;
        Ok(match event.kind {
            EventType::Failed => ("noted", 200, After::Nothing),
            EventType::Succeeded if !currency_ok || event.amount_cents != self.price => {
                ("amount_mismatch", 422, After::Nothing)
            }
            // A refund of a charge owed back is judged against that charge.
            EventType::Refunded
                if (!currency_ok || event.amount_cents > self.price)
                    && !repo::owes_charge(tx, event).await? =>
            {
                ("amount_mismatch", 422, After::Nothing)
            }
            // The provider returned this charge before it told of taking it (events out of
            // order): nothing is held, nothing owed.
            EventType::Succeeded if returned_already(tx, event).await? => {
                ("already_refunded", 200, After::Nothing)
            }
            EventType::Succeeded => self.succeeded(tx).await?,
            EventType::Refunded => {
                let paid_by = |charge: Option<&str>| {
                    order.status == OrderStatus::Paid && order.paid_ref.as_deref() == charge
                };
                if paid_by(Some(&event.provider_ref)) {
                    self.refund_order(tx).await?
                } else if let Some((outcome, status, owed)) = settle_owed(tx, event).await? {
                    if outcome == "settled"
                        && owed.outcome == "refund_due"
                        && order.status == OrderStatus::RefundDue
                    {
                        repo::refund(tx, sn, order.status).await?;
                    }
                    (outcome, status, After::Nothing)
                } else if paid_by(None) {
                    // Paid by its buyer (SECKILL_PAYMENTS=trust_buyer): no charge to name.
                    self.refund_order(tx).await?
                } else {
                    ("ignored", 200, After::Nothing)
                }
            }
        })
    }

    /// A `payment.succeeded` for an order in MySQL, by the order's state: paid, revived,
    /// owed back, or told of before (the table at the top of this file).
    async fn succeeded(&self, tx: &mut Tx) -> Result<(&'static str, u16, After), Retry> {
        let (event, order) = (self.event, self.order);
        let late = self.deps.settings.late_payment;
        let sn = self.sn.as_str();
        Ok(match order.status {
            OrderStatus::Unpaid if !order.overdue || late == LatePayment::Honour => {
                repo::pay(tx, sn, &event.provider_ref).await?;
                ("paid", 200, After::Nothing)
            }
            OrderStatus::Unpaid => {
                let back = self.unit_back().await?;
                repo::owe(tx, sn, order.status).await?;
                self.announce_owed(tx).await?;
                ("refund_due", 200, back)
            }
            OrderStatus::Paid if order.paid_ref.as_deref() == Some(&event.provider_ref) => {
                ("already_paid", 200, After::Nothing)
            }
            // This charge told of before (another event id): counted once.
            OrderStatus::Paid | OrderStatus::RefundDue | OrderStatus::Refunded
                if repo::charge_seen(tx, event, "payment.succeeded").await? =>
            {
                ("already_recorded", 200, After::Nothing)
            }
            OrderStatus::Paid | OrderStatus::RefundDue | OrderStatus::Refunded => {
                ("charged_twice", 200, After::Nothing)
            }
            OrderStatus::Cancelled => {
                // An order MySQL refused as a second live order never was its buyer's to
                // pay: owed back, whatever the rule.
                let refused = order.cancel_reason.as_deref() == Some("refused");
                // A payment that came in time (held while its order was on its way,
                // cancelled meanwhile) is honoured whatever the rule.
                let honour = late == LatePayment::Honour || !order.overdue;
                let revived = if honour && !refused {
                    self.revive().await?
                } else {
                    None
                };
                match revived {
                    Some((slot, begun)) => {
                        let after = After::Keep(begun);
                        if let Err(e) = repo::revive(tx, sn, slot, &event.provider_ref).await {
                            self.undo(after).await;
                            return Err(e.into());
                        }
                        ("revived", 200, after)
                    }
                    None => {
                        repo::owe(tx, sn, order.status).await?;
                        self.announce_owed(tx).await?;
                        ("refund_due", 200, After::Nothing)
                    }
                }
            }
        })
    }

    /// The paid order's charge refunded: whole (this event, or with the parts refunded
    /// before it), the order `refunded` and its unit back; less than the price, recorded
    /// only.
    async fn refund_order(&self, tx: &mut Tx) -> Result<(&'static str, u16, After), Retry> {
        if repo::refunded_before(tx, self.event).await? + self.event.amount_cents < self.price {
            return Ok(("partial_refund", 200, After::Nothing));
        }
        let back = self.unit_back().await?;
        repo::refund(tx, self.sn.as_str(), self.order.status).await?;
        Ok(("refunded", 200, back))
    }

    fn user(&self) -> UserId {
        UserId::new(self.order.user_id)
    }

    fn held(&self) -> Held {
        Held {
            bucket: self.sn.bucket(),
            user: self.user(),
            order_sn: self.sn.to_string(),
        }
    }

    /// Records the order's unit as going back (before MySQL says so). A retired sale's
    /// unit has no list to go back to (the retired figures do not count it: a known gap).
    async fn unit_back(&self) -> Result<After, Retry> {
        if self.retired {
            return Ok(After::Nothing);
        }
        ending::begin(&self.deps.redis, &self.deps.keys, &[self.sn]).await?;
        Ok(After::UnitBack(self.held()))
    }

    /// `order.refund_due`, sent once this transaction commits.
    async fn announce_owed(&self, tx: &mut Tx) -> Result<(), Retry> {
        let event = self.event;
        let body = json!({
            "event": REFUND_DUE,
            "order_sn": event.order_sn,
            "item_id": self.order.item_id,
            "user_id": self.order.user_id,
            "amount_cents": event.amount_cents,
            "currency": event.currency,
            "provider_ref": event.provider_ref,
            "event_id": event.event_id,
        });
        let message_id = format!("{}:refund_due:{}", event.order_sn, event.event_id);
        repo::enqueue(tx, REFUND_DUE, &message_id, &body.to_string()).await?;
        Ok(())
    }

    /// Takes a unit for the cancelled order, as a purchase would (borrowing from another
    /// bucket when its own is empty), held by its replicas: its place and `ending`
    /// record; `None` when no unit can be had.
    async fn revive(&self) -> Result<Option<(u8, Begun)>, Retry> {
        let Deps { redis, keys, .. } = self.deps;
        let bucket = self.sn.bucket();
        let home = keys.bucket(bucket);
        let Ok(replication) = redis.replicas_for(&home.replicated).await else {
            return Err(PaymentError::Unavailable(
                "the order's Redis master is short of replicas: send the event again shortly",
            )
            .into());
        };
        let mut conn = redis.bulk().await?;
        // Marked first: a record left in `ending` is found by the cut-off sweep.
        marks::mark(&mut conn, keys, Work::CutOff, [bucket]).await?;
        let mut revived = self.revive_in(&mut conn, &home).await?;
        if revived == "none" && self.buckets > 1 {
            let lenders: Vec<ItemKeys> = (0..self.buckets)
                .filter(|i| *i != bucket.index)
                .map(|i| keys.bucket(BucketId::new(bucket.item, i)))
                .collect();
            let lending = Lending { redis, keys };
            let borrowed = transfer::borrow(&mut conn, &home, lenders.iter(), lending).await?;
            if borrowed.moved {
                revived = self.revive_in(&mut conn, &home).await?;
            } else if borrowed.stalled || borrowed.moving {
                // A bucket that may have units could not lend now (paused, reloading,
                // short of replicas, a unit on its way): not "none left" yet.
                return Err(Retry::Busy);
            }
        }
        let mut words = revived.split(' ');
        let (slot, at) = match (words.next(), words.next(), words.next()) {
            (Some("taken" | "kept"), Some(slot), Some(at)) => {
                match (slot.parse::<u8>(), at.parse::<i64>()) {
                    (Ok(slot), Ok(at)) => (slot, at),
                    _ => {
                        return Err(RedisError::Unexpected(format!(
                            "revive.lua answered {revived:?}"
                        ))
                        .into());
                    }
                }
            }
            (Some("busy"), ..) => return Err(Retry::Busy),
            (Some("closed" | "limit" | "none"), ..) => return Ok(None),
            _ => {
                return Err(
                    RedisError::Unexpected(format!("revive.lua answered {revived:?}")).into(),
                );
            }
        };
        if !replication.held().await {
            // Not on the replicas: given back now (the order is still cancelled, and
            // locked), the event answered 503 and sent again.
            ending::release(redis, keys, &[self.held()]).await?;
            return Err(PaymentError::Unavailable(
                "Redis's replicas did not confirm the unit taken: send the event again shortly",
            )
            .into());
        }
        Ok(Some((slot, Begun::at(bucket, at))))
    }

    async fn revive_in(
        &self,
        conn: &mut crate::store::RedisConn,
        home: &ItemKeys,
    ) -> Result<String, RedisError> {
        let user = self.user();
        redis_timed(
            REVIVE
                .key(&home.meta)
                .key(&home.tokens)
                .key(home.buyer_orders(user))
                .key(self.deps.keys.ending(home.bucket))
                .arg(user.get())
                .arg(self.sn.as_str())
                .invoke_async(conn),
        )
        .await
    }

    /// Undoes Redis's part of a change MySQL never committed (its statement failed before
    /// the commit): a unit taken for a revival goes back — the order is still cancelled.
    /// A unit recorded as going back stays: its order is still paid, and the cut-off sweep
    /// drops the record. A failure here is the sweep's too.
    async fn undo(&self, after: After) {
        if let After::Keep(_) = after {
            let Deps { redis, keys, .. } = self.deps;
            if let Err(e) = ending::release(redis, keys, &[self.held()]).await {
                tracing::warn!(order_sn = %self.sn, error = %e, "a unit taken for a late payment not given back yet; the cut-off sweep does it");
            }
        }
    }

    /// Redis's part once MySQL committed. A failure is left to the cut-off sweep, which
    /// does the same within seconds (the `ending` record stays).
    async fn after(&self, after: After) {
        let Deps { redis, keys, .. } = self.deps;
        let done = match after {
            After::Nothing => Ok(()),
            After::UnitBack(held) => ending::release(redis, keys, &[held]).await.map(|_| ()),
            After::Keep(begun) => ending::abandon(redis, keys, &[self.sn.as_str()], &begun).await,
        };
        if let Err(e) = done {
            tracing::warn!(order_sn = %self.sn, error = %e, "a payment's Redis step failed; the cut-off sweep finishes it");
        }
    }
}

/// Held events read from MySQL at once.
const HELD_PAGE: u32 = 500;

/// The scheduler's step: events held for orders not yet in MySQL, applied once they are;
/// one whose order turned out to exist nowhere (a pending order a Redis failover lost) is
/// recorded `order_not_found`, its charge owed back. Each event on its own: one that
/// fails now, or whose order is still on its way, is tried again at the next step and
/// holds back no other: every held event is looked at, page by page (many still on their
/// way do not hide the ones behind them). Returns how many were settled.
pub async fn apply_held(deps: &Deps) -> Result<u64, PaymentError> {
    let mut settled = 0;
    let mut after = 0;
    loop {
        let page = repo::held(&deps.db, after, HELD_PAGE).await?;
        let last = page.len() < HELD_PAGE as usize;
        for (id, event) in page {
            after = id;
            settled += u64::from(apply_one_held(deps, &event).await);
        }
        if last {
            return Ok(settled);
        }
    }
}

/// One held event: whether it was settled now.
async fn apply_one_held(deps: &Deps, event: &PaymentEvent) -> bool {
    let Some(sn) = OrderSn::parse(&event.order_sn) else {
        return false;
    };
    let done = match land(deps, &sn).await {
        Ok(Landed::Row(_)) => apply(deps, event, Arrival::Held).await.map(|_| true),
        Ok(Landed::Unknown) => not_found(deps, event).await.map(|()| true),
        Ok(Landed::NotYetSafe) => Ok(false),
        Err(e) => Err(e.into()),
    };
    done.unwrap_or_else(|e| {
        tracing::warn!(event_id = %event.event_id, error = %crate::error::cause_chain(&e), "a held payment event not applied yet; next step");
        false
    })
}

/// A held event whose order exists nowhere: judged as for no order ([`no_order`]), once.
async fn not_found(deps: &Deps, event: &PaymentEvent) -> Result<(), PaymentError> {
    let mut tx = mysql_begin(&deps.db).await?;
    if repo::lock_held(&mut tx, &event.event_id).await?.is_some() {
        let (outcome, _) = judge_without_order(deps, tx, event).await?;
        tracing::warn!(event_id = %event.event_id, order_sn = %event.order_sn, outcome, "a held payment's order exists nowhere");
    }
    Ok(())
}

/// Judges an event whose order exists nowhere ([`no_order`]), records its outcome in
/// `tx` (the event's row already written or locked there) and commits.
async fn judge_without_order(
    deps: &Deps,
    mut tx: Tx,
    event: &PaymentEvent,
) -> Result<(&'static str, u16), DbError> {
    let (outcome, status) = no_order(&mut tx, event).await?;
    repo::set_outcome(&mut tx, &event.event_id, outcome, status).await?;
    mysql_timed(tx.commit()).await?;
    deps.meters.payment_event(outcome);
    Ok((outcome, status))
}

/// An event for an order that exists nowhere: a charge is owed back (`order_not_found`)
/// unless it was returned already (`already_refunded`: refunds naming it came first) or
/// told of before (`already_recorded`: owed once); a refund settles the charge it names
/// ([`settle_owed`]), else is recorded as for no order.
async fn no_order(tx: &mut Tx, event: &PaymentEvent) -> Result<(&'static str, u16), DbError> {
    Ok(match event.kind {
        EventType::Refunded => match settle_owed(tx, event).await? {
            Some((outcome, status, _)) => (outcome, status),
            None => ("order_not_found", 404),
        },
        EventType::Succeeded if returned_already(tx, event).await? => ("already_refunded", 200),
        EventType::Succeeded if repo::charge_seen(tx, event, "payment.succeeded").await? => {
            ("already_recorded", 200)
        }
        _ => ("order_not_found", 404),
    })
}

/// Whether refunds of this charge came before it was told of and returned it whole: one
/// refund, or parts adding up.
async fn returned_already(tx: &mut Tx, event: &PaymentEvent) -> Result<bool, DbError> {
    Ok(repo::charge_seen(tx, event, "payment.refunded").await?
        || repo::refunded_before(tx, event).await? >= event.amount_cents)
}

/// A refund naming a charge owed back (`provider_ref`): the charge `settled` once the
/// refunds add up to it (this one with the parts before it), else `partial_refund`; in
/// another currency, `amount_mismatch`. `None` when no charge is owed under that name
/// (and for an event that is not a refund).
async fn settle_owed(
    tx: &mut Tx,
    event: &PaymentEvent,
) -> Result<Option<(&'static str, u16, repo::OwedRow)>, DbError> {
    if event.kind != EventType::Refunded {
        return Ok(None);
    }
    let Some(owed) = repo::owed_charge(tx, event).await? else {
        return Ok(None);
    };
    if event.currency != owed.currency {
        return Ok(Some(("amount_mismatch", 422, owed)));
    }
    if repo::refunded_before(tx, event).await? + event.amount_cents < owed.amount_cents {
        return Ok(Some(("partial_refund", 200, owed)));
    }
    repo::settle(tx, &owed.event_id).await?;
    Ok(Some(("settled", 200, owed)))
}

impl From<DbError> for Retry {
    fn from(e: DbError) -> Self {
        Retry::Failed(PaymentError::Store(StoreError::Database(e)))
    }
}
