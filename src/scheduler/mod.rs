//! The scheduler role's work after the win: pay deadlines and reminders from the delay
//! queue, cancels cut off before their unit came back, the compensation scan, end-of-sale
//! reconciliation, retiring ended sales from Redis, draws (`draws.rs`), the outbox relay,
//! and the shops' repairs. All are started here, by [`Scheduler::run`]. The per-bucket
//! passes look only at the buckets marked for them (`src/marks.rs`); a slow safety sweep
//! puts back marks lost with a process.
//!
//! Any number of schedulers may run on one namespace: delay-queue entries are taken under
//! a lease, every change of an order is a conditional update, and giving a unit back is
//! idempotent, so two of them never do one thing twice.

pub mod deadlines;
pub mod wake;

mod compensate;
mod draws;
mod retention;
mod sweep;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::background::{Schedule, repeat};
use crate::deps::Deps;
use crate::items::transfer;
use crate::marks::{self, Work};
use crate::orders::ending::{self, Cancelled, cancel_overdue};
use crate::orders::repo::CancelReason;
use crate::outbox::relay::Relay;
use crate::shops::cache::Shops;
use crate::shops::repair;
use crate::store::StoreError;

/// How often ended sales are looked for (to reconcile them).
const END_OF_SALE_EVERY: Duration = Duration::from_secs(2);
/// How often cancels cut off between MySQL and Redis are looked for.
const CUT_OFF_EVERY: Duration = Duration::from_secs(1);
/// How long the cut-off pass holds the buckets it took.
const MARK_LEASE: Duration = Duration::from_secs(30);

#[derive(Clone)]
pub struct Scheduler {
    deps: Deps,
    shops: Shops,
}

impl Scheduler {
    pub fn new(deps: &Deps, shops: Shops) -> Self {
        Scheduler {
            deps: deps.clone(),
            shops,
        }
    }

    /// Every task of the scheduler role, until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let wake = Arc::new(Notify::new());
        let mut tasks = tokio::task::JoinSet::new();
        if self.deps.settings.keyspace_events && self.deps.redis.is_cluster() {
            tracing::info!(
                poll_ms = self.deps.settings.scheduler_poll_ms,
                "keyspace notifications are per node in a Redis Cluster: polling the delay queue"
            );
        } else if self.deps.settings.keyspace_events {
            tasks.spawn(wake::listen(
                self.deps.redis.clone(),
                self.deps.keys.clone(),
                wake.clone(),
                shutdown.clone(),
            ));
        } else {
            tracing::info!(
                poll_ms = self.deps.settings.scheduler_poll_ms,
                "keyspace notifications off (SECKILL_KEYSPACE_EVENTS=false): polling the delay queue"
            );
        }
        let relay = Relay::new(&self.deps);
        tasks.spawn(relay.clone().run(shutdown.clone()));
        let shops = || self.shops.clone();
        tasks.spawn(repair::push_stale(
            shops(),
            self.deps.clone(),
            shutdown.clone(),
        ));
        tasks.spawn(repair::run(shops(), self.deps.clone(), shutdown.clone()));
        tasks.spawn(sweep::run(self.clone(), relay, shutdown.clone()));
        tasks.spawn(compensate::run(self.clone(), shutdown.clone()));
        tasks.spawn(retention::run(self.clone(), shutdown.clone()));
        tasks.spawn(draws::run(self.clone(), shutdown.clone()));
        tasks.spawn(crate::queue::admit::run(
            self.deps.clone(),
            self.shops.clone(),
            shutdown.clone(),
        ));
        tasks.spawn(self.clone().end_of_sale(shutdown.clone()));
        tasks.spawn(self.clone().finish_cut_off(shutdown.clone()));
        tasks.spawn(self.clone().payments(shutdown.clone()));
        deadlines::run(self, wake, shutdown).await;
        while tasks.join_next().await.is_some() {}
    }

    /// Cancels those of these orders that are unpaid past their deadline, units back.
    async fn time_out(&self, sns: &[&str]) -> Result<Cancelled, StoreError> {
        let outcome = cancel_overdue(
            &self.deps.db,
            &self.deps.redis,
            &self.deps.keys,
            sns,
            CancelReason::Timeout,
        )
        .await?;
        self.deps.meters.cancelled("timeout", outcome.cancelled);
        Ok(outcome)
    }

    /// Returns the units of cancels cut off between MySQL and Redis, and settles
    /// transfers between buckets cut off between their steps, within seconds: in the
    /// buckets marked for each (`src/marks.rs`).
    async fn finish_cut_off(self, shutdown: CancellationToken) {
        let this = &self;
        repeat(
            "cut-off pass",
            Schedule::every(CUT_OFF_EVERY),
            &shutdown,
            || async move {
                let released = this.cut_off_pass().await?;
                this.deps.meters.cancelled_units_recovered(released);
                Ok::<_, StoreError>(())
            },
        )
        .await;
    }

    /// One pass over the marked cut-off cancels and loans; returns the units that came back.
    async fn cut_off_pass(&self) -> Result<u64, StoreError> {
        let (db, redis, keys) = (&self.deps.db, &self.deps.redis, &self.deps.keys);
        let released = AtomicU64::new(0);
        let released_ref = &released;
        marks::work_through(redis, keys, Work::CutOff, MARK_LEASE, |stocks| async move {
            let back = ending::finish_cut_off(db, redis, keys, &stocks).await?;
            released_ref.fetch_add(back, Ordering::Relaxed);
            let ending = |stock| vec![keys.ending(stock)];
            let next = marks::earliest(redis, &stocks, ending, ending::CUT_OFF_AFTER).await?;
            Ok::<_, StoreError>(next)
        })
        .await?;
        marks::work_through(redis, keys, Work::Loans, MARK_LEASE, |lenders| async move {
            transfer::settle_stuck(redis, keys, &lenders).await?;
            transfer::next_look(redis, keys, &lenders).await
        })
        .await?;
        Ok(released.into_inner())
    }

    /// Payment events held for orders not yet in MySQL, and the event outbox
    /// (`payments/upkeep.rs`).
    async fn payments(self, shutdown: CancellationToken) {
        let schedule = Schedule::every(crate::payments::upkeep::EVERY);
        repeat("payments upkeep", schedule, &shutdown, || {
            crate::payments::upkeep::step(&self.deps)
        })
        .await;
    }

    /// Reconciles each sale once its end and pay timeout have passed.
    async fn end_of_sale(self, shutdown: CancellationToken) {
        let schedule = Schedule::every(END_OF_SALE_EVERY);
        repeat("looking for ended sales", schedule, &shutdown, || {
            self.reconcile_ended()
        })
        .await;
    }

    /// Reconciles the sales due (each failure said, and tried again on the next look).
    async fn reconcile_ended(&self) -> Result<(), crate::store::DbError> {
        for item in crate::items::repo::due_for_reconcile(&self.deps.db).await? {
            match crate::orders::reconcile::reconcile(
                &self.deps.db,
                &self.deps.redis,
                &self.deps.keys,
                &self.deps.meters,
                item,
            )
            .await
            {
                Ok(report) => {
                    if let Err(e) = crate::items::repo::mark_reconciled(&self.deps.db, item).await {
                        tracing::warn!(%item, error = %e, "reconciled, but could not record it; it runs again");
                    }
                    tracing::info!(%item, ?report, "end-of-sale reconciliation done");
                }
                Err(crate::orders::reconcile::ReconcileError::Busy) => {}
                Err(e) => {
                    tracing::warn!(%item, error = %crate::error::cause_chain(&e), "end-of-sale reconciliation failed; retrying");
                }
            }
        }
        Ok(())
    }
}
