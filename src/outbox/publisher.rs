//! The in-process publisher: takes won orders from purchase handlers and sends them to
//! RabbitMQ in batches, without ever making a purchase wait.
//!
//! One batch at a time: while a batch waits for its confirms (a few milliseconds: the
//! broker writes to disk first), the next orders gather in the buffer and leave together.
//! So the busier the sale, the fuller each message, and the broker's work per order falls
//! (measured on 2 cores: with four batches in flight, messages held 19 orders and the
//! purchase path ran at 7k/s; with one, 9.6k/s). A batch also waits [`LINGER`] after its
//! first order for more to join it; see there. At most [`BUFFER`] orders wait in memory;
//! with a full buffer, or no broker, the order waits in the Redis outbox for the relay.
//!
//! A batch is sent as it is; the broker's confirm notes each order `confirmed` (`super`).
//! Orders it did not confirm (nacked, unanswered within the confirm timeout, or no broker
//! to send to) are then entered in their outboxes and their buckets marked for the relay,
//! in two round trips. An order that dies with the process before that — in the buffer or
//! on its way — is in `pending` alone, where the safety sweep finds it and enters it
//! (`super::relay`). Entering every batch before sending it, as servers up to commit
//! 3136a93 did, cost each won order a sorted-set insert and its removal in Redis (4,500
//! instructions of Redis, 3,700 of this process) to save a crash those seconds.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::broker::{Broker, Outgoing};
use crate::deps::Deps;
use crate::domain::BucketId;
use crate::keys::Keys;
use crate::marks::{self, Work};
use crate::signals::Signals;
use crate::store::{Grouped, RedisConns};
use crate::telemetry::Meters;

use super::Via;

const BUFFER: usize = 20_000;
/// Orders per batch, at most.
const BATCH: usize = 1_000;
/// How long a batch waits after its first order for others to join it. Without it a batch
/// left as soon as the previous one was confirmed (1–4 ms), with 30–70 orders at 15,000
/// wins/s: each message cost RabbitMQ an `fsync` and about 0.8 ms of CPU, and each order
/// woke this task. Much of a batch's cost, in RabbitMQ, Redis (the `confirmed` note) and
/// here, is per batch, not per order: at 12,000 wins/s, 20 ms instead of 5 ms took the
/// batches from 90 to 40 a second and RabbitMQ's CPU per purchase from 3.6–4.9 µs to
/// 1.5–2.4 (docs/benchmarks.md; 50 ms gained nothing more). Twenty milliseconds more
/// before an order reaches RabbitMQ is nothing to its buyer, who has had the answer since
/// it was won, and a crash loses no order meanwhile: it is in `pending` (the safety sweep).
const LINGER: Duration = Duration::from_millis(20);
/// How long a batch waits for a broker connection (being made at start, or after a loss)
/// before it is left to the relay: with the linger, a second. Purchases never wait for
/// it: meanwhile new orders gather in the buffer.
const CONNECT_WAIT: Duration = Duration::from_secs(1).saturating_sub(LINGER);
/// The longest a won order stays in this publisher: its batch's linger and wait for a
/// connection, then for its confirms — 6 s, as the contract tells of a rebuild (which
/// waits this out for a Redis that lost its outbox).
pub const HOLDS_AT_MOST: Duration = LINGER
    .saturating_add(CONNECT_WAIT)
    .saturating_add(crate::broker::CONFIRM_TIMEOUT);
// docs/contract.md names the figure; a change to the waits above must not move it.
const _: () = assert!(HOLDS_AT_MOST.as_secs() == 6 && HOLDS_AT_MOST.subsec_nanos() == 0);

/// How often orders the full buffer turned away are entered in their outboxes.
const ENTER_DROPPED_EVERY: Duration = Duration::from_secs(1);

/// The purchase handlers' end of the publisher.
#[derive(Clone)]
pub struct OrderPublisher {
    tx: mpsc::Sender<Outgoing>,
    /// Orders turned away by a full buffer, to be entered in their outboxes for the relay
    /// (their payloads go: the relay reads `pending`).
    dropped: Arc<Mutex<Vec<Outgoing>>>,
}

impl OrderPublisher {
    /// Hands an order over without waiting. If the buffer is full the order is entered in
    /// its outbox within a second instead, where the relay finds it.
    pub fn offer(&self, order: Outgoing) {
        if let Err(refused) = self.tx.try_send(order) {
            tracing::debug!("publisher buffer full; the relay will send this order");
            let mut order = refused.into_inner();
            order.payload = String::new();
            if let Ok(mut dropped) = self.dropped.lock() {
                dropped.push(order);
            }
        }
    }

