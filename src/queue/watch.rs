//! One watch of each queue's counters per instance, for the buyers' event streams: every
//! stream computes its own place from it (its place in the line never changes; only the
//! cursor moves), so ten thousand open streams cost one Redis read per item every
//! [`EVERY`], not one per buyer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::domain::ItemId;
use crate::keys::Keys;
use crate::store::{RedisConns, RedisError, redis_timed};

use super::line::Standing;

/// How often a watched queue's counters are read.
const EVERY: Duration = Duration::from_millis(250);

/// A queue's counters as last read: a [`Standing`] of nobody in particular.
pub type Counters = Option<Standing>;

pub struct Watches {
    redis: RedisConns,
    keys: Keys,
    items: Arc<Mutex<HashMap<ItemId, watch::Sender<Counters>>>>,
}

impl Watches {
    pub fn new(redis: RedisConns, keys: Keys) -> Self {
        Self {
            redis,
            keys,
            items: Arc::default(),
        }
    }

    /// The item's counters, read every [`EVERY`] while anyone watches them.
    pub fn subscribe(&self, item: ItemId) -> watch::Receiver<Counters> {
        let mut items = self
            .items
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(sender) = items.get(&item) {
            return sender.subscribe();
        }
        let (sender, receiver) = watch::channel(None);
        items.insert(item, sender.clone());
        tokio::spawn(refresh(
            self.redis.clone(),
            self.keys.clone(),
            item,
            sender,
            self.items.clone(),
        ));
        receiver
    }
}

/// Reads the item's counters until nobody watches them.
async fn refresh(
    redis: RedisConns,
    keys: Keys,
    item: ItemId,
    sender: watch::Sender<Counters>,
    items: Arc<Mutex<HashMap<ItemId, watch::Sender<Counters>>>>,
) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        {
            let mut items = items
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if sender.receiver_count() == 0 {
                items.remove(&item);
                return;
            }
        }
        match read(&redis, &keys, item).await {
            Ok(counters) => {
                sender.send_if_modified(|last| {
                    let changed = last.as_ref() != Some(&counters);
                    *last = Some(counters);
                    changed
                });
            }
            Err(e) => {
                tracing::warn!(%item, error = %e, "could not read the queue's counters; streams wait")
            }
        }
    }
}

async fn read(redis: &RedisConns, keys: &Keys, item: ItemId) -> Result<Standing, RedisError> {
    let queue = keys.queue(item);
    let mut conn = redis.bulk().await?;
    let (state, joined): (Vec<Option<i64>>, u64) = redis_timed(
        redis::pipe()
            .cmd("HMGET")
            .arg(&queue.state)
            .arg(&["shown", "sold_out", "known_by_ms", "rate_milli", "paused"])
            .zcard(&queue.line)
            .query_async(&mut conn),
    )
    .await?;
    let field = |i: usize| state.get(i).copied().flatten().unwrap_or(0);
    let cursor = u64::try_from(field(0)).unwrap_or(0);
    Ok(Standing {
        index: None,
        cursor,
        pass_expires_ms: None,
        used: 0,
        sold_out: field(1) == 1,
        known_by_ms: (field(2) > 0).then_some(field(2)),
        rate_milli: u64::try_from(field(3)).unwrap_or(0),
        // Filled in by each stream from its own clock: a time here would make every read
        // a change.
        now_ms: 0,
        paused: field(4) == 1,
        waiting: joined.saturating_sub(cursor),
    })
}
