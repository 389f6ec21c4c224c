//! The relay (scheduler role): sends again every order that stayed in an outbox longer
//! than [`RELAY_AFTER`] — the broker was down, the publisher's buffer was full, or the
//! process that won it died — in the buckets marked for it (`src/marks.rs`), and repairs
//! pending entries that outlived their order's journey (a message lost after its confirm,
//! say by a purged queue; the scheduler's safety sweep asks for that).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

use crate::background::{Schedule, repeat};
use crate::broker::{Broker, Outgoing};
use crate::deps::Deps;
use crate::domain::{BucketId, OrderPlaced, OrderSn};
use crate::keys::Keys;
use crate::marks::{self, Work};
use crate::orders::repo as orders;
use crate::store::{Db, RedisConns, RedisError, StoreError, redis_timed};
use crate::telemetry::Meters;

use super::{Via, cleared_to_send};

/// An outbox entry younger than this is left to the in-process publisher.
pub const RELAY_AFTER: Duration = Duration::from_secs(3);
const EVERY: Duration = Duration::from_secs(1);
/// How long a pass holds the buckets it took (one that dies leaves them for this long).
const LEASE: Duration = Duration::from_secs(10);
const BATCH: isize = 1_000;
/// A pending order this old that is neither in the outbox nor confirmed is entered there by
/// the safety sweep: its publisher died, or lost it to a Redis error. Past the longest a
/// publisher holds an order (its send included: it enters only what the broker did not
/// confirm), so that the relay does not send again what is on its way.
const UNSENT_AFTER: Duration =
    super::publisher::HOLDS_AT_MOST.saturating_add(Duration::from_secs(2));
/// A pending order older than this, confirmed by the broker, is checked against MySQL.
const PENDING_STALE_AFTER: Duration = Duration::from_secs(60);
/// ... and, if MySQL lacks it while the order queue is empty, sent again after this long.
const PENDING_LOST_AFTER: Duration = Duration::from_secs(300);
/// Pending entries looked at per round trip (and order numbers per MySQL query).
const SWEEP_CHUNK: usize = 1_000;

#[derive(Clone)]
pub struct Relay {
    pub broker: Broker,
    pub redis: RedisConns,
    pub db: Db,
    pub keys: Keys,
    pub meters: Arc<Meters>,
}

impl Relay {
    pub fn new(deps: &Deps) -> Self {
        Relay {
            broker: deps.broker.clone(),
            redis: deps.redis.clone(),
            db: deps.db.clone(),
            keys: deps.keys.clone(),
            meters: deps.meters.clone(),
        }
    }

    pub async fn run(self, shutdown: CancellationToken) {
        repeat(
            "outbox relay pass",
            Schedule::every(EVERY),
            &shutdown,
            || self.pass(),
        )
        .await;
    }

    /// Relays the outboxes marked for it (`src/marks.rs`); each is looked at again when
    /// its oldest entry becomes overdue.
    async fn pass(&self) -> Result<(), StoreError> {
        marks::work_through(
            &self.redis,
            &self.keys,
            Work::Relay,
            LEASE,
            |stocks| async move {
                for stock in &stocks {
                    self.relay_item(*stock).await?;
                }
                let outbox = |stock| vec![self.keys.outbox(stock)];
                Ok(marks::earliest(&self.redis, &stocks, outbox, RELAY_AFTER).await?)
            },
        )
        .await
    }

    /// Sends the bucket's overdue outbox entries again.
    async fn relay_item(&self, stock: BucketId) -> Result<(), StoreError> {
        let (outbox, pending) = (self.keys.outbox(stock), self.keys.pending(stock));
        let mut conn = self.redis.bulk().await?;
        loop {
            let due = crate::clock::now().timestamp_millis() - RELAY_AFTER.as_millis() as i64;
            // Claimed entries (negative scores: on their way) are always due.
            let entries: Vec<(String, f64)> =
                redis_timed(conn.zrangebyscore_limit_withscores(&outbox, "-inf", due, 0, BATCH))
                    .await?;
            if entries.is_empty() {
                return Ok(());
            }
            let (sns, scores): (Vec<String>, Vec<f64>) = entries.into_iter().unzip();
            let payloads = pending_payloads(&mut conn, &pending, &sns).await?;
            let mut done = Vec::new();
            let mut corrupt = Vec::new();
            let mut outgoing = Vec::with_capacity(sns.len());
            for ((sn, score), payload) in sns.into_iter().zip(scores).zip(payloads) {
                match (OrderSn::parse(&sn), payload) {
                    // No pending JSON: the consumer already wrote it to MySQL.
                    (_, None) => done.push(sn),
                    (Some(order_sn), Some(payload)) => outgoing.push(Outgoing {
                        order_sn,
                        payload,
                        // A claim's score is the time negated.
                        won_at_ms: (score as i64).abs(),
                    }),
                    (None, Some(_)) => corrupt.push(sn),
                }
            }
            if !done.is_empty() {
                redis_timed(conn.zrem::<_, _, ()>(&outbox, done)).await?;
            }
            // Not written by grab.lua: say so and drop them, or every pass would meet them
            // again (each round trip of this loop must remove what it read, or return).
            if !corrupt.is_empty() {
                tracing::error!(%stock, entries = ?corrupt, "outbox entries that are not order numbers; dropped");
                redis_timed(conn.zrem::<_, _, ()>(&outbox, &corrupt)).await?;
            }
            if outgoing.is_empty() {
                continue;
            }
            let Some(channel) = self.broker.publish_channel() else {
                tracing::debug!(%stock, orders = outgoing.len(), "relay: no broker connection yet");
                return Ok(());
            };
            // As a purchase does: what a failover could still undo is not sent.
            let claims: Vec<(&OrderSn, i64)> = outgoing
                .iter()
                .map(|o| (&o.order_sn, o.won_at_ms))
                .collect();
            if !cleared_to_send(&self.redis, &self.keys, stock, &claims).await? {
                tracing::debug!(%stock, "relay: the replicas do not hold these orders yet; sending later");
                return Ok(());
            }
            let sent = super::send(
                &channel,
                &self.broker,
                (&self.redis, &self.keys),
                &self.meters,
                Via::Relay,
                &outgoing,
            )
            .await;
            if let Some(e) = sent.not_cleared {
                return Err(e.into());
            }
            if sent.any_unconfirmed() {
                // The broker is struggling; try again next pass.
                return Ok(());
            }
        }
    }