    /// Starts the publishing task; it ends after shutdown, once its buffer is sent.
    pub fn spawn(
        deps: &Deps,
        signals: Arc<Signals>,
        shutdown: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(BUFFER);
        let dropped = Arc::new(Mutex::new(Vec::new()));
        let outboxes = Outboxes {
            redis: deps.redis.clone(),
            keys: deps.keys.clone(),
            dropped: dropped.clone(),
        };
        let task = tokio::spawn(run(
            rx,
            deps.broker.clone(),
            outboxes,
            signals,
            deps.meters.clone(),
            shutdown,
        ));
        (Self { tx, dropped }, task)
    }
}

/// The Redis side of the publisher: the won orders' outboxes.
struct Outboxes {
    redis: RedisConns,
    keys: Keys,
    dropped: Arc<Mutex<Vec<Outgoing>>>,
}

impl Outboxes {
    /// Enters won orders this publisher could not deliver in their outboxes and marks their
    /// buckets for the relay (with the orders the full buffer turned away): a scheduler's
    /// relay sends them.
    async fn enter<'a>(&self, undelivered: impl Iterator<Item = &'a Outgoing>) {
        let dropped: Vec<Outgoing> = match self.dropped.lock() {
            Ok(mut dropped) => dropped.drain(..).collect(),
            Err(_) => Vec::new(),
        };
        let undelivered: Vec<&Outgoing> = undelivered.collect();
        let orders = || undelivered.iter().copied().chain(&dropped);
        let stocks: HashSet<BucketId> = orders().map(|o| o.order_sn.bucket()).collect();
        if stocks.is_empty() {
            return;
        }
        let entered = async {
            let mut grouped = Grouped::new(&self.redis);
            super::enter(&mut grouped, &self.keys, orders());
            grouped.run(&self.redis).await?;
            // After the entries, as every mark (`crate::marks`).
            let mut conn = self.redis.bulk().await?;
            marks::mark(&mut conn, &self.keys, Work::Relay, stocks).await
        };
        if let Err(e) = entered.await {
            // The scheduler's safety sweep finds these orders in `pending`, or their
            // outboxes without the marks.
            tracing::warn!(error = %e, "could not enter won orders in their outboxes for the relay");
        }
    }
}

async fn run(
    mut rx: mpsc::Receiver<Outgoing>,
    broker: Broker,
    outboxes: Outboxes,
    signals: Arc<Signals>,
    meters: Arc<Meters>,
    shutdown: CancellationToken,
) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        batch.clear();
        let received = tokio::select! {
            n = rx.recv_many(&mut batch, BATCH) => n,
            () = tokio::time::sleep(ENTER_DROPPED_EVERY) => {
                outboxes.enter(std::iter::empty()).await;
                continue;
            }
            () = shutdown.cancelled() => {
                // Send what is buffered, then stop; anything left is in the outbox anyway.
                rx.close();
                rx.recv_many(&mut batch, BUFFER).await
            }
        };
        if received == 0 {
            outboxes.enter(std::iter::empty()).await;
            return;
        }
        if batch.len() < BATCH && !shutdown.is_cancelled() {
            // Orders sent meanwhile wake no one: this task is not waiting on the buffer.
            tokio::time::sleep(LINGER).await;
            while batch.len() < BATCH {
                let Ok(order) = rx.try_recv() else { break };
                batch.push(order);
            }
        }
        let Some(channel) = broker.publish_channel_within(CONNECT_WAIT).await else {
            tracing::debug!(
                orders = batch.len(),
                "no broker connection; orders wait in the outbox"
            );
            // Not a breaker signal: with no broker, orders wait safely in the outbox and
            // sales go on (the relay delivers them later).
            outboxes.enter(batch.iter()).await;
            continue;
        };
        let sent = super::send(
            &channel,
            &broker,
            (&outboxes.redis, &outboxes.keys),
            &meters,
            Via::Publisher,
            &batch,
        )
        .await;
        signals.published(sent.took, sent.any_unconfirmed());
        if let Some(e) = sent.not_cleared {
            // Harmless: the safety sweep enters them for the relay, which sends them again,
            // and the insert is idempotent.
            tracing::warn!(error = %e, "could not note confirmed orders in Redis");
        }
        let unconfirmed = batch.iter().zip(&sent.each).filter(|(_, ok)| !**ok);
        outboxes.enter(unconfirmed.map(|(order, _)| order)).await;
    }
}
