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
    /// Paid: it cannot be cancelled.
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

/// The order statuses a buyer sees: MySQL's three, and `pending`.
#[derive(Clone, Copy, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OrderStatusShown {
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
pub struct OrderView {
    order_sn: OrderSn,
    item_id: ItemId,
    user_id: UserId,
    status: OrderStatusShown,
    created_at: DateTime<Utc>,
    /// When an unpaid order is cancelled and its unit goes back on sale.
    pay_deadline: DateTime<Utc>,
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
            OrderStatus::Cancelled => return Err(OrderError::Cancelled),
            OrderStatus::Unpaid => {
                // Too late to pay: end it now rather than leave it to the scheduler.
                ending::cancel_overdue(
                    &self.deps.db,
                    &self.deps.redis,
                    &self.deps.keys,
                    &[sn.as_str()],
                    CancelReason::Timeout,
                )
                .await?;
                return Err(OrderError::Cancelled);
            }
        }
        tracing::info!(order_sn = %sn, "order_paid");
        Ok(row.into())
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
            OrderStatus::Paid => {
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
        // Also for a repeat: finishes a release that an earlier call did not get to.
        ending::release(&self.deps.redis, &self.deps.keys, &[Held::from(&row)]).await?;
        tracing::info!(order_sn = %sn, "order_cancelled");
        Ok(row.into())
    }

    /// The user's order as MySQL has it, writing it there first if it is still pending in
    /// Redis. Another user's or an unknown order: `NotFound`.
    async fn stored_order(&self, sn: &OrderSn, user: UserId) -> Result<OrderRow, OrderError> {
        let owned = |row: OrderRow| {
            if row.user() == user {
                Ok(row)
            } else {
                Err(OrderError::NotFound)
            }
        };
        if let Some(row) = repo::find(&self.deps.db, sn).await? {
            return owned(row);
        }
        let order = match placed::pending(&self.deps.redis, &self.deps.keys, sn).await? {
            Some(order) => order,
            // Written by the consumer between the two reads, or unknown.
            None => {
                let row = repo::find(&self.deps.db, sn)
                    .await?
                    .ok_or(OrderError::NotFound)?;
                return owned(row);
            }
        };
        if order.user_id != user {
            return Err(OrderError::NotFound);
        }
        // Into MySQL only what a Redis failover cannot take back (as the relay does).
        let claim = [(sn, order.created_at_ms)];
        if !cleared_to_send(&self.deps.redis, &self.deps.keys, sn.bucket(), &claim).await? {
            return Err(OrderError::NotYetSafe);
        }
        let orders = [order];
        placed::write(&self.deps.db, &orders).await?;
        let plan = Plan::from_settings(&self.deps.settings);
        placed::settle_in_redis(&self.deps.redis, &self.deps.keys, &plan, &orders).await?;
        repo::find(&self.deps.db, sn)
            .await?
            .ok_or(OrderError::NotFound)
    }
}

impl OrderView {
    /// Holding a unit: pending, unpaid or paid.
    fn is_live(&self) -> bool {
        self.status != OrderStatusShown::Cancelled
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