    /// Repairs the bucket's pending orders, by their outbox entries (the table in
    /// `super`). One with no entry long after it was won was never delivered by its
    /// publisher (its process died, or its give-back kept it): it is entered, and the relay
    /// sends it. One confirmed long ago was checked in by the broker: if MySQL has it, the
    /// consumer's clean-up was lost, and it goes; if MySQL still lacks it long after, while
    /// the order queue is empty, its message was lost after the confirm (a purged queue),
    /// and it is sent again. (While the queue holds messages the consumer is merely behind,
    /// and nothing is sent again.)
    ///
    /// The hash is walked with HSCAN from cursor `from`, a thousand entries a round trip,
    /// until about `budget` entries were read or the walk is done: so neither Redis nor
    /// MySQL ever gets one huge request, and a bucket whose pending orders pile up (the
    /// consumer down for minutes) is walked over several passes instead of all of it every
    /// second. Returns the cursor to go on from (0: the walk is done).
    pub async fn sweep_pending(
        &self,
        stock: BucketId,
        from: u64,
        budget: usize,
    ) -> Result<u64, StoreError> {
        let pending = self.keys.pending(stock);
        let mut cursor = from;
        let mut read = 0;
        loop {
            let (next, flat): (u64, Vec<String>) = {
                let mut conn = self.redis.bulk().await?;
                redis_timed(
                    redis::cmd("HSCAN")
                        .arg(&pending)
                        .arg(cursor)
                        .arg("COUNT")
                        .arg(SWEEP_CHUNK)
                        .query_async(&mut conn),
                )
                .await?
            };
            let entries: Vec<(&str, &str)> = flat
                .chunks_exact(2)
                .map(|pair| (pair[0].as_str(), pair[1].as_str()))
                .collect();
            read += entries.len();
            self.sweep_entries(stock, &entries).await?;
            if next == 0 || read >= budget {
                return Ok(next);
            }
            cursor = next;
        }
    }

