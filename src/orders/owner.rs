//! The owner's orders: one order (`pending` while it is on its way to MySQL), a buyer's
//! orders of an item, paying and cancelling. `api.rs` is their HTTP surface.
//!
//! Paying or cancelling an order that is still pending works: the order is first written
//! to MySQL here (the same idempotent write the consumer makes; its own write later
//! changes nothing), so every change of state is one conditional `UPDATE` on the row, and
//! a pay racing a cancel ends in exactly one of the two.

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use crate::delay_queue::Plan;
use crate::deps::Deps;
use crate::domain::{BucketId, ItemId, OrderPlaced, OrderSn, UserId};
use crate::items::catalog::Catalog;
use crate::outbox::cleared_to_send;
use crate::store::{RedisError, StoreError};

use super::ending::{self, Held};
use super::placed;
use super::repo::{self, CancelReason, OrderRow, OrderStatus, from_millis};

/// What the owner's order operations work with.
pub struct Owner<'a> {
    pub deps: &'a Deps,
    pub catalog: &'a Catalog,
}

/// Why an owner's order operation did not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    /// Unknown, or another user's.
    #[error("no such order")]
    NotFound,
    /// Cancelled, by its owner or because its pay deadline passed: it cannot be paid.
    #[error("the order is cancelled")]
    Cancelled,
    /// Paid: it cannot be cancelled, nor paid again.
    #[error("the order is paid")]
    Paid,
    /// Still pending, and not yet held by Redis's replicas: not written to MySQL yet.
    #[error("the order is not yet safe on Redis's replicas")]
    NotYetSafe,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Internal(anyhow::Error),
}

crate::store::from_either_store!(OrderError);

/// The order statuses a buyer sees: MySQL's, and `pending`.
#[derive(Clone, Copy, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatusShown {
    /// Won, not yet in MySQL.
    Pending,
    Unpaid,
    Paid,
    Cancelled,
    /// Paid after it was cancelled, with no unit left for it: the money is owed back.
    RefundDue,
    /// Its payment was returned.
    Refunded,
}

impl From<OrderStatus> for OrderStatusShown {
    fn from(status: OrderStatus) -> Self {
        match status {
            OrderStatus::Unpaid => OrderStatusShown::Unpaid,
            OrderStatus::Paid => OrderStatusShown::Paid,
            OrderStatus::Cancelled => OrderStatusShown::Cancelled,
            OrderStatus::RefundDue => OrderStatusShown::RefundDue,
            OrderStatus::Refunded => OrderStatusShown::Refunded,
        }
    }
}

/// An order as its owner sees it.
#[derive(Serialize, ToSchema)]
pub struct OrderView {
    order_sn: OrderSn,
    item_id: ItemId,
    user_id: UserId,
    status: OrderStatusShown,
    created_at: DateTime<Utc>,
    /// When an unpaid order is cancelled and its unit goes back on sale.
    pay_deadline: DateTime<Utc>,
}

/// What a storefront hands its payment provider to take the money for an order.
#[derive(Serialize, ToSchema)]
pub struct Checkout {
    order_sn: OrderSn,
    /// The item's price, in the currency's smallest unit: what a payment event must carry.
    amount_cents: u64,
    /// `SECKILL_CURRENCY`.
    currency: String,
    /// A payment event after it is late (`SECKILL_LATE_PAYMENT` decides).
    pay_deadline: DateTime<Utc>,
    /// A reference stable for the order (`pay-<order_sn>`): the provider's idempotency key,
    /// so two checkouts of one order never charge twice.
    payment_ref: String,
}