    /// One HSCAN page of [`Relay::sweep_pending`].
    async fn sweep_entries(
        &self,
        stock: BucketId,
        entries: &[(&str, &str)],
    ) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let outbox = self.keys.outbox(stock);
        let confirmed = self.keys.confirmed(stock);
        let mut conn = self.redis.bulk().await?;
        let sns: Vec<&str> = entries.iter().map(|(sn, _)| *sn).collect();
        let (in_outbox, is_confirmed): (Vec<Option<f64>>, Vec<bool>) = redis_timed(
            redis::pipe()
                .cmd("ZMSCORE")
                .arg(&outbox)
                .arg(&sns)
                .cmd("SMISMEMBER")
                .arg(&confirmed)
                .arg(&sns)
                .query_async(&mut conn),
        )
        .await?;
        let now = crate::clock::now().timestamp_millis();
        let (unsent_before, stale_before) = (
            now - UNSENT_AFTER.as_millis() as i64,
            now - PENDING_STALE_AFTER.as_millis() as i64,
        );
        let mut unsent = Vec::new();
        let mut stale = Vec::new();
        for (((_, json), entered), confirmed) in entries.iter().zip(&in_outbox).zip(is_confirmed) {
            let Ok(order) = serde_json::from_str::<OrderPlaced>(json) else {
                continue;
            };
            match (entered, confirmed) {
                (None, false) if order.created_at_ms < unsent_before => unsent.push(order),
                (None, true) if order.created_at_ms < stale_before => stale.push(order),
                _ => {}
            }
        }
        self.enter_unsent(&mut conn, stock, &unsent).await?;
        self.repair_stale(&mut conn, stock, &stale, now).await
    }

    /// Of pending orders confirmed long ago (`stale`): those MySQL has are taken out of
    /// `pending` (the consumer wrote them and could not clear them); those it lacks after
    /// [`PENDING_LOST_AFTER`] are entered for the relay again, only while the orders
    /// queue is empty (their message was lost after its confirm).
    async fn repair_stale(
        &self,
        conn: &mut crate::store::RedisConn,
        stock: BucketId,
        stale: &[OrderPlaced],
        now: i64,
    ) -> Result<(), StoreError> {
        if stale.is_empty() {
            return Ok(());
        }
        let (outbox, pending) = (self.keys.outbox(stock), self.keys.pending(stock));
        let confirmed = self.keys.confirmed(stock);
        let sns: Vec<&str> = stale.iter().map(|o| o.order_sn.as_str()).collect();
        let mut written = HashSet::new();
        for chunk in sns.chunks(SWEEP_CHUNK) {
            written.extend(orders::existing(&self.db, chunk).await?);
        }
        let (written, lost): (Vec<&OrderPlaced>, Vec<&OrderPlaced>) = stale
            .iter()
            .partition(|o| written.contains(o.order_sn.as_str()));
        let lost_before = now - PENDING_LOST_AFTER.as_millis() as i64;
        let lost: Vec<&OrderPlaced> = lost
            .into_iter()
            .filter(|o| o.created_at_ms < lost_before)
            .collect();
        let requeue = !lost.is_empty() && self.broker.queue_depth().await == Some(0);
        if written.is_empty() && !requeue {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for order in &written {
            pipe.hdel(&pending, order.order_sn.as_str()).ignore();
            pipe.srem(&confirmed, order.order_sn.as_str()).ignore();
        }
        if requeue {
            for order in &lost {
                pipe.srem(&confirmed, order.order_sn.as_str()).ignore();
                pipe.zadd(&outbox, order.order_sn.as_str(), order.created_at_ms)
                    .ignore();
            }
        }
        redis_timed(pipe.query_async::<()>(conn)).await?;
        if requeue {
            marks::mark(conn, &self.keys, Work::Relay, [stock]).await?;
        }
        tracing::warn!(
            %stock,
            cleared = written.len(),
            requeued = if requeue { lost.len() } else { 0 },
            "pending_sweep repaired stale entries"
        );
        Ok(())
    }

    /// Takes out of the bucket's `confirmed` set the orders no longer pending: the consumer
    /// wrote them before their publisher noted the confirm (RabbitMQ may deliver a message
    /// before it confirms it). A page of `SSCAN` at a time; an order number is never pending
    /// again once it was not, so nothing still pending is taken out.
    pub async fn prune_confirmed(&self, stock: BucketId) -> Result<(), StoreError> {
        let (confirmed, pending) = (self.keys.confirmed(stock), self.keys.pending(stock));
        let mut conn = self.redis.bulk().await?;
        let mut cursor = 0u64;
        let mut pruned = 0;
        loop {
            let (next, sns): (u64, Vec<String>) = redis_timed(
                redis::cmd("SSCAN")
                    .arg(&confirmed)
                    .arg(cursor)
                    .arg("COUNT")
                    .arg(SWEEP_CHUNK)
                    .query_async(&mut conn),
            )
            .await?;
            if !sns.is_empty() {
                let payloads = pending_payloads(&mut conn, &pending, &sns).await?;
                let written: Vec<&String> = sns
                    .iter()
                    .zip(&payloads)
                    .filter(|(_, payload)| payload.is_none())
                    .map(|(sn, _)| sn)
                    .collect();
                if !written.is_empty() {
                    pruned += written.len();
                    redis_timed(conn.srem::<_, _, ()>(&confirmed, written)).await?;
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        tracing::debug!(%stock, pruned, "confirms noted after their orders were written, forgotten");
        Ok(())
    }

    /// Enters in the bucket's outbox won orders no sender took, and marks it for the relay,
    /// which sends them (`NX`: one a sender entered meanwhile stays as it is). Should a give-
    /// back take one back meanwhile, its entry has no `pending` one, and the relay drops it.
    async fn enter_unsent(
        &self,
        conn: &mut (impl redis::aio::ConnectionLike + Send),
        stock: BucketId,
        unsent: &[OrderPlaced],
    ) -> Result<(), StoreError> {
        if unsent.is_empty() {
            return Ok(());
        }
        let mut entry = redis::cmd("ZADD");
        entry.arg(self.keys.outbox(stock)).arg("NX");
        for order in unsent {
            entry.arg(order.created_at_ms).arg(order.order_sn.as_str());
        }
        redis_timed(entry.query_async::<()>(conn)).await?;
        marks::mark(conn, &self.keys, Work::Relay, [stock]).await?;
        tracing::warn!(
            %stock,
            orders = unsent.len(),
            "pending_sweep: won orders no publisher took, entered for the relay"
        );
        Ok(())
    }
}

/// The JSON of each of these orders in a bucket's `pending` hash (`None`: not pending, so
/// in MySQL or given back), in one round trip.
async fn pending_payloads(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    pending: &str,
    sns: &[String],
) -> Result<Vec<Option<String>>, RedisError> {
    redis_timed(redis::cmd("HMGET").arg(pending).arg(sns).query_async(conn)).await
}