impl Owner<'_> {
    /// The owner's order: `pending` while Redis still holds it, else as MySQL has it.
    pub async fn order(&self, sn: &OrderSn, user: UserId) -> Result<OrderView, OrderError> {
        let view = match placed::pending(&self.deps.redis, &self.deps.keys, sn).await? {
            Some(order) => OrderView::pending(order)?,
            None => repo::find(&self.deps.db, sn)
                .await?
                .ok_or(OrderError::NotFound)?
                .into(),
        };
        if view.user_id != user {
            return Err(OrderError::NotFound);
        }
        Ok(view)
    }

    /// The user's orders of the item, live ones first (those the buyer record in Redis names
    /// and still `pending` among them: a won order is in Redis or MySQL), newest first; at
    /// most `most`.
    pub async fn orders_of(
        &self,
        item: ItemId,
        user: UserId,
        most: u32,
    ) -> Result<Vec<OrderView>, OrderError> {
        let Deps {
            db, redis, keys, ..
        } = self.deps;
        let catalog = self.catalog;
        let buckets = catalog.get(item).await?.map_or(1, |c| c.record.buckets);
        let pending = async {
            let item_keys = keys.bucket(BucketId::home(item, user, buckets));
            let mut views = Vec::new();
            for sn in placed::held_by(redis, &item_keys, user).await? {
                if let Some(order) = placed::pending(redis, keys, &sn).await? {
                    views.push(OrderView::pending(order)?);
                }
            }
            Ok::<_, RedisError>(views)
        }
        .await;
        let stored = repo::orders_of_user(db, item, user, most).await;
        let mut views = match (pending, stored) {
            // Redis cannot say whether an order is still on its way: MySQL may still know.
            (Err(e), Ok(rows)) if rows.is_empty() => return Err(e.into()),
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

    /// Pays the owner's order (again on a repeat). One whose pay deadline has passed is
    /// cancelled now rather than left to the scheduler, and answered `Cancelled`.
    pub async fn pay(&self, sn: &OrderSn, user: UserId) -> Result<OrderView, OrderError> {
        let paid_now = repo::pay(&self.deps.db, sn, user).await?;
        let mut row = self.stored_order(sn, user).await?;
        // Not paid by the first try: the order was still pending (written to MySQL just
        // now), or its deadline passed.
        if !paid_now && row.status == OrderStatus::Unpaid {
            repo::pay(&self.deps.db, sn, user).await?;
            row = self.stored_order(sn, user).await?;
        }
        match row.status {
            OrderStatus::Paid => {}
            OrderStatus::Cancelled | OrderStatus::RefundDue | OrderStatus::Refunded => {
                return Err(OrderError::Cancelled);
            }
            OrderStatus::Unpaid => {
                return Err(self.too_late(sn).await);
            }
        }
        tracing::info!(order_sn = %sn, "order_paid");
        Ok(row.into())
    }

    /// What the storefront hands its payment provider for the owner's order (the buyer's
    /// `POST …/pay` under `SECKILL_PAYMENTS=events`): it marks nothing paid. A paid order
    /// is `Paid`; one that can no longer be paid in time (cancelled, or its deadline
    /// passed: then cancelled now, as by the scheduler) is `Cancelled`.
    pub async fn checkout(&self, sn: &OrderSn, user: UserId) -> Result<Checkout, OrderError> {
        let view = self.order(sn, user).await?;
        match view.status {
            OrderStatusShown::Pending | OrderStatusShown::Unpaid
                if view.pay_deadline > crate::clock::now() => {}
            OrderStatusShown::Unpaid => {
                return Err(self.too_late(sn).await);
            }
            OrderStatusShown::Paid => return Err(OrderError::Paid),
            _ => return Err(OrderError::Cancelled),
        }
        let item = self
            .catalog
            .get(view.item_id)
            .await?
            .ok_or(OrderError::NotFound)?;
        Ok(Checkout {
            payment_ref: format!("pay-{sn}"),
            order_sn: view.order_sn,
            amount_cents: item.record.price_cents,
            currency: self.deps.settings.currency.clone(),
            pay_deadline: view.pay_deadline,
        })
    }

    /// An unpaid order asked to be paid after its deadline: ended now rather than left to
    /// the scheduler (its unit back). `Cancelled`, or what stopped the cancel.
    async fn too_late(&self, sn: &OrderSn) -> OrderError {
        let Deps {
            db, redis, keys, ..
        } = self.deps;
        let ended =
            ending::cancel_overdue(db, redis, keys, &[sn.as_str()], CancelReason::Timeout).await;
        match ended {
            Ok(_) => OrderError::Cancelled,
            Err(e) => e.into(),
        }
    }

    /// Cancels the owner's order (again on a repeat), its unit back on sale at once.
    pub async fn cancel(&self, sn: &OrderSn, user: UserId) -> Result<OrderView, OrderError> {
        // Unknown and other users' orders end here, before anything is recorded.
        let mut row = self.stored_order(sn, user).await?;
        let mut cancelled_now = false;
        let mut begun = None;
        if row.status == OrderStatus::Unpaid {
            begun = Some(ending::begin(&self.deps.redis, &self.deps.keys, &[sn]).await?);
            cancelled_now = repo::cancel_own(&self.deps.db, sn, user).await?;
            row = self.stored_order(sn, user).await?;
        }
        if cancelled_now {
            self.deps.meters.cancelled("user", 1);
        }
        match row.status {
            OrderStatus::Cancelled => {}
            // Money was taken for it: only the payment side can return it.
            OrderStatus::Paid | OrderStatus::RefundDue | OrderStatus::Refunded => {
                if let Some(begun) = &begun {
                    // Paid in the meantime: nothing to return.
                    ending::abandon(&self.deps.redis, &self.deps.keys, &[sn.as_str()], begun)
                        .await?;
                }
                return Err(OrderError::Paid);
            }
            OrderStatus::Unpaid => {
                return Err(OrderError::Internal(anyhow::anyhow!(
                    "order {sn} stayed unpaid through a cancel"
                )));
            }
        }
        // Also for a repeat: finishes a release that an earlier call did not get to — then
        // under the row's lock, as a late payment may be reviving the order right now.
        let held = [Held::from(&row)];
        let Deps {
            db, redis, keys, ..
        } = self.deps;
        ending::release_if_ended(db, redis, keys, &held).await?;
        if !cancelled_now {
            // A late payment may have revived it meanwhile: paid now.
            row = self.stored_order(sn, user).await?;
            if row.status.holds_unit() {
                return Err(OrderError::Paid);
            }
        }
        tracing::info!(order_sn = %sn, "order_cancelled");
        Ok(row.into())
    }

    /// The user's order as MySQL has it, writing it there first if it is still pending in
    /// Redis. Another user's or an unknown order: `NotFound`.
    async fn stored_order(&self, sn: &OrderSn, user: UserId) -> Result<OrderRow, OrderError> {
        match land(self.deps, sn).await? {
            Landed::Row(row) if row.user() == user => Ok(row),
            Landed::Row(_) | Landed::Unknown => Err(OrderError::NotFound),
            Landed::NotYetSafe => Err(OrderError::NotYetSafe),
        }
    }
}

/// Where an order is, once [`land`] looked.
pub enum Landed {
    /// In MySQL (written just now if it was pending).
    Row(OrderRow),
    /// Pending in Redis, and not yet held by its replicas: not written yet.
    NotYetSafe,
    /// Neither in MySQL nor pending.
    Unknown,
}

/// The order as MySQL has it, writing it there first if it is still pending in Redis
/// (the same idempotent write the consumer makes), so that every change of its state is a
/// conditional `UPDATE` of its row.
pub async fn land(deps: &Deps, sn: &OrderSn) -> Result<Landed, StoreError> {
    if let Some(row) = repo::find(&deps.db, sn).await? {
        return Ok(Landed::Row(row));
    }
    let Some(order) = placed::pending(&deps.redis, &deps.keys, sn).await? else {
        // Written by the consumer between the two reads, or unknown.
        return Ok(repo::find(&deps.db, sn)
            .await?
            .map_or(Landed::Unknown, Landed::Row));
    };
    // Into MySQL only what a Redis failover cannot take back (as the relay does).
    let claim = [(sn, order.created_at_ms)];
    if !cleared_to_send(&deps.redis, &deps.keys, sn.bucket(), &claim).await? {
        return Ok(Landed::NotYetSafe);
    }
    let orders = [order];
    placed::write(&deps.db, &orders).await?;
    let plan = Plan::from_settings(&deps.settings);
    placed::settle_in_redis(&deps.redis, &deps.keys, &plan, &orders).await?;
    Ok(repo::find(&deps.db, sn)
        .await?
        .map_or(Landed::Unknown, Landed::Row))
}

impl OrderView {
    /// Holding a unit: pending, unpaid or paid.
    fn is_live(&self) -> bool {
        matches!(
            self.status,
            OrderStatusShown::Pending | OrderStatusShown::Unpaid | OrderStatusShown::Paid
        )
    }

    /// An order Redis holds as pending; one whose times are none is an error naming it.
    fn pending(order: OrderPlaced) -> Result<Self, RedisError> {
        let time = |ms| {
            from_millis(ms).map_err(|e| {
                RedisError::Unexpected(format!("pending order {}: {e}", order.order_sn))
            })
        };
        Ok(OrderView {
            created_at: time(order.created_at_ms)?,
            pay_deadline: time(order.pay_deadline_ms)?,
            order_sn: order.order_sn,
            item_id: order.item_id,
            user_id: order.user_id,
            status: OrderStatusShown::Pending,
        })
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
